"""Lease fencing at the database level: a worker that lost its lease cannot write the job.

No processes: the named queries are run by hand as two workers would run them — the first
claims, its lease expires, the rescuer requeues the job, a second worker claims it (new lease
token); every write the first worker then attempts with its stale token changes nothing.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

import pgqueue
from pgqueue.db import queries

TENANT = "tenant-fence"
PAYLOAD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}

Conn = psycopg.Connection[Any]
RESCUE = {"limit": 10}


@pytest.fixture
def auto(db_dsn: str) -> Any:
    """An autocommit connection: each named query is its own transaction, as in the worker."""
    with psycopg.connect(db_dsn, autocommit=True) as connection:
        yield connection


def _enqueue(conn: Conn, max_attempts: int | None = None) -> int:
    return pgqueue.enqueue(
        conn,
        tenant_id=TENANT,
        origin="scheduled",
        sla_seconds=60,
        payload=PAYLOAD,
        max_attempts=max_attempts,
    )


def _claim(conn: Conn, worker_id: str) -> dict[str, Any]:
    rows = queries.run(
        conn,
        "job_claim",
        {"limit": 1, "worker_id": worker_id, "lease_seconds": 60, "skip_kinds": []},
    )
    assert len(rows) == 1
    return dict(rows[0])


def _expire_lease(conn: Conn, job_id: int) -> None:
    conn.execute(
        "UPDATE pgqueue.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        (job_id,),
    )


def _row(conn: Conn, job_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT *, state::text AS state, lease_token::text AS lease_token "
            "FROM pgqueue.jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
    assert row is not None
    return row


def _throttle_event_count(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.throttle_events").fetchone()
    assert row is not None
    return int(row[0])


def _key(claimed: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": claimed["id"],
        "tenant_id": claimed["tenant_id"],
        "lease_token": claimed["lease_token"],
    }


def _complete(claimed: dict[str, Any], owner: str) -> dict[str, Any]:
    return {
        **_key(claimed),
        "result": Jsonb({"owner": owner}),
        "input_tokens": 3,
        "output_tokens": 4,
    }


def _retry(claimed: dict[str, Any]) -> dict[str, Any]:
    return {**_key(claimed), "error": "stale retry", "delay_seconds": 0.0, "permanent": False}


def _throttle(claimed: dict[str, Any]) -> dict[str, Any]:
    return {
        **_key(claimed),
        "error": "HTTP 429: stale",
        "wait_seconds": 1.0,
        "status_code": 429,
        "retry_after_seconds": 1.0,
        "max_throttle_wait_seconds": 86_400.0,
    }


def _rescued_and_reclaimed(conn: Conn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Worker A claims, its lease expires, the rescuer requeues, worker B claims."""
    job_id = _enqueue(conn)
    old = _claim(conn, "worker-a")
    assert old["id"] == job_id and old["attempts"] == 1
    _expire_lease(conn, job_id)
    assert queries.run(conn, "job_rescue", RESCUE) == [{"id": job_id, "state": "queued"}]
    rescued = _row(conn, job_id)
    assert rescued["state"] == "queued"
    assert rescued["lease_token"] is None and rescued["worker_id"] is None
    new = _claim(conn, "worker-b")
    assert new["id"] == job_id and new["attempts"] == 2
    assert new["lease_token"] != old["lease_token"]
    return old, new


def _assert_untouched(conn: Conn, new: dict[str, Any]) -> None:
    row = _row(conn, new["id"])
    assert row["state"] == "running"
    assert row["worker_id"] == "worker-b"
    assert row["lease_token"] == new["lease_token"]
    assert row["attempts"] == 2
    assert row["throttle_retries"] == 0
    assert row["result"] is None and row["finished_at"] is None
    assert row["last_error"] == "lease expired (worker lost)"


