"""The view ``pgqueue.batch_lane_service``: the batches lane per tenant (docs/batches.md)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row


def batch_jobs(dsn: str, jobs: list[tuple[str, str | None, int, int]]) -> None:
    """One ended batch holding ``jobs``: (tenant, outcome or None for pending, input tokens,
    output tokens), each a job of its own with that usage."""
    with psycopg.connect(dsn) as conn:
        batch_id = conn.execute(
            "INSERT INTO pgqueue.batches (state, requests) VALUES ('ended', %s) RETURNING id",
            (len(jobs),),
        ).fetchone()[0]  # type: ignore[index]
        for tenant, outcome, input_tokens, output_tokens in jobs:
            conn.execute(
                "INSERT INTO pgqueue.tenants (tenant_id) VALUES (%s) ON CONFLICT DO NOTHING",
                (tenant,),
            )
            job_id = conn.execute(
                "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, state, payload,"
                " input_tokens, output_tokens)"
                " VALUES (%s, 'batch_job', 'batch', 'succeeded', '{}', %s, %s) RETURNING id",
                (tenant, input_tokens, output_tokens),
            ).fetchone()[0]  # type: ignore[index]
            conn.execute(
                "INSERT INTO pgqueue.batch_jobs (batch_id, job_id, tenant_id, outcome)"
                " VALUES (%s, %s, %s, %s)",
                (batch_id, job_id, tenant, outcome),
            )
        conn.commit()


def lane(dsn: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        rows = conn.execute("SELECT * FROM pgqueue.batch_lane_service").fetchall()
    return {r.pop("tenant_id"): r for r in rows}


def test_each_tenant_gets_its_requests_results_and_succeeded_tokens(db_dsn: str) -> None:
    batch_jobs(
        db_dsn,
        [
            ("acme", "succeeded", 1000, 200),
            ("acme", "succeeded", 3000, 400),
            ("acme", "errored", 500, 50),  # an errored request's tokens are not the lane's
            ("globex", "succeeded", 7000, 900),
            ("globex", "expired", 0, 0),
        ],
    )
    batch_jobs(db_dsn, [("globex", "canceled", 0, 0), ("globex", None, 0, 0)])
    assert lane(db_dsn) == {
        "acme": {
            "requests": 3,
            "pending": 0,
            "succeeded": 2,
            "errored": 1,
            "expired": 0,
            "canceled": 0,
            "input_tokens": 4000,
            "output_tokens": 600,
        },
        "globex": {
            "requests": 4,
            "pending": 1,
            "succeeded": 1,
            "errored": 0,
            "expired": 1,
            "canceled": 1,
            "input_tokens": 7000,
            "output_tokens": 900,
        },
    }


def test_a_tenant_that_never_used_the_lane_has_no_row(db_dsn: str) -> None:
    batch_jobs(db_dsn, [("acme", "succeeded", 10, 1)])
    with psycopg.connect(db_dsn) as conn:
        conn.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('initech')")
        conn.commit()
    assert set(lane(db_dsn)) == {"acme"}
