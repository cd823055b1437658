"""Downgrades restore older functions from the revision files that defined them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgqueue.db.sqltext import function_definition

VERSIONS = Path(__file__).resolve().parents[2] / "pgqueue" / "migrations" / "versions"


def test_a_function_comes_out_whole_as_create_or_replace():
    text = function_definition(VERSIONS / "0006_admission.sql", "admission_check")
    assert text.startswith("CREATE OR REPLACE FUNCTION pgqueue.admission_check(")
    assert text.endswith("\n$$;\n")
    assert text.count("$$") == 2


def test_a_name_defined_never_or_twice_is_refused():
    with pytest.raises(ValueError, match="0 times"):
        function_definition(VERSIONS / "0006_admission.sql", "no_such_function")
