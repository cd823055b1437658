"""Turns that end without serving are taken in memory, over the round's next pairs read at once.

When a tenant's next job costs far more than its quantum (quanta of 0.001–1 against costs of
1,000–1,000,000 cost units), every pair of a round needs about cost ÷ quantum turns before it
can pay, and most turns end without serving: the pair gets its quantum, cannot pay, and moves
to the tail of the round. Revision 0022 skips whole rounds once a dispatch has taken 64 such
turns, but each of those 64 turns loaded the next round head with a statement of its own, and
wrote the ended turn's move (a non-HOT update of ``pgqueue.deficits``); the next head load's
``ORDER BY pos LIMIT 1`` then walked the index entries of every version written before it in
the same transaction, so a claim was quadratic in its turns. A claim of 100 over 30 tenants of
such quanta and costs ran 7,980 statements in 4.9–9.8 s (docs/bench.md).

Now, from the fourth turn of a dispatch that ends without serving, after a round skip, and from
the first where the tier's last such run in the claim took turns, ``drr_dispatch`` reads the round's next pairs in one statement (their deficits, positions,
quanta, each pair's next due job, locked, and for a pair that can pay the jobs a head load
would buffer for it) and takes their turns in memory with the same
arithmetic as the loop: the round counter where a pair's position passes the round's end,
one quantum added (``deficit + quantum``, the same floating-point operation), the comparison
with the job's cost, and the move to the tail noted for the next write. It hands back to the
loop at the first pair that can pay, that has nothing due, or whose turn would reach the skip;
the loop then takes that turn as before. When one read holds the whole round, the pairs come round again in memory.
The first read takes as many pairs as the tier's last run in memory took turns, plus one, or
half the size of the last first read if that is more (at least two), each further read twice
as many, at most 256 and never
more than the turns left before the skip. (Reads sized by the turns the claim had taken before
locked and read dozens of pairs where the third pair of every dispatch pays: 1.3–1.7× the time
of revision 0027 in such rounds; a run from the third turn, handing back a pair that pays with
one job buffered, cost a statement more per dispatch where every second pair pays. Both found
by fresh testers. Where the third or fourth pair of a dispatch pays, the claim now runs the
statements of revision 0027.)

The head loads of a dispatch and this read start at the position of the last pair whose turn
ended (``pos > lo_pos``): every pair still in the round lies after it, and the versions written
before it are not walked again.

What a claim decides is unchanged: the same jobs in the same order, the same deficits,
positions, rounds and turn (checked against the reference and against revision 0027 on the
same operations, ``tests/db/test_idle_turns.py``).

``drr_dispatch`` is revision 0027's, edited here, not copied.

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import replace_anchor, revision_module

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

_DECLARE = """\
    qi integer;
    qn integer;
