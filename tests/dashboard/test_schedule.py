"""The schedule page (scheduler v2): pgqueue.claim_order, the stamped jobs per tier and lane in
key order, and the lanes and tiers whose due jobs wait for their keys. Read-only."""

from __future__ import annotations

import psycopg

from pgqueue.dashboard import data
from tests.dashboard.conftest import MODEL, QUEUED, Client, Seeded

COLUMNS = ["lane", "tier", "tenant_id", "job_id", "cost", "round", "place", "seq"]
ALL_DUE = [
    {"lane": MODEL, "tier": "critical"},
    {"lane": MODEL, "tier": "standard"},
    {"lane": MODEL, "tier": "batch"},
    {"lane": "pgqueue.noop", "tier": "batch"},
]


def _stamp(dsn: str) -> None:
    """What every claim does first: fold each lane and tier with unstamped due jobs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgqueue.fold(u.lane, u.tier) FROM pgqueue.lane_tiers_due() u")


def test_before_any_claim_the_schedule_names_the_lanes_waiting_for_keys(
    db_dsn: str, seeded: Seeded
):
    """Found porting the dashboard to scheduler v2: claims stamp the jobs, so with no worker
    yet the page said "Nothing can be claimed now" over 14 due jobs. Now claim_order lists
    due jobs without a key after the stamped ones (round NULL) and the page names their lanes.
    It reads only: it works in a read-only transaction (a replica)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = on")
        found = data.schedule(conn)
    assert found["unstamped"] == ALL_DUE
    assert {r["job_id"] for r in found["rows"]} == {
        j for ids in seeded.by_tier.values() for j in ids
    } | {r["job_id"] for r in found["rows"] if r["lane"] != MODEL}
    assert all(r["round"] is None for r in found["rows"])


def test_the_schedule_is_the_order_claims_take(db_dsn: str, seeded: Seeded):
    _stamp(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        found = data.schedule(conn)
        assert found["columns"] == COLUMNS and found["unstamped"] == []
        rows = found["rows"]
        assert len(rows) == sum(QUEUED.values()) + 2  # the <script> tenant's job and the no-op
        assert {r["job_id"] for r in rows} == {j for ids in seeded.by_tier.values() for j in ids}
        tiers = [r["tier"] for r in rows]
        assert tiers == sorted(tiers, key=["critical", "standard", "batch"].index)
        shown = [r["job_id"] for r in rows if r["tier"] == "critical"]
        conn.execute("SET pgqueue.tier_policy = 'strict'")
        taken = []
        for _ in shown:
            [(job_id,)] = conn.execute("SELECT id FROM pgqueue.claim(1, 'w', 60)").fetchall()
            taken.append(job_id)
    assert taken == shown


def test_the_schedule_page_lists_the_waiting_lanes_then_links_the_jobs(
    client: Client, db_dsn: str, seeded: Seeded
):
    status, _, page = client.request("/schedule")
    assert status == 200 and 'id="unstamped"' in page
    assert f'<span class="lane">{MODEL}</span> critical' in page
    _stamp(db_dsn)
    status, _, page = client.request("/schedule")
    assert status == 200 and 'id="unstamped"' not in page
    for job_id in seeded.by_tier["critical"]:
        assert f'href="/jobs/{job_id}"' in page
