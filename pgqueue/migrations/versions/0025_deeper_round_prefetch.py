"""A claim's first load reads as many pairs of each round as the tier's part of the claim needs.

Revision 0020's first load read, per tier, the round head and the pair after it, each with its
next due jobs, locked; when a claim used up both (a tier's part of the claim beyond two turns),
each further turn began with a statement that moved the ended pair to the tail and loaded the
next head: ~0.57 M instructions each (callgrind, ``bench/claim_instructions.py``), about one
per claim of 10 no-op jobs on the benchmark's queue (three tiers, 10 tenants, quantum 5), about
six per claim of 40. A claim's server work with a quantum too large for any turn to end was
11 % below that with quantum 5 (4.71 M against 5.29 M instructions per claim of 10).

Now the first load reads, per tier, up to ``ceil(share / base quantum) + 1`` pairs (at least
two, at most the claim plus one) while their credits ahead stay below the tier's likely part
of the claim (``share``), each with its next due jobs, locked. The share is the tier's weight
among the tiers with a turn in progress and itself (before, among all three: the ``batch``
tier alone in use, weight 5 of 100, read its round head only); it decides only how much is
read. The pairs after the
second wait in a queue: when the pair after the head becomes the head, the next queued pair of
its tier takes its place, with no statement. The queue is dropped where revision 0020 drops
the pair after the head (the round skip of revision 0022 changes deficits: the round is loaded
again). The dispatch order is unchanged: a queued pair is the pair a head load would find (a
pair leaves the round only at its own turn, and pairs join at the tail).

``drr_dispatch`` is revision 0023's, edited here, not copied.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import replace_anchor, revision_module

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_DECLARED = "    orphan record;\n"
_DECLARATIONS = """\
    orphan record;
    -- the pairs of the first load after the pair after the head (revision 0025), in (tier,
    -- pos) order: tier, tenant, deficit, quantum, pos, loaded jobs (qp_n of them, from
    -- qp_off + 1 in qj_*), nothing due after them; qnext: per tier, its next queued pair
    qp_ord integer[];
    qp_t text[];
    qp_def double precision[];
    qp_q double precision[];
    qp_pos bigint[];
    qp_n integer[];
    qp_done boolean[];
    qp_off integer[];
    qj_id bigint[];
    qj_cost double precision[];
    qj_run timestamptz[];
    qnext integer[] := '{0,0,0}';
    depth integer[] := '{2,2,2}';
    qi integer;
    qn integer;
"""

_SHARE = """\
            total := weight[1] + weight[2] + weight[3];
            FOR ri IN 1 .. 3 LOOP
                share[ri] := CASE WHEN policy IN ('strict', 'probabilistic') OR total <= 0
                                  THEN max_jobs
                                  ELSE ceil(max_jobs * weight[ri] / total)::integer END;
            END LOOP;
"""
_SHARE_ACTIVE = """\
            -- (revision 0025) among the tiers with a turn in progress, and itself: a tier
            -- alone in use takes the whole claim (a guess for how much to read; it decides
            -- nothing else)
            FOR ri IN 1 .. 3 LOOP
                total := CASE WHEN ri = 1 OR turn[1] IS NOT NULL THEN weight[1] ELSE 0 END
                         + CASE WHEN ri = 2 OR turn[2] IS NOT NULL THEN weight[2] ELSE 0 END
                         + CASE WHEN ri = 3 OR turn[3] IS NOT NULL THEN weight[3] ELSE 0 END;
                share[ri] := CASE WHEN policy IN ('strict', 'probabilistic') OR total <= 0
                                  THEN max_jobs
                                  ELSE ceil(max_jobs * weight[ri] / total)::integer END;
                -- pairs to read: enough for its share at the base quantum (capped before the
                -- cast: a base quantum set far below the tenants' floor must not overflow it)
                depth[ri] := greatest(2, least(max_jobs + 1,
                                               ceil(share[ri] / nullif(base, 0)) + 1)::integer);
            END LOOP;
            qp_ord := '{}';
            qp_t := '{}';
            qp_def := '{}';
            qp_q := '{}';
            qp_pos := '{}';
            qp_n := '{}';
            qp_done := '{}';
            qp_off := '{}';
            qj_id := '{}';
            qj_cost := '{}';
            qj_run := '{}';
            qnext := '{0,0,0}';
"""

#: The tiers' subquery is kept apart (``OFFSET 0``): flattened into the pairs' join, its EXISTS
#: (due waiting pairs?) ran once per pair read instead of once per tier, each probe walking the
#: waiting index's entries of pairs that have joined the round since the last VACUUM (3,012
#: buffers for 14 pairs after 1,000 tenants had joined, against 3 probes).
_TIERS = """\
                                  WHERE ht[u.ord] IS NULL AND nt[u.ord] IS NULL) tt
"""
_TIERS_APART = """\
                                  WHERE ht[u.ord] IS NULL AND nt[u.ord] IS NULL
                                  OFFSET 0) tt  -- one probe per tier (revision 0025)
