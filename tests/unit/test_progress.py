"""Long commands' progress: rich on a terminal, one line per phase elsewhere."""

from __future__ import annotations

import io

from rich.console import Console

from pgqueue.progress import Phases


def _run(console: Console) -> None:
    with Phases(console) as phases:
        phases.phase("creating the databases")
        phases.phase("replaying 40 requests", total=40)
        for n in range(0, 41, 10):
            phases.update(n, f"{n} enqueued")
        phases.phase("collecting the report")


def test_off_a_terminal_each_phase_is_one_line():
    out = io.StringIO()
    _run(Console(file=out, force_terminal=False, width=200))
    assert out.getvalue().splitlines() == [
        "creating the databases",
        "replaying 40 requests",
        "collecting the report",
    ]


def test_on_a_terminal_the_phases_show_as_rich_progress():
    out = io.StringIO()
    _run(Console(file=out, force_terminal=True, width=200))
    text = out.getvalue()
    assert "\x1b[" in text  # a live display, redrawn in place
    assert "40/40" in text and "40 enqueued" in text
    assert "collecting the report" in text
