"""A claim passes over the jobs of a model the provider's limits stop, to the other jobs due.

``pgqueue.claim_admitted`` checks the provider's rate limiter on the jobs ``drr_dispatch``
picked, in dispatch order. At the first job the limiter cannot admit it undid the dispatch and
took only the jobs before that one, so when the first job was stopped the claim came back
empty. One model in cooldown (a 429 on it) therefore stopped every claim of every worker for
the cooldown's length, for every tenant, model and kind, ``pgqueue.noop`` jobs included, while
``pgqueue.claim_order`` showed them next: against "no claim comes back empty while any
eligible job exists" (found by a fresh tester: a cooldown of 120 s on one model left the jobs
of another model and no-op jobs queued).

Now the claim sets that job's model aside and dispatches again. ``drr_dispatch`` passes over
the queued jobs of the models (and tenants) named in the transaction's
``pgqueue.claim_skip_models`` and ``pgqueue.claim_skip_tenants`` settings (``text[]``
literals; ``claim_admitted`` sets them and clears them before it returns) as it passes over
jobs that other transactions hold: a pair with nothing else due leaves the round, to be looked
at again a second later. When the limiter stops a later job, the jobs before it are dispatched
again and taken as before, then the rest of the claim with that model set aside. Every other
model in cooldown (after a 429) goes aside with the first. A tenant stopped a second time in
a claim goes aside too: its next job waits for its next turn. The claim still ends with one
row carrying ``blocked_seconds`` (the shortest wait of the models it set aside) when it took
fewer jobs than asked.

A dispatch with models set aside that takes nothing is undone: when every due job waits for
the same model (one model in use, the usual case), a claim leaves the round as it was, as it
did before. Each stop costs a claim at most two dispatches, and no tenant stops a claim more
than twice, however many models its jobs name (found by fresh testers: my first bound of eight
dispatches, one model set aside each, left every claim empty with eight models in cooldown
ahead in the round; a bound of 64 did with one tenant's jobs on 70 models whose buckets were
spent).

``pgqueue.claim_order`` still shows the order without the limiter. ``drr_dispatch`` is
revision 0028's text, edited here, not copied; ``claim_admitted`` is new text (revision
0016's comes back on downgrade).

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import replace_anchor, revision_module

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

_WHAT = "revision 0030: drr_dispatch"
_DECLARE = """\
    last_at timestamptz := '-infinity';
"""
_DECLARE_ASIDE = """\
    last_at timestamptz := '-infinity';
    -- models whose queued jobs this dispatch passes over: the provider's limits stop them
    -- (set by pgqueue.claim_admitted; revision 0030)
    aside constant text[] := coalesce(nullif(current_setting('pgqueue.claim_skip_models', true),
                                             ''), '{}')::text[];
    -- and the tenants whose job the limiter stopped, all of whose jobs it passes over
    aside_tenants constant text[] := coalesce(
        nullif(current_setting('pgqueue.claim_skip_tenants', true), ''), '{}')::text[];
"""
# Every statement that looks for due jobs (the nine of them) reads only jobs it may send.
_DUE = "j.state = 'queued' AND j.run_at <= now()"
_DUE_SENDABLE = (
    "j.state = 'queued' AND j.run_at <= now()"
    " AND pgqueue.job_sendable(j.tenant_id, j.kind, j.model, aside_tenants, aside)"
)
_DUE_STATEMENTS = 9

SENDABLE = """\
CREATE OR REPLACE FUNCTION pgqueue.job_sendable(tenant_id text, kind text, model text,
                                                aside_tenants text[], aside text[])