"""

_LIMIT_2 = """\
                                      ORDER BY d.pos
                                      LIMIT 2) h
"""
_LIMIT_DEPTH = """\
                                      ORDER BY d.pos
                                      LIMIT depth[tt.ord]) h
"""

_SECOND_PAIR_END = """\
                    nn[i] := n;
                    ndone[i] := n < ld.lim;
                END IF;
            END LOOP;
"""
_QUEUED_PAIR = """\
                    nn[i] := n;
                    ndone[i] := n < ld.lim;
                ELSE  -- a later pair: queued behind the pair after the head (revision 0025)
                    qp_ord := qp_ord || i;
                    qp_t := qp_t || ld.tenant_id;
                    qp_def := qp_def || ld.deficit;
                    qp_q := qp_q || ld.quantum;
                    qp_pos := qp_pos || ld.pos;
                    qp_n := qp_n || n;
                    qp_done := qp_done || (n < ld.lim);
                    qp_off := qp_off || cardinality(qj_id);
                    IF n > 0 THEN
                        qj_id := qj_id || ld.ids;
                        qj_cost := qj_cost || ld.costs;
                        qj_run := qj_run || ld.runs;
                    END IF;
                    IF qnext[i] = 0 THEN
                        qnext[i] := cardinality(qp_t);
                    END IF;
                END IF;
            END LOOP;
"""
_SECOND_PAIR_BRANCH = """\
                    bdone[i] := n < ld.lim;
                ELSE
                    nt[i] := ld.tenant_id;
"""
_SECOND_PAIR_BRANCH_RANKED = """\
                    bdone[i] := n < ld.lim;
                ELSIF ld.rank = 2 THEN
                    nt[i] := ld.tenant_id;
"""

_REFILL = """\
nt[{x}] := NULL;
IF qnext[{x}] > 0 THEN  -- the next queued pair of the tier takes its place (revision 0025)
    qi := qnext[{x}];
    nt[{x}] := qp_t[qi];
    ndef[{x}] := qp_def[qi];
    nq[{x}] := qp_q[qi];
    nxpos[{x}] := qp_pos[qi];
    qn := qp_n[qi];
    IF qn > 0 THEN
        n_id[off + 1 : off + qn] := qj_id[qp_off[qi] + 1 : qp_off[qi] + qn];
        n_cost[off + 1 : off + qn] := qj_cost[qp_off[qi] + 1 : qp_off[qi] + qn];
        n_run[off + 1 : off + qn] := qj_run[qp_off[qi] + 1 : qp_off[qi] + qn];
    END IF;
    nn[{x}] := qn;
    ndone[{x}] := qp_done[qi];
    qnext[{x}] := CASE WHEN qi < cardinality(qp_t) AND qp_ord[qi + 1] = {x}
                       THEN qi + 1 ELSE 0 END;
END IF;
"""

_RELOADED = "nt[b] := NULL;  -- its deficit may have changed: the round is loaded again\n"
_SKIP_RELOAD = " " * 20 + _RELOADED
_SKIP_RELOAD_ALL = (
    _SKIP_RELOAD + " " * 20 + "qnext[b] := 0;  -- and the pairs queued after it (revision 0025)\n"
)


def _indented(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


def _replace(body: str, anchor: str, replacement: str) -> str:
    return replace_anchor(body, anchor, replacement, what="revision 0025: drr_dispatch")


def _revision_0023() -> ModuleType:
    return revision_module(Path(__file__).with_name("0023_waiting_pair_order.py"))


def _revision_0017() -> ModuleType:
    return revision_module(Path(__file__).with_name("0017_claim_counts.py"))


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body: str = _revision_0023().dispatch()
    for anchor, replacement in (
        (_DECLARED, _DECLARATIONS),
        (_SHARE, _SHARE_ACTIVE),
        (_LIMIT_2, _LIMIT_DEPTH),
        (_TIERS, _TIERS_APART),
        (_SECOND_PAIR_BRANCH, _SECOND_PAIR_BRANCH_RANKED),
        (_SECOND_PAIR_END, _QUEUED_PAIR),
        (_SKIP_RELOAD, _SKIP_RELOAD_ALL),
    ):
        body = _replace(body, anchor, replacement)
    # the two promotions of the pair after the head (revision 0020's, in the eligibility check
    # and in a tier's dispatch): the next queued pair moves up behind it
    for x, spaces in (("i", 24), ("b", 20)):
        anchor = " " * spaces + f"nt[{x}] := NULL;\n" + " " * (spaces - 4) + "ELS"
        refill = _indented(_REFILL.format(x=x), spaces) + " " * (spaces - 4) + "ELS"
        body = _replace(body, anchor, refill)
    return body


def upgrade() -> None:
    op.execute(dispatch())
    for statement in _revision_0017().dispatch_settings():  # CREATE OR REPLACE dropped them
        op.execute(statement)


def downgrade() -> None:
    op.execute(_revision_0023().dispatch())
    for statement in _revision_0017().dispatch_settings():
        op.execute(statement)
