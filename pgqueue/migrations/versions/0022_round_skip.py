"""The claim skips the DRR rounds in which no pair of a tier can pay for its next job.

A job whose cost is far above its tenant's quantum needs cost ÷ quantum turns of that tenant
before it is served; each turn is a step of the claim, taken under the scheduler's lock. With
a quantum of 0.05 and a job of cost 1,000,000 one claim ran for minutes while every other claim
waited (found by a fresh tester; the constraints allow any cost ≥ 1 and any finite quantum
> 0). Deficit Round Robin needs a quantum of at least the largest cost for O(1) work per job
(Shreedhar and Varghese, "Efficient Fair Queueing Using Deficit Round Robin", SIGCOMM 1995);
below it, whole rounds pass in which nobody is served.

Now, after ``idle_limit`` turns in one dispatch that ended without serving (64, doubled at
each use within the dispatch: found by a second tester, a limit doubled across the claim's
dispatches made a claim of 28 costly jobs take 15 s), the claim writes the tier's noted moves to the tail and computes,
over every pair of the round, the number of turns each still needs before it can pay for its
next due job: ``ceil((cost - deficit) / quantum)``. One less than the fewest is the number of
rounds in which nobody can be served; it adds that many quanta to every pair's deficit and
that many rounds to the tier's round counter, in one statement, and goes on. The pairs' order
does not change (a whole round moves each of them to the tail once). It does not skip when a
pair of the round has no due job (it would leave the round at its turn). The deficits are
those that many turns would give, as one product rather than a sum (the same value for whole
quanta and costs, the only ones the reference model is compared with).

New constraints keep costs and quanta where this holds (the same tester): ``jobs.cost <= 1e9``
(in the column's check, next to ``cost >= 1``)
(NaN and Infinity passed ``cost >= 1``, and a skip of more rounds than a bigint holds failed
the claim) and ``tenants.quantum >= 0.001`` (what ``pgqueue tenants set`` already asks), so a
deficit can always grow by a quantum in float8 and the rounds fit a bigint.

``drr_dispatch`` is revision 0020's, edited here, not copied.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import replace_anchor, revision_module

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_DECLARED = "    served boolean;\n"
_DECLARATIONS = """\
    served boolean;
    -- turns of this dispatch that ended without serving; at `idle_limit` of them (64, doubled
    -- after each skip within the dispatch) the rounds in which no pair of the tier can pay
    -- are skipped (revision 0022)
    idle integer := 0;
    idle_limit integer := 64;
    skip_k double precision;
    all_due boolean;
"""

_DISPATCH_STARTS = "            served := false;\n"

_TURN_ENDED = """\
                turn[b] := NULL;
                ht[b] := NULL;
                hdirty[b] := false;
            END LOOP;
"""
_SKIP = """\
                turn[b] := NULL;
                ht[b] := NULL;
                hdirty[b] := false;
                -- Skip the rounds in which no pair of the tier can pay for its next due job
                -- (revision 0022): k = one less than the fewest turns any pair still needs;
                -- k quanta for every pair and k more rounds, the pairs' order unchanged. Not
                -- when a pair has no due job: it leaves the round at its turn.
                idle := idle + 1;
                IF idle >= idle_limit THEN
{pending}
                    WITH rotated AS (
                        UPDATE pgqueue.deficits d SET deficit = u.deficit, pos = u.pos
                        FROM unnest(rt, rdef, rpos) AS u(tenant_id, deficit, pos)
                        WHERE d.tenant_id = u.tenant_id AND d.tier = tr
                        RETURNING d.tenant_id, d.deficit
                    ), pairs AS (
                        SELECT coalesce(r.deficit, d.deficit) AS deficit, q.quantum, h.cost
                        FROM pgqueue.deficits d
                        LEFT JOIN rotated r ON r.tenant_id = d.tenant_id
                        LEFT JOIN pgqueue.tenants tn ON tn.tenant_id = d.tenant_id
                        CROSS JOIN LATERAL (
                            SELECT pgqueue.plan_quantum(tn.plan, tn.quantum, base) AS quantum) q
                        LEFT JOIN LATERAL (
                            SELECT j.cost FROM pgqueue.jobs j
                            WHERE j.tenant_id = d.tenant_id AND j.priority = tr
                              AND j.state = 'queued' AND j.run_at <= now()
                              AND (j.tenant_id, j.priority, j.run_at, j.id)
                                  > (d.tenant_id, tr, '-infinity'::timestamptz,
                                     -9223372036854775808)
                              AND j.id <> ALL (picked)
                            ORDER BY j.tenant_id, j.priority, j.run_at, j.id
                            LIMIT 1
                            FOR UPDATE SKIP LOCKED) h ON true
                        WHERE d.tier = tr AND d.pos IS NOT NULL
                    )
                    SELECT min(ceil((p.cost - p.deficit) / p.quantum)) - 1,
                           bool_and(p.cost IS NOT NULL)
                    INTO skip_k, all_due
                    FROM pairs p;
{written}
                    -- (below 1e15 rounds: a cost or quantum outside the constraints, in a row
                    -- older than them, is left to the turns one by one)
                    IF all_due AND skip_k >= 1 AND skip_k < 1e15 THEN
                        UPDATE pgqueue.deficits d
                        SET deficit = d.deficit + skip_k * q.quantum
                        FROM (SELECT p.tenant_id,
                                     pgqueue.plan_quantum(tn.plan, tn.quantum, base) AS quantum
                              FROM pgqueue.deficits p
                              LEFT JOIN pgqueue.tenants tn ON tn.tenant_id = p.tenant_id
                              WHERE p.tier = tr AND p.pos IS NOT NULL) q
                        WHERE d.tier = tr AND d.tenant_id = q.tenant_id;
                        rnd[b] := rnd[b] + skip_k::bigint;
                    END IF;
                    nt[b] := NULL;  -- its deficit may have changed: the round is loaded again
                    idle := 0;
                    idle_limit := idle_limit * 2;
                END IF;
            END LOOP;
