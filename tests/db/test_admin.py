"""`pgqueue retry`: bulk re-queue of failed jobs by tenant, tier, reason and time."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import pgqueue
from pgqueue.admin import requeue_failed

_CLI = [sys.executable, "-c", "from pgqueue.cli import app; app()"]
PAYLOAD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _fail_all(conn, error: str, where: str = "true") -> None:
    conn.execute(
        f"UPDATE pgqueue.jobs SET state = 'failed', attempts = 5, throttle_retries = 2,"
        f" finished_at = now(), last_error = %s WHERE {where}",
        (error,),
    )


def test_requeue_by_filters(conn):
    a = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
    b = pgqueue.enqueue(conn, tenant_id="b", origin="batch_job", payload=PAYLOAD)
    c = pgqueue.enqueue(conn, tenant_id="b", origin="user_action", payload=PAYLOAD)
    _fail_all(conn, "HTTP 500: overloaded upstream", f"id IN ({a}, {b})")
    _fail_all(conn, "throttled: HTTP 429", f"id = {c}")
    assert requeue_failed(conn, tenant_id="nobody") == []
    assert requeue_failed(conn, tenant_id="b", reason="429") == [c]
    assert requeue_failed(conn, tier="batch") == [b]
    future = datetime.now(UTC) + timedelta(hours=1)
    assert requeue_failed(conn, since=future) == []
    assert requeue_failed(conn, until=future) == [a]
    rows = conn.execute(
        "SELECT state::text, attempts, throttle_retries, finished_at FROM pgqueue.jobs"
    ).fetchall()
    assert rows == [("queued", 0, 0, None)] * 3


def test_a_reason_is_a_literal_substring(conn):
    """Found by a tester: `--reason '%'` (or '_') re-queued every failed job: the reason went
    into ILIKE with its wildcards."""
    a = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
    b = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
    _fail_all(conn, "quota 100% used: a_b\\c", f"id = {a}")
    _fail_all(conn, "HTTP 500", f"id = {b}")
    for reason in ("%", "_", "\\", "100%", "A_B\\C"):  # only a's error holds them
        assert requeue_failed(conn, reason=reason) == [a], reason
        _fail_all(conn, "quota 100% used: a_b\\c", f"id = {a}")
    assert requeue_failed(conn, reason="x%") == []


def test_requeue_rejects_bad_filters(conn):
    with pytest.raises(pgqueue.InvalidArgument):
        requeue_failed(conn, tier="urgent")
    with pytest.raises(pgqueue.InvalidArgument):
        requeue_failed(conn, since=datetime(2020, 1, 1))
    with pytest.raises(pgqueue.InvalidArgument):
        requeue_failed(
            conn, since=datetime(2021, 1, 1, tzinfo=UTC), until=datetime(2020, 1, 1, tzinfo=UTC)
        )


def test_retry_cli(db_dsn):
    import psycopg

    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
        _fail_all(conn, "boom")
        conn.commit()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pgqueue.cli import app; app()",
            "retry",
            "--reason",
            "BOOM",
            "--dsn",
            db_dsn,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "re-queued 1" in out.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pgqueue.cli import app; app()",
            "retry",
            "--tier",
            "urgent",
            "--dsn",
            db_dsn,
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "InvalidArgument" in bad.stderr


def test_prune_deletes_only_old_finished_jobs(db_dsn):
    import psycopg

    from pgqueue.admin import prune_finished

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        ids = [
            pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
            for _ in range(6)
        ]
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'succeeded', finished_at = now() - interval '2 days'"
            " WHERE id = ANY(%s)",
            (ids[:3],),
        )
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'failed', finished_at = now() - interval '1 hour'"
            " WHERE id = %s",
            (ids[3],),
        )
        conn.execute("UPDATE pgqueue.jobs SET state = 'running' WHERE id = %s", (ids[4],))
        assert prune_finished(conn, older_than_seconds=86_400, batch=2) == 3
        left = {r[0] for r in conn.execute("SELECT id FROM pgqueue.jobs")}
        assert left == set(ids[3:])
        assert prune_finished(conn, older_than_seconds=0) == 1  # the failed one
        with pytest.raises(pgqueue.InvalidArgument):
            prune_finished(conn, older_than_seconds=-1)


def test_the_known_plans_are_the_ones_sql_prices(conn) -> None:
    """`tenants set --plan` accepts drr.KNOWN_PLANS; pgqueue.plan_quantum (revision 0002)
    prices plans by name too. The two lists must agree, or a plan the CLI accepts would
    silently mean x1 (found by a tester: any name was accepted)."""
    from pgqueue.scheduling.drr import KNOWN_PLANS, PLAN_QUANTUM_MULTIPLIERS

    for plan in KNOWN_PLANS:
        row = conn.execute("SELECT pgqueue.plan_quantum(%s, NULL, 10.0)", (plan,)).fetchone()
        assert row[0] == 10.0 * PLAN_QUANTUM_MULTIPLIERS.get(plan, 1.0), plan


def _counters_match(conn) -> None:
    from pgqueue.db import queries

    counted = [r for r in queries.run(conn, "queue_counts_by_key") if r["queued"]]
    actual = queries.run(conn, "queue_counts_actual")

    def key(r):
        return (r["tier"], r["tenant_id"] or "", r["queued"])

    assert sorted(map(key, counted)) == sorted(map(key, actual))


def test_retry_one_job(conn):
    """pgqueue.retry (revision 0034): a failed or cancelled job goes back to the queue with
    fresh counters, is claimable, and is counted; any other state is left as it is."""
    from pgqueue.admin import retry_job

    failed = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
    cancelled = pgqueue.enqueue(conn, tenant_id="b", origin="batch_job", payload=PAYLOAD)
    queued = pgqueue.enqueue(conn, tenant_id="b", origin="batch_job", payload=PAYLOAD)
    _fail_all(conn, "HTTP 500", f"id = {failed}")
    assert pgqueue.cancel(conn, cancelled, reason="oops") == "cancelled"
    assert retry_job(conn, failed) == "queued"
    assert retry_job(conn, cancelled) == "queued"
    assert retry_job(conn, queued) == "queued"  # was queued already: unchanged
    rows = conn.execute(
        "SELECT id, state::text, attempts, throttle_retries, finished_at FROM pgqueue.jobs"
        " ORDER BY id"
    ).fetchall()
    assert rows == [(i, "queued", 0, 0, None) for i in (failed, cancelled, queued)]
    _counters_match(conn)
    conn.commit()
    claimed = conn.execute("SELECT count(*) FROM pgqueue.claim(10, 'w', 60)").fetchone()
    assert claimed == (3,)


def test_retry_of_an_unknown_job(conn):
    from pgqueue.admin import retry_job

    job = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
    conn.commit()
    with pytest.raises(pgqueue.UnknownJob, match="no job 999999"):
        retry_job(conn, 999_999)
    conn.rollback()
    with pytest.raises(psycopg.Error, match="of tenant 'b'") as raised:
        conn.execute("SELECT pgqueue.retry(%s, 'b')", (job,))
    assert raised.value.sqlstate == "PQ011"
    conn.rollback()
    with pytest.raises(pgqueue.InvalidArgument):
        retry_job(conn, 0)


# ------------------------------------------------ retries and dedupe keys (revision 0070)
def _keyed(conn, tenant: str, key: str | None, *, failed: bool) -> int:
    job = pgqueue.enqueue(
        conn, tenant_id=tenant, origin="user_action", payload=PAYLOAD, dedupe_key=key
    )
    assert job is not None
    if failed:
        _fail_all(conn, "HTTP 400", f"id = {job}")
    return job


def _states(conn, *ids: int) -> list[str]:
    return [
        conn.execute("SELECT state::text FROM pgqueue.jobs WHERE id = %s", (i,)).fetchone()[0]
        for i in ids
    ]


def test_a_bulk_retry_skips_the_jobs_whose_dedupe_key_a_live_job_holds(conn):
    """Found by a tester: one failed job whose dedupe key a queued job held made `pgqueue retry
    --all` fail with a unique violation of jobs_dedupe_live_idx, and nothing was re-queued,
    not even an unrelated job. Now the others are re-queued and that one is skipped, named with
    the live job; of two failed jobs sharing a key, the newer is re-queued."""
    from pgqueue.admin import HeldJob

    held = _keyed(conn, "a", "K", failed=True)
    # failed, then its key enqueued again: the job now live holds it
    holder = _keyed(conn, "a", "K", failed=False)
    plain = _keyed(conn, "a", None, failed=True)
    older = _keyed(conn, "a", "K2", failed=True)
    newer = _keyed(conn, "a", "K2", failed=True)
    other_tenant = _keyed(conn, "b", "K", failed=True)  # keys are per tenant
    done = requeue_failed(conn)
    assert done == [plain, newer, other_tenant]
    assert done.skipped == [HeldJob(held, "K", holder), HeldJob(older, "K2", newer)]
    assert _states(conn, held, holder, plain, older, newer, other_tenant) == [
        "failed",
        "queued",
        "queued",
        "failed",
        "queued",
        "queued",
    ]
    _counters_match(conn)
    again = requeue_failed(conn)
    assert again == [] and [s.job_id for s in again.skipped] == [held, older]


def test_a_retry_of_a_job_whose_dedupe_key_a_live_job_holds(conn):
    """pgqueue.retry raised the raw unique violation: now PQ013, DedupeKeyHeld, naming the job,
    the key and the live job (an AdmissionError: `retry later`, exit 75 at the CLI)."""
    from pgqueue.admin import retry_job

    held = _keyed(conn, "a", "K", failed=True)
    holder = _keyed(conn, "a", "K", failed=False)
    conn.commit()
    with pytest.raises(pgqueue.DedupeKeyHeld) as raised:
        retry_job(conn, held)
    assert str(raised.value) == (
        f"job {held} not retried: its dedupe key 'K' (tenant 'a') is held by live job {holder}"
    )
    assert (raised.value.job_id, raised.value.tenant_id) == (held, "a")
    assert (raised.value.dedupe_key, raised.value.held_by) == ("K", holder)
    assert isinstance(raised.value, pgqueue.AdmissionError)
    conn.rollback()
    assert pgqueue.cancel(conn, holder) == "cancelled"
    assert retry_job(conn, held) == "queued"  # once the key is free


def _in_thread(dsn: str, work, *, isolation=None):
    """Run ``work(conn)`` on a connection of its own, named 'blocked', in a thread; the
    thread and a list that gets its result or exception."""
    import threading

    out: list[object] = []

    def run() -> None:
        try:
            with psycopg.connect(dsn, application_name="blocked") as c:
                if isolation is not None:
                    c.isolation_level = isolation
                out.append(work(c))
                c.commit()
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _wait_until_blocked(conn) -> None:
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'blocked' AND wait_event_type = 'Lock'"
        ).fetchone()
        conn.commit()
        if row[0] == 1:
            return
        time.sleep(0.02)
    raise AssertionError("the retry never waited")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bulk", [True, False])
def test_a_retry_racing_an_enqueue_of_the_same_key(db_dsn, bulk):
    """An enqueue of the key, not committed when the retry's UPDATE runs: the unique index
    makes the retry wait, then fail with a unique violation once the enqueue commits. No raw
    unique violation escapes: the bulk retry runs again with a snapshot that sees that job and
    skips the job, the single one raises DedupeKeyHeld, each naming the job enqueued
    meanwhile."""
    from pgqueue.admin import retry_job

    with psycopg.connect(db_dsn) as conn:
        held = _keyed(conn, "a", "K", failed=True)
        plain = _keyed(conn, "a", None, failed=True)
        older, newer = (_keyed(conn, "a", "K2", failed=True) for _ in range(2))
        conn.commit()
        racer = _keyed(conn, "a", "K", failed=False)  # not committed yet
        with psycopg.connect(db_dsn) as watcher:
            thread, out = _in_thread(
                db_dsn, requeue_failed if bulk else (lambda c: retry_job(c, held))
            )
            _wait_until_blocked(watcher)
            conn.commit()
            thread.join(30)
        assert len(out) == 1
        if bulk:
            assert out[0] == [plain, newer]
            skipped = [(s.job_id, s.held_by) for s in out[0].skipped]
            assert skipped == [(held, racer), (older, newer)]
        else:
            assert isinstance(out[0], pgqueue.DedupeKeyHeld), out[0]
            assert out[0].held_by == racer
        assert _states(conn, held, racer) == ["failed", "queued"]
        _counters_match(conn)


@pytest.mark.parametrize("bulk", [True, False])
def test_a_retry_in_repeatable_read_after_a_holder_committed(db_dsn, bulk):
    """A live job committed after a REPEATABLE READ transaction's snapshot holds the key: the
    retry cannot see it, yet no raw unique violation escapes (held_by is then unknown). The bulk
    retry goes one job at a time then, and still re-queues only the newer of two failed jobs
    sharing a key."""
    from pgqueue.admin import retry_job

    with psycopg.connect(db_dsn) as conn, psycopg.connect(db_dsn) as late:
        held = _keyed(conn, "a", "K", failed=True)
        plain = _keyed(conn, "a", None, failed=True)
        older, newer = (_keyed(conn, "a", "K2", failed=True) for _ in range(2))
        conn.commit()
        late.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        late.execute("SELECT 1 FROM pgqueue.jobs").fetchall()  # the snapshot is taken
        _keyed(conn, "a", "K", failed=False)
        conn.commit()
        if bulk:
            done = requeue_failed(late)
            assert done == [plain, newer]
            skipped = [(s.job_id, s.held_by) for s in done.skipped]
            assert skipped == [(held, None), (older, newer)]
        else:
            with pytest.raises(pgqueue.DedupeKeyHeld, match="held by a live job committed"):
                retry_job(late, held)


@pytest.mark.timeout(60)
def test_two_bulk_retries_at_once(db_dsn):
    """The second waits for the jobs the first holds, then skips the one whose key the first
    re-queued a sibling for."""
    with psycopg.connect(db_dsn) as conn:
        older = _keyed(conn, "a", "K", failed=True)
        newer = _keyed(conn, "a", "K", failed=True)
        conn.commit()
        first = requeue_failed(conn)  # not committed yet
        assert first == [newer] and [s.job_id for s in first.skipped] == [older]
        with psycopg.connect(db_dsn) as watcher:
            thread, out = _in_thread(db_dsn, requeue_failed)
            _wait_until_blocked(watcher)
            conn.commit()
            thread.join(30)
        assert out == [[]]
        assert [(s.job_id, s.held_by) for s in out[0].skipped] == [(older, newer)]


def test_retry_cli_reports_the_jobs_it_skipped(db_dsn):
    """The tester's reproduction: `pgqueue retry --all` exited 1 with a unique violation."""
    with psycopg.connect(db_dsn) as conn:
        held = _keyed(conn, "a", "K", failed=True)
        holder = _keyed(conn, "a", "K", failed=False)
        _keyed(conn, "a", None, failed=True)
        conn.commit()
    out = subprocess.run(
        [*_CLI, "retry", "--all", "--dsn", db_dsn],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "re-queued 1 failed job(s)",
        f"skipped 1 failed job(s): a live job holds their dedupe key: job {held} (held by "
        f"job {holder})",
    ]
