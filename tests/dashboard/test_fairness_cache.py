"""Jain's index on the overview: read once, then at most every FAIRNESS_MAX_AGE_SECONDS, in
the background; no page but the first waits for it, and a page shows the value's age."""

from __future__ import annotations

from typing import Any

import pgqueue.dashboard.app as app_module
from pgqueue.dashboard.app import FAIRNESS_MAX_AGE_SECONDS, Dashboard, DashboardConfig


def test_fairness_is_read_again_in_the_background_when_old(monkeypatch):
    board = Dashboard(DashboardConfig(dsn="postgresql://nobody@127.0.0.1:1/none"))
    reads: list[float] = []
    clock = [1000.0]

    def read(part: Any, window_seconds: float) -> dict[str, Any]:
        reads.append(clock[0])
        return {"fairness": {"all": {"jain_weighted": len(reads)}}}

    monkeypatch.setattr(board, "_read", read)
    monkeypatch.setattr(app_module.time, "monotonic", lambda: clock[0])
    first = board._fairness()
    assert (reads, first["fairness"]["all"]["jain_weighted"]) == ([1000.0], 1)
    clock[0] += FAIRNESS_MAX_AGE_SECONDS / 2
    assert board._fairness()["fairness_age_seconds"] == FAIRNESS_MAX_AGE_SECONDS / 2
    assert len(reads) == 1  # fresh enough: no read
    clock[0] += FAIRNESS_MAX_AGE_SECONDS
    stale = board._fairness()  # old: shown as it is, read again in the background
    assert stale["fairness"]["all"]["jain_weighted"] == 1
    board.executor.shutdown(wait=True)
    assert len(reads) == 2
    assert board._fairness()["fairness"]["all"]["jain_weighted"] == 2