def test_stale_complete_is_fenced_and_the_new_owner_wins(auto: Conn) -> None:
    old, new = _rescued_and_reclaimed(auto)

    assert queries.run(auto, "job_complete", _complete(old, "worker-a")) == 0
    _assert_untouched(auto, new)

    assert queries.run(auto, "job_complete", _complete(new, "worker-b")) == 1
    row = _row(auto, new["id"])
    assert row["state"] == "succeeded"
    assert row["result"] == {"owner": "worker-b"}
    assert (row["input_tokens"], row["output_tokens"]) == (3, 4)
    assert row["worker_id"] == "worker-b"
    assert row["attempts"] == 2

    # Once finished, nobody (stale or current token) can write the job again.
    assert queries.run(auto, "job_complete", _complete(old, "worker-a")) == 0
    assert queries.run(auto, "job_complete", _complete(new, "worker-b")) == 0
    assert queries.run(auto, "job_retry", _retry(new)) is None
    assert _row(auto, new["id"])["result"] == {"owner": "worker-b"}


def test_stale_retry_is_fenced(auto: Conn) -> None:
    old, new = _rescued_and_reclaimed(auto)
    assert queries.run(auto, "job_retry", _retry(old)) is None
    assert queries.run(auto, "job_retry", {**_retry(old), "permanent": True}) is None
    _assert_untouched(auto, new)
    # the owner's own retry goes through
    assert queries.run(auto, "job_retry", _retry(new)) == {"state": "queued"}


def test_stale_throttle_is_fenced_and_records_no_event(auto: Conn) -> None:
    old, new = _rescued_and_reclaimed(auto)
    assert queries.run(auto, "job_throttle", _throttle(old)) is None
    assert _throttle_event_count(auto) == 0
    _assert_untouched(auto, new)

    assert queries.run(auto, "job_throttle", _throttle(new)) == {"state": "queued"}
    assert _throttle_event_count(auto) == 1
    row = _row(auto, new["id"])
    assert (row["attempts"], row["throttle_retries"]) == (1, 1)


def test_stale_interrupt_and_heartbeat_are_fenced(auto: Conn) -> None:
    old, new = _rescued_and_reclaimed(auto)
    stale = {**_key(old), "error": "stale stop", "delay_seconds": 0.0}
    assert queries.run(auto, "job_interrupt", stale) == 0
    heartbeat = {
        "held": Jsonb({str(old["id"]): [TENANT, old["lease_token"]]}),
        "lease_seconds": 600,
    }
    before = _row(auto, new["id"])["lease_expires_at"]
    assert queries.run(auto, "job_heartbeat", heartbeat) == []
    _assert_untouched(auto, new)
    assert _row(auto, new["id"])["lease_expires_at"] == before
    # the owner's heartbeat extends its lease
    owner_beat = {**heartbeat, "held": Jsonb({str(new["id"]): [TENANT, new["lease_token"]]})}
    assert queries.run(auto, "job_heartbeat", owner_beat) == [
        {"id": new["id"], "lease_token": new["lease_token"]}
    ]
    assert _row(auto, new["id"])["lease_expires_at"] > before


