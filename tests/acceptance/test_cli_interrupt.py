"""Ctrl-C while the ``pgqueue`` command is starting: one line, exit 130, no traceback (found by
a tester: a KeyboardInterrupt traceback from the middle of the imports)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pgqueue

ROOT = Path(pgqueue.__file__).resolve().parents[1]

#: Runs the `pgqueue` command's launcher (as its console script does) with a Ctrl-C delivered
#: while a module is being imported: psycopg (imported by the pgqueue package, before any of
#: its code can catch anything), pgqueue.admission (the package's __init__), typer or rich (the
#: CLI), or when the app is about to parse the command line. Deterministic, where a SIGINT sent
#: "early" lands wherever the start-up happens to be (measured: a traceback for a SIGINT in the
#: first ~1.0 s of `pgqueue status` before the launcher, while the package imported).
_INTERRUPTED_AT = """
import sys

where = sys.argv.pop(1)


class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == where:
            raise KeyboardInterrupt
        return None


sys.meta_path.insert(0, Interrupt())
if where == "app":
    import typer.main

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    typer.main.Typer.__call__ = interrupted
sys.argv[0] = "pgqueue"
from _pgqueue_launcher import main

main()
"""


@pytest.mark.parametrize(
    "where", ["psycopg", "pgqueue.admission", "sqlalchemy.orm", "typer", "rich.console", "app"]
)
def test_ctrl_c_during_start_up_is_one_line(where):
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_AT, where, "status", "--dsn", "postgresql://x@/y"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr == "interrupted\n"
    assert done.stdout == ""


def test_the_command_and_python_m_run_the_entry_point():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pgqueue"] == "_pgqueue_launcher:main"
    done = subprocess.run(
        [sys.executable, "-m", "pgqueue", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout


def test_an_editable_install_runs_the_checkouts_launcher(tmp_path):
    """The command imports the launcher from the checkout (found here: force-include copied it
    into site-packages at install time, and a later change to it never reached the command).
    Asked of a fresh interpreter outside the checkout, as the command runs; holds for the
    editable install the README's commands make."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run(
        [sys.executable, "-c", "import _pgqueue_launcher; print(_pgqueue_launcher.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    ).stdout.strip()
    assert Path(found).resolve() == (ROOT / "_pgqueue_launcher.py").resolve()
