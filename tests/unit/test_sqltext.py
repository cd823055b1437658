"""Downgrades restore older functions from the revision files that defined them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgqueue.db.sqltext import function_definition, revision_module

VERSIONS = Path(__file__).resolve().parents[2] / "pgqueue" / "migrations" / "versions"


def test_a_function_comes_out_whole_as_create_or_replace():
    text = function_definition(VERSIONS / "0006_admission.sql", "admission_check")
    assert text.startswith("CREATE OR REPLACE FUNCTION pgqueue.admission_check(")
    assert text.endswith("\n$$;\n")
    assert text.count("$$") == 2


def test_a_name_defined_never_or_twice_is_refused():
    with pytest.raises(ValueError, match="0 times"):
        function_definition(VERSIONS / "0006_admission.sql", "no_such_function")


def test_revision_module_imports_a_revision_file_by_path():
    module = revision_module(VERSIONS / "0010_claim_plan.py")
    assert module.revision == "0010" and module.down_revision == "0009"
    with pytest.raises((RuntimeError, FileNotFoundError)):
        revision_module(VERSIONS / "9999_missing.py")
