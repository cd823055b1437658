"""A claim loads every tier's round head, and the pair after it, in one statement.

Each claim of ``drr_dispatch`` began with one round-head load per tier (the head, its quantum
and its next due jobs, locked), and ran the same statement again each time a turn ended, to
move that pair to the tail of the round and load the next head. A claim of 10 no-op jobs on the
benchmark's queue (three tiers, 10 tenants, quantum 5) ran it six times, at ~150 µs of server
CPU each, most of it the executor's set-up of a statement with four lateral subqueries.

Now the first load of a claim reads, for every tier whose round has members, the head and,
when the head's credit cannot fill the claim, the pair after it, each with its next due jobs,
in one statement. When a turn ends, its pair's move to the tail is only noted: the pair after
it, already loaded, becomes the head with no statement. The moves are written by the batch
write at the end of the claim, or by the next load of that round's head (which runs, as before,
once the loaded pairs are used up, and writes the tier's noted moves first). The dispatch order
is unchanged: the same pairs, deficits and jobs, decided by the same steps.

``drr_dispatch`` is revision 0018's, edited here, not copied.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

from pathlib import Path
import re
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import replace_anchor, revision_module

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# ------------------------------------------------------------------ declarations
_OLD_DECLARATIONS = """\
    rot_t text;                          -- a pair to move to the tail: tenant, deficit, pos
    rot_def double precision;
    rot_pos bigint;
