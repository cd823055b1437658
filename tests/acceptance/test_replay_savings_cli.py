"""`pgqueue replay` says what the batches lane would save on the trace it replays."""

from __future__ import annotations

import re

import pytest

from tests.apps.harness import run_cli


@pytest.mark.timeout(180)
def test_replay_prints_the_batch_tiers_tokens_and_the_cost_saved(db_dsn: str) -> None:
    done = run_cli("replay", "--limit", "30", "--speedup", "1000", "--dsn", db_dsn, timeout=150)
    assert done.returncode == 0, done.stderr
    [line] = [x for x in done.stdout.splitlines() if x.startswith("batch tier: ")]
    assert re.fullmatch(
        r"batch tier: \d+ jobs, [\d,]+ input / [\d,]+ output tokens; through the batches lane "
        r"an estimated \$[\d,]+\.\d\d saved \(docs/batches\.md\)",
        line,
    ), line
