"""Issue 28's size rules, kept: the scheduler's SQL file reads top to bottom in at most 300
lines ("Done when" 7), and docs/drr.md explains the design in at most 150 (its layout)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("path", "most"),
    [("pgqueue/sql/schema/070_scheduler.sql", 300), ("docs/drr.md", 150)],
)
def test_the_scheduler_stays_readable(path: str, most: int) -> None:
    lines = (ROOT / path).read_text().count("\n")
    assert lines <= most, f"{path} has {lines} lines, more than {most}"
