"""Rows and texts that must not crash a worker or strand a job (issue 32, defects 1 and 2).

A payload Postgres holds but Python cannot decode (nesting deeper than the recursion limit, an
integer of 5,000 digits) fails alone, naming why, while the jobs claimed with it run; an
exception whose text holds a NUL or a lone surrogate is recorded, not left ``running``.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.rows import dict_row

import pgqueue
from pgqueue.handlers.registry import Registry
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker


def jobs(dsn: str) -> list[dict[str, object]]:
    """The rows' outcomes (never their payloads, which this module makes undecodable)."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT id, state::text AS state, attempts, last_error FROM pgqueue.jobs ORDER BY id"
        ).fetchall()


#: jsonb texts Python's json cannot read back (written past enqueue's checks, as a row that
#: came from elsewhere: an older version, a hand-written INSERT).
POISON = {
    "deep": '{"d": ' + "[" * 5000 + "]" * 5000 + "}",
    "digits": '{"n": 1' + "0" * 5000 + "}",
}


def _enqueue(conn: psycopg.Connection[tuple[object, ...]], n: int, kind: str) -> list[int]:
    return [
        pgqueue.enqueue(
            conn, tenant_id="t", origin="scheduled", payload={"i": i}, kind=kind, max_attempts=2
        )
        for i in range(n)
    ]


@pytest.mark.timeout(60)
async def test_an_undecodable_payload_fails_alone_and_its_batch_mates_run(db_dsn: str) -> None:
    ran: list[int] = []
    registry = Registry()

    @registry.handler("test.count")
    async def count(job: Job) -> dict[str, int]:
        ran.append(job.id)
        return {"i": job.payload["i"]}

    with psycopg.connect(db_dsn) as conn:
        ids = _enqueue(conn, 6, "test.count")
        poisoned = {ids[1]: "deep", ids[4]: "digits"}
        for job_id, which in poisoned.items():
            conn.execute(
                "UPDATE pgqueue.jobs SET payload = %s::jsonb WHERE id = %s",
                (POISON[which], job_id),
            )
        conn.commit()
    worker = Worker(
        db_dsn, Settings(poll_interval_seconds=0.1), registry, concurrency=8, burst=True
    )
    stats = await worker.run(install_signal_handlers=False)  # returns: the worker did not crash

    assert stats.claimed == 6
    assert sorted(ran) == sorted(set(ids) - set(poisoned))
    rows = {r["id"]: r for r in jobs(db_dsn)}
    for job_id in ids:
        row = rows[job_id]
        if job_id in poisoned:
            assert row["state"] == "failed", row
            assert row["last_error"].startswith("payload cannot be decoded: "), row
        else:
            assert (row["state"], row["attempts"]) == ("succeeded", 1), row
    assert "too deeply" in rows[ids[1]]["last_error"]
    assert "digits" in rows[ids[4]]["last_error"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", ["boom \x00 binary", "lone \ud800 surrogate", "\x00" * 3000])
async def test_any_text_in_a_handlers_exception_is_recorded(db_dsn: str, text: str) -> None:
    registry = Registry()

    @registry.handler("test.raise")
    async def raise_it(job: Job) -> None:
        raise RuntimeError(text)

    with psycopg.connect(db_dsn) as conn:
        (job_id,) = _enqueue(conn, 1, "test.raise")
        conn.commit()
    settings = Settings(poll_interval_seconds=0.1, backoff_base_seconds=0.01)
    worker = Worker(db_dsn, settings, registry, concurrency=2, burst=True)
    stats = await worker.run(install_signal_handlers=False)

    (row,) = jobs(db_dsn)
    assert row["id"] == job_id
    # both attempts were recorded: the job failed for good, with its error, at once
    assert (row["state"], row["attempts"]) == ("failed", 2)
    assert stats.outcomes == {"queued": 1, "failed": 1}
    expected = f"RuntimeError: {text}".replace("\x00", "\\x00")
    expected = expected.encode("utf-8", "backslashreplace").decode()[:2000]
    assert row["last_error"] == expected