"""


def _replace(body: str, anchor: str, replacement: str) -> str:
    return replace_anchor(body, anchor, replacement, what="revision 0022: drr_dispatch")


def _revision_0020() -> ModuleType:
    return revision_module(Path(__file__).with_name("0020_round_prefetch.py"))


def _revision_0017() -> ModuleType:
    return revision_module(Path(__file__).with_name("0017_claim_counts.py"))


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body: str = _revision_0020().dispatch()
    body = _replace(body, _DECLARED, _DECLARATIONS)
    body = _replace(
        body,
        _DISPATCH_STARTS,
        _DISPATCH_STARTS + "            idle := 0;\n            idle_limit := 64;\n",
    )
    r0020 = _revision_0020()
    # the tier's noted moves, written first and dropped after, as revision 0020's head loads do
    skip = _SKIP.replace("{pending}\n", r0020.indented(r0020.PENDING, 20))
    skip = skip.replace("{written}\n", r0020.indented(r0020.WRITTEN, 20))
    return _replace(body, _TURN_ENDED, skip)


#: Costs and quanta whose ratio the skip can count in rounds and whose deficits keep growing in
#: float8 (a job's cost is max(1, estimated input tokens / 1000), so real costs are far below
#: the bound; `pgqueue tenants set` already asks for a quantum of 0.001 to 1e9). NaN and
#: Infinity passed the old `cost >= 1`. NOT VALID: rows already stored are not checked.
#: The cost bound replaces the column's own check rather than adding one: every update of a
#: job evaluates each check, and a second one cost a claim and its completion 0.7 % more
#: instructions (``bench/claim_instructions.py``).
_BOUNDS = (
    "ALTER TABLE pgqueue.jobs DROP CONSTRAINT jobs_cost_check,"
    " ADD CONSTRAINT jobs_cost_check"
    " CHECK (cost >= 1 AND cost <= '1e9'::double precision) NOT VALID",
    "ALTER TABLE pgqueue.tenants ADD CONSTRAINT tenants_quantum_floor"
    " CHECK (quantum IS NULL OR quantum >= 0.001) NOT VALID",
)


def upgrade() -> None:
    op.execute(dispatch())
    for statement in _revision_0017().dispatch_settings():  # CREATE OR REPLACE dropped them
        op.execute(statement)
    for statement in _BOUNDS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("ALTER TABLE pgqueue.tenants DROP CONSTRAINT tenants_quantum_floor")
    op.execute(
        "ALTER TABLE pgqueue.jobs DROP CONSTRAINT jobs_cost_check,"
        " ADD CONSTRAINT jobs_cost_check CHECK (cost >= 1) NOT VALID"
    )
    op.execute(_revision_0020().dispatch())
    for statement in _revision_0017().dispatch_settings():
        op.execute(statement)
