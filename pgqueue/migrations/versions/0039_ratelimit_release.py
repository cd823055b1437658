"""A request a claim took from the limiter and the worker did not send (its job deferred, e.g.
no API key on this worker) is given back: ``pgqueue.ratelimit_release`` (060_rate_limiter.sql).

Revision ID: 0039
Revises: 0038
"""

from __future__ import annotations

from alembic import op

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None

RATELIMIT_RELEASE = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_release(p_model text, p_input_tokens double precision,
                                                     p_output_tokens double precision)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
BEGIN
    r.requests_available := least(r.requests_per_minute, r.requests_available + 1);
    r.input_tokens_available := least(r.input_tokens_per_minute,
        r.input_tokens_available + p_input_tokens * r.input_estimate_ratio);
    r.output_tokens_available := least(r.output_tokens_per_minute,
        r.output_tokens_available + p_output_tokens);
    PERFORM pgqueue.ratelimit_save(r);
END
$$;
"""


def upgrade() -> None:
    op.execute(RATELIMIT_RELEASE)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION IF EXISTS pgqueue.ratelimit_release(text, double precision, double precision)"
    )
