"""The stamping horizon (GUC ``pgqueue.stamp_horizon_rounds``, default 4; docs/drr.md) on the
product's claim: the order is DRR's whatever the horizon, and a fold stamps a tenant's rounds up
to the horizon, not its whole backlog. Moved here from the scheduler v2 prototype's tests
(issue 28), which checked both on the prototype only; test_drr_claim.py runs at the default."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgqueue.models import Tier
from tests.db.drr_support import add_jobs, claim, claim_n, ref_take, reference, reset, set_tenant

C, S, B = Tier.CRITICAL, Tier.STANDARD, Tier.BATCH


def _horizon(conn, rounds: int) -> None:
    conn.execute(f"SET pgqueue.stamp_horizon_rounds = {int(rounds)}")
    conn.commit()


job_lists = st.lists(
    st.tuples(
        st.sampled_from([C, S, B]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.sampled_from([1.0, 1.0, 2.5, 4.0, 12.0]),
    ),
    min_size=1,
    max_size=20,
)


@settings(
    max_examples=20,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    phases=st.lists(st.tuples(job_lists, st.integers(0, 20), st.sampled_from([1, 10])), max_size=3),
    quanta=st.fixed_dictionaries(
        {t: st.sampled_from([1.0, 2.0, 5.0, 7.0]) for t in ["a", "b", "c", "d"]}
    ),
    horizon=st.sampled_from([0, 1, 4]),
)
def test_claims_follow_the_reference_at_every_horizon(conn, phases, quanta, horizon):
    reset(conn)
    _horizon(conn, horizon)
    for tenant, q in quanta.items():
        set_tenant(conn, tenant, quantum=q)
    conn.commit()
    ref = reference(conn)
    for jobs, n, batch in phases:
        add_jobs(conn, jobs, ref)
        assert claim_n(conn, n, batch=batch) == ref_take(ref, n)
    assert claim_n(conn, 10_000, batch=7) == ref_take(ref, 10_000)
    assert claim(conn, 5) == []


@pytest.mark.parametrize("horizon", [0, 2, 8])
def test_a_tenants_backlog_is_stamped_a_horizon_at_a_time(conn, horizon):
    """20,000 jobs of one tenant (5 a round), then one of another: a claim stamps the big
    backlog up to the horizon (5 jobs a round), not all of it, and the other tenant's job is
    among the first claimed."""
    reset(conn)
    _horizon(conn, horizon)
    set_tenant(conn, "big", quantum=5.0)
    set_tenant(conn, "small", quantum=5.0)
    conn.execute(
        "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload, cost)"
        " SELECT 'big', 'user_action', 'critical', '{}', 1 FROM generate_series(1, 20000)"
    )
    conn.commit()
    add_jobs(conn, [(C, "small", 1.0)])
    got = claim(conn, 1)
    stamped = conn.execute(
        "SELECT count(*) FROM pgqueue.jobs WHERE state = 'queued' AND key_round IS NOT NULL"
    ).fetchone()[0]
    assert 1 <= stamped <= 5 * (horizon + 1) + 1, stamped
    got += claim(conn, 9)
    assert [d.tenant_id for d in got].index("small") <= 5
