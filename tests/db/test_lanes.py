"""Lanes (issue 28, scheduler v2): a rate-limit pool that cannot send holds back nothing outside
itself. A lane is a model for ``anthropic.messages`` jobs, the kind for any other job.

Written against the public interfaces (``pgqueue.enqueue_many``, ``pgqueue.claim_admitted``
through the worker's ``job_claim`` statement, ``pgqueue.ratelimit_cooldown`` as a 429 sets it,
the limits ``pgqueue limits set`` writes), so they judge main's claim and the new one alike.
On main they fail: the claim stops at the first job in DRR order that the limiter cannot
admit, whatever its model (issue 28, "A model waiting on its limit stops every other model").

Rates are counted, not timed: a model's bucket is its rate (a limit of R requests per minute
starts full at R, so R is what the limiter admits over the first minute), and a run claims
until a claim takes nothing. The buckets refill with real time while a run goes on (R/60
requests per second), so a count may be above the bucket; the bounds allow for that.
Every job is critical (``user_action``), so the tiers' capacity rule is not what is judged,
and the same tenants send to every lane.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec
from pgqueue.db import queries
from pgqueue.handlers.registry import NOOP_KIND
from tests.conftest import _create_db, _drop_db, dsn_for

Conn = psycopg.Connection[Any]

TENANTS = ("t0", "t1", "t2")
#: Jobs each tenant queues per lane: more than any bucket below admits.
PER_TENANT = 40
#: Requests per minute of the model whose rate is counted (its bucket: 30 requests).
RPM = 30
#: Jobs per claim, as a worker with free slots asks.
CLAIM_SIZE = 5
#: At most this many claims per run (a run ends at the first claim that takes nothing).
MAX_CLAIMS = 1_000


@pytest.fixture
def baseline_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A second fresh database at head, for the run without the cooldown or the limit."""
    name = _create_db(server_dsn, template_db)
    try:
        yield dsn_for(server_dsn, name)
    finally:
        _drop_db(server_dsn, name)


def _payload(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _set_limits(conn: Conn, model: str, rpm: int) -> None:
    """``pgqueue limits set MODEL --rpm RPM`` (tokens left at the defaults; never binding)."""
    queries.run(conn, "ratelimit_set", {"model": model, "rpm": rpm, "itpm": 40_000, "otpm": 8_000})


def _enqueue_interleaved(conn: Conn, lanes: list[str]) -> None:
    """Each tenant queues PER_TENANT jobs per lane, alternating lanes (a lane is a model, or
    the no-op kind when it is NOOP_KIND)."""
    specs = [
        JobSpec(tenant, "user_action", {}, kind=NOOP_KIND)
        if lane == NOOP_KIND
        else JobSpec(tenant, "user_action", _payload(lane))
        for _ in range(PER_TENANT)
        for tenant in TENANTS
        for lane in lanes
    ]
    pgqueue.enqueue_many(conn, specs)
    conn.commit()


def _drain(dsn: str) -> Counter[str]:
    """Claim CLAIM_SIZE at a time until a claim takes no job; the jobs claimed per lane."""
    taken: Counter[str] = Counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(MAX_CLAIMS):
            rows = queries.run(
                conn,
                "job_claim",
                {"limit": CLAIM_SIZE, "worker_id": "w", "lease_seconds": 300, "skip_kinds": []},
            )
            jobs = [r for r in rows if r["id"] is not None]
            if not jobs:
                return taken
            taken.update(r["model"] or r["kind"] for r in jobs)
    raise AssertionError(f"still claiming after {MAX_CLAIMS} claims: {taken}")


def _run(dsn: str, *, limits: dict[str, int], cooldowns: dict[str, float]) -> Counter[str]:
    with psycopg.connect(dsn) as conn:
        for model, rpm in limits.items():
            _set_limits(conn, model, rpm)
        for model, seconds in cooldowns.items():
            queries.run(conn, "ratelimit_cooldown", {"model": model, "seconds": seconds})
        _enqueue_interleaved(conn, ["slow", "fast"] if "slow" in limits else ["held", "free"])
    return _drain(dsn)


def test_a_model_in_a_429_cooldown_leaves_another_model_its_rate(
    db_dsn: str, baseline_dsn: str
) -> None:
    """Two models, the same tenants: 'slow' in a 120 s cooldown (as a 429 opens it), 'fast'
    keeps at least 90 % of what it gets with no cooldown (its bucket: RPM requests)."""
    limits = {"slow": RPM, "fast": RPM}
    without = _run(baseline_dsn, limits=limits, cooldowns={})
    cooled = _run(db_dsn, limits=limits, cooldowns={"slow": 120})

    assert cooled["fast"] >= 0.9 * without["fast"], (cooled, without)
    assert cooled["slow"] == 0  # the cooldown holds its own lane
    assert without["fast"] >= RPM, without  # its bucket (and what refilled meanwhile)


def test_a_model_held_to_6_rpm_costs_another_model_nothing(db_dsn: str, baseline_dsn: str) -> None:
    """'held' at 6 requests per minute, no 429 at all: 'free' (RPM) claims as many jobs as in
    a run where 'held' has no binding limit."""
    without = _run(baseline_dsn, limits={"held": 10_000, "free": RPM}, cooldowns={})
    held = _run(db_dsn, limits={"held": 6, "free": RPM}, cooldowns={})

    # its whole bucket, as without the limit (each run may add refilled requests)
    assert held["free"] >= RPM, (held, without)
    assert 6 <= held["held"] <= 8  # its own bucket
    assert without["free"] >= RPM, without
    assert without["held"] == PER_TENANT * len(TENANTS), without  # not limited: every job


@pytest.mark.parametrize("hold", ["cooldown", "spent bucket"])
def test_a_kind_with_no_provider_limit_is_never_held_by_a_model(db_dsn: str, hold: str) -> None:
    """No-op jobs (no provider limit: their own lane) of the same tenants, queued between the
    jobs of a model that cannot send (a 3,600 s ``retry-after``, or a spent bucket): every one
    of them is claimed."""
    with psycopg.connect(db_dsn) as conn:
        if hold == "cooldown":
            queries.run(conn, "ratelimit_cooldown", {"model": "slow", "seconds": 3600})
        else:
            _set_limits(conn, "slow", 1)  # one request, then 1/60 per second
        _enqueue_interleaved(conn, ["slow", NOOP_KIND])
    taken = _drain(db_dsn)

    assert taken[NOOP_KIND] == PER_TENANT * len(TENANTS), taken
    assert taken["slow"] <= (0 if hold == "cooldown" else 2)
