"""Named SQL: every file parses, names are unique, the Python names exist, the wheel ships it."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pgqueue.db import queries

ROOT = Path(__file__).resolve().parents[2]


def test_every_query_has_a_unique_name_and_a_cardinality():
    found = queries.all_queries()
    assert "job_claim" in found
    for name, q in found.items():
        assert q.name == name
        assert q.cardinality in {"one", "many", "exec", "execrows"}
        assert q.sql.strip()


def test_every_name_used_in_python_exists():
    used: set[str] = set()
    pattern = re.compile(r"""\b(?:run|arun)\(\s*[\w.]+,\s*"([a-z_]+)\"""")
    for path in (ROOT / "pgqueue").rglob("*.py"):
        used.update(pattern.findall(path.read_text(encoding="utf-8")))
    assert used, "no query calls found"
    missing = used - set(queries.all_queries())
    assert not missing


def test_parse_rejects_duplicates_and_headless_sql():
    with pytest.raises(ValueError, match="twice"):
        queries.parse_queries("-- name: a :one\nSELECT 1\n-- name: a :one\nSELECT 2\n", "x.sql")
    with pytest.raises(ValueError, match="before the first"):
        queries.parse_queries("SELECT 1\n-- name: a :one\nSELECT 2\n", "x.sql")
    with pytest.raises(KeyError, match="no SQL query named"):
        queries.query("does_not_exist")


def test_no_sql_is_built_from_f_strings():
    offenders = []
    for path in (ROOT / "pgqueue").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if re.search(r"execute\(\s*f[\"']", text):
            offenders.append(str(path))
    assert not offenders


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_wheel_ships_sql_migrations_and_data(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    [wheel] = list(tmp_path.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "pgqueue/sql/queries/jobs.sql" in names
    assert "pgqueue/migrations/env.py" in names
    assert "pgqueue/migrations/versions/0030_baseline.py" in names
    assert "pgqueue/sql/schema/010_tables.sql" in names
    assert "pgqueue/sql/schema/070_scheduler.sql" in names
    # the `pgqueue` command's launcher, outside the package (tests/acceptance/test_cli_interrupt.py)
    assert "_pgqueue_launcher.py" in names
    assert "pgqueue/sql/schema/071_claim.sql" in names
    assert "pgqueue/data/azure_llm_conv_2023.csv" in names
    assert "pgqueue/data/README.md" in names
    assert "pgqueue/sql/queries/dashboard.sql" in names
    assert "pgqueue/dashboard/templates/page.html" in names
    assert "pgqueue/dashboard/templates/parts/overview.html" in names
    assert "pgqueue/dashboard/static/dashboard.js" in names