BEGIN
"""
_DECLARE_WINDOW = """\
    qi integer;
    qn integer;
    -- the round's next pairs, read at once to take in memory the turns that end without
    -- serving (revision 0028): tenant, deficit, quantum, pos, next due job (locked; NULL: none);
    -- w_rot: the pair's entry in rot_* once its turn ended here (0: none yet)
    w_t text[];
    w_def double precision[];
    w_q double precision[];
    w_pos bigint[];
    w_id bigint[];
    w_cost double precision[];
    w_run timestamptz[];
    w_rot integer[];
    -- a pair that can pay: its jobs as a head load reads them (w_pn of them, from w_poff + 1
    -- in wj_*; w_plim: the head load's limit)
    w_pn integer[];
    w_plim integer[];
    w_poff integer[];
    wj_id bigint[];
    wj_cost double precision[];
    wj_run timestamptz[];
    wr record;
    w_lim integer;
    w_size integer;                      -- pairs to read next: doubles at each read
    w_turns integer;                     -- turns taken in memory since the first read
    -- per tier, the pairs the first read takes: the turns the tier's last run in memory took,
    -- plus one, or half the last size if more (1: no run yet, or runs of no turns)
    w_first integer[] := '{1,1,1}';
    wn integer;
    wi integer;
    w_all boolean;                       -- the read holds the whole round
    w_out boolean;                       -- the loop takes the next turn
    w_def2 double precision;
    -- per tier, the position of the last pair whose turn ended: every pair still in the round
    -- lies after it (revision 0028)
    lo_pos bigint[] := '{-9223372036854775808,-9223372036854775808,-9223372036854775808}';
BEGIN
"""

_DISPATCH_START = """\
            served := false;
            idle := 0;
            idle_limit := 64;
            LOOP
                IF ht[b] IS NULL AND nt[b] IS NOT NULL THEN
"""
_DISPATCH_START_WINDOW = """\
            served := false;
            idle := 0;
            idle_limit := 64;
            LOOP
                -- From the fourth turn of this dispatch that ended without serving, after a
                -- round skip, and at once where the tier's last run in memory took turns, the
                -- turns that end so are taken in memory (revision 0028), with the loop's
                -- arithmetic, over the round's next pairs read at once; the loop takes the turn
                -- of the first pair that can pay, has nothing due, or whose turn would reach
                -- the skip.
                IF idle < 3 AND idle_limit = 64 AND w_first[b] = 1 THEN
                    NULL;  -- (the usual case, decided with one expression)
                ELSIF ht[b] IS NULL AND nt[b] IS NULL AND turn[b] IS NULL
                      AND idle + 1 < idle_limit THEN
                    w_out := false;
                    w_size := greatest(w_first[b], 2);
                    w_turns := 0;
                    LOOP
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
                        -- the turns left before the skip, and the pair after them
                        w_lim := least(w_size, idle_limit - idle);  -- (w_size <= 256)
                        w_size := least(w_size * 2, 256);
                        w_t := '{}';
                        w_def := '{}';
                        w_q := '{}';
                        w_pos := '{}';
                        w_id := '{}';
                        w_cost := '{}';
                        w_run := '{}';
                        w_pn := '{}';
                        w_plim := '{}';
                        w_poff := '{}';
                        wj_id := '{}';
                        wj_cost := '{}';
                        wj_run := '{}';
                        FOR wr IN
                        WITH rotated AS (
                            UPDATE pgqueue.deficits d SET deficit = u.deficit, pos = u.pos
                            FROM unnest(rt, rdef, rpos) AS u(tenant_id, deficit, pos)
                            WHERE d.tenant_id = u.tenant_id AND d.tier = tr
                            RETURNING d.tenant_id, d.deficit, d.pos
                        ), win AS (
                            SELECT h.tenant_id, h.deficit, h.pos
                            FROM ((SELECT d.tenant_id, d.deficit, d.pos FROM pgqueue.deficits d
                                   WHERE d.tier = tr AND d.pos > lo_pos[b]
                                     AND d.tenant_id <> ALL (rt)
                                   ORDER BY d.pos
                                   LIMIT w_lim)
                                  UNION ALL
                                  SELECT r.tenant_id, r.deficit, r.pos FROM rotated r) h
                            ORDER BY h.pos
                            LIMIT w_lim
                        )
                            SELECT w.tenant_id, w.deficit, q.quantum, w.pos, f.id, f.cost,
                                   f.run_at, pl.lim, pj.ids, pj.costs, pj.runs
                            FROM win w
                            LEFT JOIN LATERAL (
                                SELECT tq.plan, tq.quantum FROM pgqueue.tenants tq
                                WHERE tq.tenant_id = w.tenant_id
                                OFFSET 0) tn ON true
                            CROSS JOIN LATERAL (
                                SELECT pgqueue.plan_quantum(tn.plan, tn.quantum, base) AS quantum) q
                            LEFT JOIN LATERAL (
                                SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                                WHERE j.tenant_id = w.tenant_id AND j.priority = tr
                                  AND j.state = 'queued' AND j.run_at <= now()
                                  AND (j.tenant_id, j.priority, j.run_at, j.id)
                                      > (w.tenant_id, tr, '-infinity'::timestamptz,
                                         -9223372036854775808)
                                  AND j.id <> ALL (picked)
                                ORDER BY j.tenant_id, j.priority, j.run_at, j.id
                                LIMIT 1
                                FOR UPDATE SKIP LOCKED) f ON true
                            CROSS JOIN LATERAL (  -- as a head load: at most floor(credit) jobs
                                SELECT least((max_jobs - taken)::double precision,
                                             floor(w.deficit + q.quantum))::integer + 1 AS lim) pl
                            -- a pair that can pay gets the jobs a head load would give it
                            CROSS JOIN LATERAL (
                                SELECT array_agg(y.id) AS ids,
                                       array_agg(y.cost) AS costs,
                                       array_agg(y.run_at) AS runs
                                FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                                      WHERE f.cost <= w.deficit + q.quantum
                                        AND j.tenant_id = w.tenant_id AND j.priority = tr
                                        AND j.state = 'queued' AND j.run_at <= now()
                                        AND (j.tenant_id, j.priority, j.run_at, j.id)
                                            > (w.tenant_id, tr, '-infinity'::timestamptz,
                                               -9223372036854775808)
                                        AND j.id <> ALL (picked)
                                      ORDER BY j.tenant_id, j.priority, j.run_at, j.id
                                      LIMIT pl.lim
                                      FOR UPDATE SKIP LOCKED) y) pj
                            ORDER BY w.pos
                        LOOP
                            w_t := w_t || wr.tenant_id;
                            w_def := w_def || wr.deficit;
                            w_q := w_q || wr.quantum;
                            w_pos := w_pos || wr.pos;
                            w_id := w_id || wr.id;
                            w_cost := w_cost || wr.cost;
                            w_run := w_run || wr.run_at;
                            w_plim := w_plim || wr.lim;
                            w_poff := w_poff || cardinality(wj_id);
                            w_pn := w_pn || coalesce(cardinality(wr.ids), 0);
                            IF wr.ids IS NOT NULL THEN
                                wj_id := wj_id || wr.ids;
                                wj_cost := wj_cost || wr.costs;
                                wj_run := wj_run || wr.runs;
                            END IF;
                        END LOOP;
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
                        wn := coalesce(cardinality(w_t), 0);
                        EXIT WHEN wn = 0;  -- an empty round: the loop finds no head either
                        w_all := wn < w_lim;
                        w_rot := array_fill(0, ARRAY[wn]);
                        wi := 1;
                        WHILE wi <= cardinality(w_t) LOOP
                            IF w_cost[wi] IS NULL OR w_cost[wi] <= w_def[wi] + w_q[wi]
                               OR idle + 1 >= idle_limit THEN
                                -- the loop takes this turn: the pair is the round head (a pair
                                -- whose move is still to write, the loop loads again, after it)
                                IF w_rot[wi] = 0 THEN
                                    ht[b] := w_t[wi];
                                    hdef[b] := w_def[wi];
                                    hq[b] := w_q[wi];
                                    hpos[b] := w_pos[wi];
                                    hdirty[b] := false;
                                    bt[b] := w_t[wi];
                                    bat[b] := 1;
                                    IF w_cost[wi] IS NULL THEN
                                        bn[b] := 0;
                                        bdone[b] := true;
                                    ELSIF w_pn[wi] > 0 THEN  -- it can pay: a head load's jobs
                                        n := w_pn[wi];
                                        b_id[off + 1 : off + n] :=
                                            wj_id[w_poff[wi] + 1 : w_poff[wi] + n];
                                        b_cost[off + 1 : off + n] :=
                                            wj_cost[w_poff[wi] + 1 : w_poff[wi] + n];
                                        b_run[off + 1 : off + n] :=
                                            wj_run[w_poff[wi] + 1 : w_poff[wi] + n];
                                        bn[b] := n;
                                        bdone[b] := n < w_plim[wi];
                                    ELSE
                                        b_id[off + 1] := w_id[wi];
                                        b_cost[off + 1] := w_cost[wi];
                                        b_run[off + 1] := w_run[wi];
                                        bn[b] := 1;
                                        bdone[b] := false;
                                    END IF;
                                END IF;
                                w_out := true;
                                EXIT;
                            END IF;
                            -- its turn begins (one quantum) and ends without serving: the
                            -- deficit carries over and the pair moves to the tail of the round
                            IF w_pos[wi] > rend[b] THEN
                                rnd[b] := rnd[b] + 1;
                                rend[b] := npos[b] - 1;
                            END IF;
                            w_def2 := w_def[wi] + w_q[wi];
                            IF w_rot[wi] = 0 THEN
                                rot_ts := rot_ts || w_t[wi];
                                rot_tiers := rot_tiers || tr;
                                rot_defs := rot_defs || w_def2;
                                rot_poss := rot_poss || npos[b];
                                k := cardinality(rot_ts);
                            ELSE
                                k := w_rot[wi];
                                rot_defs[k] := w_def2;
                                rot_poss[k] := npos[b];
                            END IF;
                            lo_pos[b] := w_pos[wi];
                            IF w_all THEN  -- the whole round is here: the pair comes round again
                                w_t := w_t || w_t[wi];
                                w_def := w_def || w_def2;
                                w_q := w_q || w_q[wi];
                                w_pos := w_pos || npos[b];
                                w_id := w_id || w_id[wi];
                                w_cost := w_cost || w_cost[wi];
                                w_run := w_run || w_run[wi];
                                w_rot := w_rot || k;
                            END IF;
                            npos[b] := npos[b] + 1;
                            idle := idle + 1;
                            w_turns := w_turns + 1;
                            wi := wi + 1;
                        END LOOP;
                        EXIT WHEN w_out;  -- else the pairs read are used up: read the next ones
                    END LOOP;
                    -- (halved per run at most: runs of few turns between long ones)
                    w_first[b] := least(greatest(w_turns + 1, w_first[b] / 2), 256);
                END IF;
                IF ht[b] IS NULL AND nt[b] IS NOT NULL THEN
