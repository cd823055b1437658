"""The tenants page shows each tenant's batches-lane tokens and estimated cost saved."""

from __future__ import annotations

from tests.dashboard.conftest import Client
from tests.db.test_batch_lane_service import batch_jobs


def test_tenants_page_shows_the_batches_lane(client: Client, db_dsn: str) -> None:
    batch_jobs(db_dsn, [("acme", "succeeded", 1_000_000, 100_000), ("globex", "errored", 0, 0)])
    status, _, page = client.request("/tenants")
    assert status == 200
    assert "batches lane tokens (in / out)" in page
    assert "1,000,000 / 100,000" in page
    # 50 % of $3 per million input and $15 per million output tokens (the default settings)
    assert "$2.25" in page
    assert "$0.00" in page  # globex: nothing succeeded, nothing saved