"""
_NEW_DECLARATIONS = """\
    ld record;                           -- a row of the claim's first load (revision 0020)
    ri integer;
    got_head boolean;
    inbox_folded boolean;                -- this pass folded the inbox in (revision 0020)
    share integer[] := '{0,0,0}';        -- per tier, its likely part of the claim (0020)
    -- the pair after the round head, loaded with it by the claim's first load (revision 0020):
    -- tenant, deficit, quantum, pos, and its next due jobs, locked, in buffer slots laid out
    -- like the head's (nn[i] of them; ndone[i]: nothing due after them). It becomes the head
    -- when the head's turn ends or the head leaves the round.
    nt text[] := '{NULL,NULL,NULL}';
    ndef double precision[] := '{0,0,0}';
    nq double precision[] := '{0,0,0}';
    nxpos bigint[] := '{0,0,0}';
    nn integer[] := '{0,0,0}';
    ndone boolean[] := '{f,f,f}';
    n_id bigint[] := array_fill(NULL::bigint, ARRAY[3 * stride]);
    n_cost double precision[] := array_fill(NULL::double precision, ARRAY[3 * stride]);
    n_run timestamptz[] := array_fill(NULL::timestamptz, ARRAY[3 * stride]);
    -- turns that ended, their pairs not yet moved to the tail of the round in pgqueue.deficits
    -- (the next load of that round's head does it, else the batch write): tenant, tier, the
    -- deficit carried over, the new pos; rt/rdef/rpos: those of the tier at hand
    rot_ts text[] := '{}';
    rot_tiers pgqueue.tier[] := '{}';
    rot_defs double precision[] := '{}';
    rot_poss bigint[] := '{}';
    rt text[];
    rtr pgqueue.tier[];
    rdef double precision[];
    rpos bigint[];
"""

# ------------------------------------------------------------------ the claim's first load
_AFTER_FOLD = "        recheck := '{t,t,t}';\n"
_FIRST_LOAD = """\
        -- The round head of every tier that has one, and the pair after it when the head's
        -- credit cannot fill the claim, each with its next due jobs, locked, in one statement
        -- (revision 0020): the per-tier loads below run only once these are used up. It also
        -- says, per tier, whether the round has members and whether due pairs wait. After a
        -- fold (new work came in: an idle worker's claim, usually of a few jobs) the per-tier
        -- loads do it all, as before: cheaper there.
        IF NOT inbox_folded THEN
            -- A tier's likely part of the claim: under the weighted policy its share of the
            -- weights, else all of it; the pair after the head is loaded when the head's credit
            -- cannot cover that part (loading it costs about what a later load of it would).
            total := weight[1] + weight[2] + weight[3];
            FOR ri IN 1 .. 3 LOOP
                share[ri] := CASE WHEN policy IN ('strict', 'probabilistic') OR total <= 0
                                  THEN max_jobs
                                  ELSE ceil(max_jobs * weight[ri] / total)::integer END;
            END LOOP;
            FOR ld IN
                SELECT p.ord, p.rank, p.absorb, p.tenant_id, p.deficit, p.pos, p.quantum,
                       p.lim, f.ids, f.costs, f.runs
                FROM (SELECT rr.ord, rr.tier, rr.absorb, rr.rank, rr.tenant_id, rr.deficit,
                             rr.pos, rr.quantum,
                             -- at most floor(credit) jobs (cost >= 1) fit in its turn, and the
                             -- head's credit comes first
                             least((max_jobs - taken)::double precision - rr.ahead,
                                   rr.cap)::integer + 1 AS lim,
                             rr.ahead
                      FROM (SELECT tt.ord, tt.tier, tt.absorb, c.tenant_id, c.deficit, c.pos,
                                   c.quantum, c.cap, row_number() OVER w AS rank,
                                   sum(c.cap) OVER w - c.cap AS ahead
                            FROM (SELECT u.tier, u.ord,
                                         EXISTS (SELECT 1 FROM pgqueue.deficits d
                                                 WHERE d.tier = u.tier AND d.pos IS NULL
                                                   AND d.due_at <= now()) AS absorb
                                  FROM unnest(tiers) WITH ORDINALITY AS u(tier, ord)
                                  WHERE ht[u.ord] IS NULL AND nt[u.ord] IS NULL) tt
                            LEFT JOIN LATERAL (
                                SELECT h.tenant_id, h.deficit, h.pos, q.quantum,
                                       floor(h.deficit
                                             + CASE WHEN h.tenant_id = turn[tt.ord] THEN 0
                                                    ELSE q.quantum END) AS cap
                                FROM (SELECT d.tenant_id, d.deficit, d.pos
                                      FROM pgqueue.deficits d
                                      WHERE d.tier = tt.tier AND d.pos IS NOT NULL
                                      ORDER BY d.pos
                                      LIMIT 2) h
                                LEFT JOIN pgqueue.tenants tn ON tn.tenant_id = h.tenant_id
                                CROSS JOIN LATERAL (
                                    SELECT pgqueue.plan_quantum(tn.plan, tn.quantum, base)
                                           AS quantum) q) c ON true
                            WINDOW w AS (PARTITION BY tt.ord ORDER BY c.pos)) rr
                      WHERE rr.rank = 1 OR rr.ahead < least(max_jobs - taken, share[rr.ord])) p
                CROSS JOIN LATERAL (
                    SELECT array_agg(y.id ORDER BY y.run_at, y.id) AS ids,
                           array_agg(y.cost ORDER BY y.run_at, y.id) AS costs,
                           array_agg(y.run_at ORDER BY y.run_at, y.id) AS runs
                    FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                          WHERE j.tenant_id = p.tenant_id AND j.priority = p.tier
                            AND j.state = 'queued' AND j.run_at <= now()
                            AND (j.tenant_id, j.priority, j.run_at, j.id)
                                > (p.tenant_id, p.tier, '-infinity'::timestamptz,
                                   -9223372036854775808)
                            AND j.id <> ALL (picked)
                          ORDER BY j.tenant_id, j.priority, j.run_at, j.id
                          LIMIT p.lim
                          FOR UPDATE SKIP LOCKED) y) f
                ORDER BY p.ord, p.rank
            LOOP
                i := ld.ord;
                absorb[i] := ld.absorb;
                filled[i] := ld.tenant_id IS NOT NULL;
                CONTINUE WHEN ld.tenant_id IS NULL;
                off := (i - 1) * stride;
                n := coalesce(array_length(ld.ids, 1), 0);
                IF ld.rank = 1 THEN
                    ht[i] := ld.tenant_id;
                    hdef[i] := ld.deficit;
                    hq[i] := ld.quantum;
                    hpos[i] := ld.pos;
                    hdirty[i] := false;
                    IF n > 0 THEN
                        b_id[off + 1 : off + n] := ld.ids;
                        b_cost[off + 1 : off + n] := ld.costs;
                        b_run[off + 1 : off + n] := ld.runs;
                    END IF;
                    bt[i] := ld.tenant_id;
                    bn[i] := n;
                    bat[i] := 1;
                    bdone[i] := n < ld.lim;
                ELSE
                    nt[i] := ld.tenant_id;
                    ndef[i] := ld.deficit;
                    nq[i] := ld.quantum;
                    nxpos[i] := ld.pos;
                    IF n > 0 THEN
                        n_id[off + 1 : off + n] := ld.ids;
                        n_cost[off + 1 : off + n] := ld.costs;
                        n_run[off + 1 : off + n] := ld.runs;
                    END IF;
                    nn[i] := n;
                    ndone[i] := n < ld.lim;
                END IF;
            END LOOP;
        END IF;
"""

# ------------------------------------------------------------------ the fold, when needed
_FOLD_START = (
    "        -- One statement (revision 0014): fold the inbox in, then per tier whether due pairs"
    " wait\n"
)
_FOLD_END = "        FROM unnest(tiers) WITH ORDINALITY AS t(tier, ord);\n"
_FOLD_GATE = """\
        -- With the inbox empty and no move to write (a claim's usual case while no new work
        -- comes in), the first load below finds out both instead (revision 0020).
        inbox_folded := cardinality(rot_ts) > 0 OR EXISTS (SELECT 1 FROM pgqueue.drr_inbox);
        IF inbox_folded THEN
"""

# ------------------------------------------------------------------ the two head loads
_HEAD_LOAD_A = "                    IF ht[i] IS NULL AND filled[i] THEN\n"
_HEAD_LOAD_B = "                IF ht[b] IS NULL THEN\n"

_PROMOTE = """\
IF ht[{x}] IS NULL AND nt[{x}] IS NOT NULL THEN
    -- the pair after the head, loaded with it (revision 0020), is the head now
    ht[{x}] := nt[{x}];
    hdef[{x}] := ndef[{x}];
    hq[{x}] := nq[{x}];
    hpos[{x}] := nxpos[{x}];
    hdirty[{x}] := false;
    n := nn[{x}];
    IF n > 0 THEN
        b_id[off + 1 : off + n] := n_id[off + 1 : off + n];
        b_cost[off + 1 : off + n] := n_cost[off + 1 : off + n];
        b_run[off + 1 : off + n] := n_run[off + 1 : off + n];
    END IF;
    bt[{x}] := nt[{x}];
    bn[{x}] := n;
    bat[{x}] := 1;
    bdone[{x}] := ndone[{x}];
    nt[{x}] := NULL;
ELS{condition}
{pending}"""

#: The tier's noted moves to the tail, gathered for the statement that writes them (rt, rdef,
#: rpos); after it, :data:`WRITTEN` drops them from the notes. (Revision 0022 reuses both.)
PENDING = """\
-- the tier's turns that ended, to write first
rt := '{}';
rdef := '{}';
rpos := '{}';
FOR ri IN 1 .. cardinality(rot_ts) LOOP
    IF rot_tiers[ri] = tr THEN
        rt := rt || rot_ts[ri];
        rdef := rdef || rot_defs[ri];
        rpos := rpos || rot_poss[ri];
    END IF;
END LOOP;
"""

WRITTEN = """\
IF cardinality(rt) > 0 THEN  -- written: keep the other tiers' moves only
    rt := '{}';
    rtr := '{}';
    rdef := '{}';
    rpos := '{}';
    FOR ri IN 1 .. cardinality(rot_ts) LOOP
        IF rot_tiers[ri] <> tr THEN
            rt := rt || rot_ts[ri];
            rtr := rtr || rot_tiers[ri];
            rdef := rdef || rot_defs[ri];
            rpos := rpos || rot_poss[ri];
        END IF;
    END LOOP;
    rot_ts := rt;
    rot_tiers := rtr;
    rot_defs := rdef;
    rot_poss := rpos;
END IF;
"""

_ROTATE_OLD = (
    "UPDATE pgqueue.deficits d SET deficit = rot_def, pos = rot_pos\n"
    "{i}WHERE d.tenant_id = rot_t AND d.tier = tr\n"
)
_ROTATE_NEW = (
    "UPDATE pgqueue.deficits d SET deficit = u.deficit, pos = u.pos\n"
    "{i}FROM unnest(rt, rdef, rpos) AS u(tenant_id, deficit, pos)\n"
    "{i}WHERE d.tenant_id = u.tenant_id AND d.tier = tr\n"
)
_NOT_ROTATED_OLD = "AND d.tenant_id IS DISTINCT FROM rot_t\n"
_NOT_ROTATED_NEW = "AND d.tenant_id <> ALL (rt)\n"
_ROT_CLEARED = "rot_t := NULL;\n"
# (the moves' bookkeeping runs FOR loops, which set FOUND: the load's FOUND is kept first)
_FOUND_USES = ("IF FOUND THEN\n", "EXIT WHEN NOT FOUND;\n")
_FOUND_KEPT = ("IF got_head THEN\n", "EXIT WHEN NOT got_head;\n")

# ------------------------------------------------------------------ a turn ends
_TURN_ENDS_OLD = """\
                rot_t := t;
                rot_def := hdef[b];
                rot_pos := npos[b];
"""
_TURN_ENDS_NEW = """\
                rot_ts := rot_ts || t;
                rot_tiers := rot_tiers || tr;
                rot_defs := rot_defs || hdef[b];
                rot_poss := rot_poss || npos[b];
"""
_TURN_ENDS_COMMENT_OLD = (
    "                -- (written by the next load of the round head, just below)\n"
)
_TURN_ENDS_COMMENT_NEW = (
    "                -- (noted: written by the next load of this round's head, else by the\n"
    "                -- batch write; the pair after it, if loaded, is the head now)\n"
)

# ------------------------------------------------------------------ the batch write
_FLUSHED_OLD = """\
        UPDATE pgqueue.deficits d SET deficit = u.deficit
        FROM unnest(ht, tiers, hdef, hdirty) AS u(tenant_id, tier, deficit, dirty)
"""
_FLUSHED_NEW = """\
        -- and the pairs whose turns ended, to the tail of their rounds (revision 0020)
        UPDATE pgqueue.deficits d SET deficit = u.deficit, pos = coalesce(u.pos, d.pos)
        FROM unnest(ht || rot_ts, tiers || rot_tiers, hdef || rot_defs,
                    hdirty || array_fill(true, ARRAY[cardinality(rot_ts)]),
                    '{NULL,NULL,NULL}'::bigint[] || rot_poss)
             AS u(tenant_id, tier, deficit, dirty, pos)
"""


#: ``array_agg(y.id ORDER BY y.run_at, y.id)`` sorted each aggregate's input again, three sorts
#: per buffer fetch: the rows come from a subquery that returns them in that order already
#: (``ORDER BY … LIMIT … FOR UPDATE``), and an aggregate reads its input in order.
_SORTED_AGG = re.compile(r"array_agg\((\w)\.(id|cost|run_at) ORDER BY \1\.run_at, \1\.id\)")
_SORTED_AGGS = 15  # three per buffer fetch: the first load, two head loads, two refills


def indented(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


def _replace(body: str, anchor: str, replacement: str, times: int = 1) -> str:
    return replace_anchor(
        body, anchor, replacement, what="revision 0020: drr_dispatch", times=times
    )


def _revision_0018() -> ModuleType:
    return revision_module(Path(__file__).with_name("0018_wake_path.py"))


def _revision_0017() -> ModuleType:
    return revision_module(Path(__file__).with_name("0017_claim_counts.py"))


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body: str = _revision_0018().dispatch()
    body = _replace(body, _OLD_DECLARATIONS, _NEW_DECLARATIONS)
    start = body.index(_FOLD_START)
    end = body.index(_FOLD_END, start) + len(_FOLD_END)
    fold = indented(body[start:end], 4)
    body = body[:start] + _FOLD_GATE + fold + "        END IF;\n" + body[end:]
    body = _replace(body, _AFTER_FOLD, _AFTER_FOLD + _FIRST_LOAD)
    for anchor, x, spaces in ((_HEAD_LOAD_A, "i", 20), (_HEAD_LOAD_B, "b", 16)):
        condition = anchor.strip()
        promote = _PROMOTE.format(x=x, condition=condition, pending=indented(PENDING, 4))
        body = _replace(body, anchor, indented(promote, spaces))
        inner = " " * (spaces + 8)
        body = _replace(body, _ROTATE_OLD.format(i=inner), _ROTATE_NEW.format(i=inner))
        pad = " " * (spaces + 4)
        use, kept = _FOUND_USES[x == "b"], _FOUND_KEPT[x == "b"]
        body = _replace(
            body,
            pad + _ROT_CLEARED + pad + use,
            pad + "got_head := FOUND;\n" + indented(WRITTEN, spaces + 4) + pad + kept,
        )
    body = _replace(body, _NOT_ROTATED_OLD, _NOT_ROTATED_NEW, times=2)
    body = _replace(body, _TURN_ENDS_OLD, _TURN_ENDS_NEW)
    body = _replace(body, _TURN_ENDS_COMMENT_OLD, _TURN_ENDS_COMMENT_NEW)
    body = _replace(body, _FLUSHED_OLD, _FLUSHED_NEW)
    body, count = _SORTED_AGG.subn(r"array_agg(\1.\2)", body)
    if count != _SORTED_AGGS:
        raise RuntimeError(f"revision 0020: {count} sorted aggregates, not {_SORTED_AGGS}")
    if "rot_t" in body.replace("rot_ts", "").replace("rot_tiers", ""):
        raise RuntimeError("revision 0020: drr_dispatch still names rot_t")
    return body


def upgrade() -> None:
    op.execute(dispatch())
    for statement in _revision_0017().dispatch_settings():  # CREATE OR REPLACE dropped them
        op.execute(statement)


def downgrade() -> None:
    op.execute(_revision_0018().dispatch())
    for statement in _revision_0017().dispatch_settings():
        op.execute(statement)