def test_rescue_skips_live_leases_and_fails_spent_jobs(auto: Conn) -> None:
    live = _enqueue(auto)
    spent = _enqueue(auto, max_attempts=1)
    claimed = {
        r["id"]
        for r in queries.run(
            auto, "job_claim", {"limit": 2, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
        )
    }
    assert claimed == {live, spent}
    assert queries.run(auto, "job_rescue", RESCUE) == []  # leases still live
    _expire_lease(auto, spent)
    assert queries.run(auto, "job_rescue", RESCUE) == [{"id": spent, "state": "failed"}]
    row = _row(auto, spent)
    assert row["state"] == "failed"
    assert row["finished_at"] is not None
    assert row["last_error"] == "lease expired (worker lost)"
    assert _row(auto, live)["state"] == "running"


def test_deferred_job_returns_later_without_using_an_attempt(db_dsn: str) -> None:
    """A worker without an API key (or a handler for the kind) gives the job back unharmed."""
    with psycopg.connect(db_dsn, autocommit=True) as auto:
        job_id = pgqueue.enqueue(
            auto,
            tenant_id="t",
            origin="user_action",
            payload={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
        )
        [claimed] = queries.run(
            auto, "job_claim", {"limit": 1, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
        )
        params = {
            "id": job_id,
            "tenant_id": "t",
            "lease_token": claimed["lease_token"],
            "error": "no API key",
            "delay_seconds": 60.0,
        }
        assert queries.run(auto, "job_interrupt", params) == 1
        state, attempts, delay = auto.execute(
            "SELECT state::text, attempts, extract(epoch FROM run_at - now()) FROM pgqueue.jobs"
        ).fetchone()
    assert (state, attempts) == ("queued", 0)
    assert 55 < float(delay) <= 60


def _complete_batch(db_dsn: str, claimed: dict[str, Any], owner: str) -> list[Any]:
    """A batched completion of ``claimed``, as the completer sends it, on its own connection."""
    from pgqueue.worker.completer import success_batch

    with psycopg.connect(db_dsn, autocommit=True) as c:
        batch = success_batch(
            [(claimed["id"], TENANT, claimed["lease_token"], {"owner": owner}, 3, 4)]
        )
        return list(queries.run(c, "job_complete_many", batch))


def _complete_alone_in_thread(db_dsn: str, claimed: dict[str, Any], owner: str) -> Any:
    """The completer's write of one success on its own (job_complete), on its own connection
    and thread; returns (thread, results list)."""
    import threading

    out: list[Any] = []

    def run() -> None:
        try:
            with psycopg.connect(db_dsn, autocommit=True, application_name="blocked") as c:
                key = {
                    "id": claimed["id"],
                    "tenant_id": TENANT,
                    "lease_token": claimed["lease_token"],
                    "result": Jsonb({"owner": owner}),
                    "input_tokens": 3,
                    "output_tokens": 4,
                }
                out.append(queries.run(c, "job_complete", key))
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _wait_until_blocked(conn: Conn) -> None:
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'blocked' AND wait_event_type = 'Lock'"
        ).fetchone()
        if row is not None and row[0] == 1:
            return
        time.sleep(0.02)
    raise AssertionError("the single write never waited on the row lock")


def test_batched_completion_skips_a_held_row_and_the_single_write_records_it(
    auto: Conn, db_dsn: str
) -> None:
    """A heartbeat of the same lease holds the row: the batched completion skips it at once
    instead of waiting (one held row must not stop a whole batch: found by a tester, a cancel
    held open in a user's transaction stopped a worker for every tenant). The completer then
    writes that success on its own, which waits for the row, re-reads its newest version and
    records the success and its values."""
    _enqueue(auto)
    claimed = _claim(auto, "worker-a")
    with psycopg.connect(db_dsn) as beat:  # the same worker's heartbeat, in flight
        held = queries.run(
            beat,
            "job_heartbeat",
            {
                "held": Jsonb({str(claimed["id"]): [TENANT, claimed["lease_token"]]}),
                "lease_seconds": 60,
            },
        )
        assert [r["id"] for r in held] == [claimed["id"]]
        assert _complete_batch(db_dsn, claimed, "a") == []  # no wait
        thread, out = _complete_alone_in_thread(db_dsn, claimed, "a")
        _wait_until_blocked(auto)
        beat.commit()
    thread.join(timeout=10)
    assert out == [1]
    row = _row(auto, claimed["id"])
    assert row["state"] == "succeeded"
    assert row["result"] == {"owner": "a"}
    assert (row["input_tokens"], row["output_tokens"]) == (3, 4)


def test_a_held_row_rescued_and_claimed_again_fences_the_single_write(
    auto: Conn, db_dsn: str
) -> None:
    """Same race, but what commits meanwhile is a rescue and a claim by another worker (a new
    lease token): the batch skipped the row, and the stale success written on its own changes
    nothing."""
    _enqueue(auto)
    old = _claim(auto, "worker-a")
    _expire_lease(auto, old["id"])
    with psycopg.connect(db_dsn) as other:
        assert queries.run(other, "job_rescue", RESCUE) == [{"id": old["id"], "state": "queued"}]
        assert _complete_batch(db_dsn, old, "a") == []
        thread, out = _complete_alone_in_thread(db_dsn, old, "a")
        _wait_until_blocked(auto)
        new = _claim(other, "worker-b")
        other.commit()
    thread.join(timeout=10)
    assert out == [0]
    row = _row(auto, old["id"])
    assert row["state"] == "running" and row["lease_token"] == new["lease_token"]
    assert row["result"] is None