"""

_ROUND_HEAD = """\
                        FROM ((SELECT d.tenant_id, d.deficit, d.pos FROM pgqueue.deficits d
                               WHERE d.tier = tr AND d.pos IS NOT NULL
                                 AND d.tenant_id <> ALL (rt)
"""
_ROUND_HEAD_AFTER = """\
                        FROM ((SELECT d.tenant_id, d.deficit, d.pos FROM pgqueue.deficits d
                               -- after the last pair whose turn ended (revision 0028)
                               WHERE d.tier = tr AND d.pos > lo_pos[b]
                                 AND d.tenant_id <> ALL (rt)
"""

_TURN_END = """\
                rot_poss := rot_poss || npos[b];
                npos[b] := npos[b] + 1;
"""
_TURN_END_NOTED = """\
                rot_poss := rot_poss || npos[b];
                lo_pos[b] := hpos[b];
                npos[b] := npos[b] + 1;
"""


def _revision_0027() -> ModuleType:
    return revision_module(Path(__file__).with_name("0027_tenant_lookup_per_pair.py"))


def _revision_0017() -> ModuleType:
    return revision_module(Path(__file__).with_name("0017_claim_counts.py"))


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body: str = _revision_0027().dispatch()
    for anchor, replacement in (
        (_DECLARE, _DECLARE_WINDOW),
        (_ROUND_HEAD, _ROUND_HEAD_AFTER),
        (_TURN_END, _TURN_END_NOTED),
        (_DISPATCH_START, _DISPATCH_START_WINDOW),
    ):
        body = replace_anchor(body, anchor, replacement, what="revision 0028: drr_dispatch")
    return body


def upgrade() -> None:
    op.execute(dispatch())
    for statement in _revision_0017().dispatch_settings():  # CREATE OR REPLACE dropped them
        op.execute(statement)


def downgrade() -> None:
    op.execute(_revision_0027().dispatch())
    for statement in _revision_0017().dispatch_settings():
        op.execute(statement)