RETURNS boolean
LANGUAGE sql
IMMUTABLE PARALLEL SAFE
AS $$
    -- Whether a claim may take this job now: not a job of a tenant set aside, nor a Messages
    -- API job of a model set aside (inlined into the dispatch's statements).
    SELECT tenant_id <> ALL (aside_tenants)
           AND (kind <> 'anthropic.messages' OR model IS NULL OR model <> ALL (aside))
$$;
"""

CLAIM_ADMITTED = """\
CREATE OR REPLACE FUNCTION pgqueue.claim_admitted(max_jobs integer, worker_id text,
                                                  lease_seconds double precision)
RETURNS TABLE (job pgqueue.jobs, blocked_seconds double precision)
LANGUAGE plpgsql
AS $$
DECLARE
    taken pgqueue.jobs[] := '{}';  -- admitted, in dispatch order
    got pgqueue.jobs[];
    j pgqueue.jobs;
    want integer;
    prefix integer;                -- after a stop at a later job: that many jobs again first
    pending text[] := '{}';        -- models set aside once the prefix is taken
    aside text[] := '{}';          -- models whose jobs this claim passes over
    aside_tenants text[] := '{}';  -- tenants whose jobs it passes over
    pending_tenants text[] := '{}';
    stopped text[] := '{}';        -- tenants whose job the limiter stopped once
    stops integer := 0;
    skipping boolean := false;     -- the settings were written
    stopping text[];               -- the models a stop sets aside
    cooling double precision;      -- the shortest cooldown left of the others in cooldown
    wait double precision;
    soonest double precision;      -- the shortest wait of the models set aside
    blocked_at integer;
    blocked_model text;
    blocked_tenant text;
    tries integer := 0;
BEGIN
    -- The scheduler's lock, held to commit, so that the redo sees the same state. The claim's
    -- commit does not wait for its WAL flush: the lock is released sooner, and a claim lost in
    -- a crash only leaves its jobs queued, to be claimed again (at-least-once execution;
    -- every completion is fenced by the lease token).
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(7310575183440224370);
    LOOP
        want := coalesce(prefix, max_jobs - cardinality(taken));
        -- A stop costs at most two dispatches (the jobs before it, then the rest without its
        -- model); the absolute bound only guards against a limiter changed under the claim.
        EXIT WHEN want <= 0 OR tries >= least(2 * stops + 2, 64);
        tries := tries + 1;
        blocked_at := NULL;
        IF cardinality(aside) > 0 OR cardinality(aside_tenants) > 0 THEN
            -- (only after a stop: a claim's first dispatch reads the settings as the
            -- transaction began, unset, which costs nothing to write)
            PERFORM set_config('pgqueue.claim_skip_models', aside::text, true);
            PERFORM set_config('pgqueue.claim_skip_tenants', aside_tenants::text, true);
            skipping := true;
        END IF;
        BEGIN
            got := ARRAY(SELECT d.claimed
                          FROM pgqueue.drr_dispatch(want, worker_id, lease_seconds) d);
            FOR i IN 1 .. cardinality(got) LOOP
                j := got[i];
                CONTINUE WHEN j.kind <> 'anthropic.messages' OR j.model IS NULL;
                wait := pgqueue.ratelimit_try_take(j.model, j.est_input_tokens,
                                                   j.max_output_tokens);
                IF wait > 0 AND wait < 'Infinity'::double precision THEN
                    blocked_at := i;
                    blocked_model := j.model;
                    blocked_tenant := j.tenant_id;
                    RAISE EXCEPTION 'rate limited' USING ERRCODE = 'PQ901';
                END IF;
            END LOOP;
            IF cardinality(got) = 0 AND cardinality(aside || aside_tenants) > 0 THEN
                -- Nothing else is due: what passing over those models changed (pairs that
                -- left the round) is undone, and the round stays as it was.
                RAISE EXCEPTION 'nothing else due' USING ERRCODE = 'PQ902';
            END IF;
        EXCEPTION WHEN SQLSTATE 'PQ901' OR SQLSTATE 'PQ902' THEN
            NULL;  -- everything of this attempt is undone; `got` and blocked_at survive
        END;
        IF blocked_at IS NULL THEN
            IF cardinality(taken) = 0 THEN
                taken := got;  -- the usual claim: no copy of its rows into a new array
            ELSE
                taken := taken || got;
            END IF;
            EXIT WHEN prefix IS NULL;  -- took what is due and can be sent
            -- The jobs before the stopped one are taken; the rest of the claim passes over
            -- the models that stopped it.
            prefix := NULL;
            aside := aside || pending;
            aside_tenants := aside_tenants || pending_tenants;
            pending := '{}';
            pending_tenants := '{}';
            CONTINUE;
        END IF;
        -- The stopped job's model goes aside, and with it every other model in cooldown now:
        -- they would stop the claim too, one dispatch each. A tenant stopped a second time
        -- goes aside too (its next job waits for its next turn), so no tenant stops a claim
        -- more than twice, however many models its jobs name (found by fresh testers: a bound
        -- on dispatches that one model per stop used up left every claim empty, with eight
        -- models in cooldown ahead in the round, or one tenant's jobs on 70 models whose
        -- buckets were spent).
        stops := stops + 1;
        SELECT coalesce(array_agg(r.model), '{}'),
               min(extract(epoch FROM r.cooldown_until - now()))::double precision
        INTO stopping, cooling
        FROM pgqueue.rate_limits r
        WHERE r.cooldown_until > now() AND r.model <> blocked_model
          AND r.model <> ALL (aside) AND r.model <> ALL (pending);
        stopping := blocked_model || stopping;
        soonest := least(soonest, wait, cooling);
        IF blocked_tenant = ANY (stopped) THEN
            pending_tenants := pending_tenants || blocked_tenant;
        ELSE
            stopped := stopped || blocked_tenant;
        END IF;
        pending := pending || stopping;
        IF blocked_at > 1 THEN
            prefix := blocked_at - 1;
        ELSE
            prefix := NULL;
            aside := aside || pending;
            aside_tenants := aside_tenants || pending_tenants;
            pending := '{}';
            pending_tenants := '{}';
        END IF;
    END LOOP;
    IF skipping THEN  -- cleared: a later dispatch of this transaction passes over nothing
        PERFORM set_config('pgqueue.claim_skip_models', '', true);
        PERFORM set_config('pgqueue.claim_skip_tenants', '', true);
    END IF;
    RETURN QUERY SELECT g, NULL::double precision FROM unnest(taken) AS g;
    IF soonest IS NOT NULL AND cardinality(taken) < max_jobs THEN
        RETURN QUERY SELECT NULL::pgqueue.jobs, soonest;
    END IF;
END
$$;
"""


def _revision(name: str) -> ModuleType:
    return revision_module(Path(__file__).with_name(name))


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body: str = _revision("0028_idle_turns_in_memory.py").dispatch()
    body = replace_anchor(body, _DECLARE, _DECLARE_ASIDE, what=_WHAT)
    return replace_anchor(body, _DUE, _DUE_SENDABLE, what=_WHAT, times=_DUE_STATEMENTS)


def _claim_admitted_before() -> str:
    r0016 = _revision("0016_claim_path_trims.py")
    text: str = r0016._direct(r0016._claim_admitted_before())
    return text


def _dispatch_settings() -> tuple[str, ...]:
    settings: tuple[str, ...] = _revision("0017_claim_counts.py").dispatch_settings()
    return settings


def upgrade() -> None:
    op.execute(SENDABLE)
    op.execute(dispatch())
    for statement in _dispatch_settings():  # CREATE OR REPLACE dropped them
        op.execute(statement)
    op.execute(CLAIM_ADMITTED)


def downgrade() -> None:
    op.execute(_claim_admitted_before())
    op.execute(_revision("0028_idle_turns_in_memory.py").dispatch())
    for statement in _dispatch_settings():
        op.execute(statement)
    op.execute("DROP FUNCTION pgqueue.job_sendable(text, text, text, text[], text[])")
