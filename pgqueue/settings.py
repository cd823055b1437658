"""Process settings: one frozen :class:`Settings`, read from ``PGQUEUE_*`` environment variables.

Durations are floats named ``*_seconds``; ``None`` means disabled, never 0 or -1. Settings that
SQL functions need (payload cap, known-tenant rule) are also readable by the database through
the GUCs ``pgqueue.max_payload_bytes`` and ``pgqueue.require_known_tenant``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """All tunables of a pgqueue process, with their units in their names.

    Raises ``pydantic.ValidationError`` when the lease does not outlive the provider timeout,
    or the heartbeat interval is over half the lease (a job must never outlive its lease while
    still running: a heartbeat that fails, a lost connection or a held row, is tried again one
    interval later, and that second try must come before the lease ends).
    """

    # No NaN or infinity in any float (found by a tester: PGQUEUE_POLL_INTERVAL_SECONDS=inf
    # passed `gt=0` and made every wait overflow); `None` is how a setting is switched off.
    model_config = SettingsConfigDict(
        env_prefix="PGQUEUE_", frozen=True, extra="ignore", allow_inf_nan=False
    )

    dsn: str | None = Field(
        default=None, description="libpq DSN or URL; unset means the embedded Postgres."
    )
    embedded_data_dir: Path | None = Field(
        default=None, description="Where the embedded Postgres keeps its data (a default per user)."
    )

    # --- enqueue boundary
    max_payload_bytes: int = Field(default=1_048_576, gt=0)
    max_tenant_id_chars: int = Field(default=128, gt=0)
    default_max_attempts: int = Field(default=5, ge=1, le=1000)
    admission_block_timeout_seconds: float = Field(
        default=30.0,
        ge=0,
        description="How long enqueue waits for room in a full tier whose policy is block.",
    )

    # --- worker
    concurrency: int = Field(default=10, ge=1, le=10_000)
    poll_interval_seconds: float = Field(default=1.0, gt=0)
    claim_fold_seconds: float = Field(
        default=0.005,
        ge=0,
        description="A busy worker waits this long for more free slots before claiming, so "
        "that one claim takes several jobs; an idle worker claims at once.",
    )
    claim_batch_max: int | None = Field(
        default=None,
        ge=1,
        description="At most this many jobs per claim statement; None claims every free slot. "
        "Below the worker's concurrency, a worker claims its next jobs while others still run "
        "(pgqueuer's batch_size with max_concurrent_tasks >= 2 x batch_size is the same shape).",
    )
    lease_seconds: float = Field(default=120.0, gt=0)
    heartbeat_seconds: float = Field(
        default=15.0,
        gt=0,
        description="How often a worker extends its leases; at most half the lease.",
    )
    provider_timeout_seconds: float = Field(default=90.0, gt=0)
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    rescue_interval_seconds: float = Field(default=15.0, gt=0)
    retention_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Workers delete jobs finished longer ago than this; None keeps them.",
    )
    counters_compact_interval_seconds: float | None = Field(
        default=5.0,
        gt=0,
        description="How often a worker folds the queued counters' delta rows; None: never.",
    )
    hot_tables_vacuum_interval_seconds: float | None = Field(
        default=10.0,
        gt=0,
        description=(
            "How often one worker vacuums the scheduler's small, hot tables (lane_tiers, "
            "flows, cursors, counters, rate limits), and how workers look every second "
            "whether pgqueue.jobs needs an ANALYZE; None: leave both to autovacuum."
        ),
    )
    prepare_threshold: int | None = Field(
        default=5,
        ge=0,
        description=(
            "psycopg's prepare_threshold for the worker's connections: a statement is prepared "
            "on the server once it has run this many times (0: at its first run); none never "
            "prepares (PgBouncer in transaction mode before 1.21, or without "
            "max_prepared_statements)."
        ),
    )
    burst_horizon_seconds: float = Field(
        default=60.0,
        ge=0,
        description="`work --burst` waits for queued jobs due within this horizon before exiting, "
        "and for other workers' leases ending within it (at most this long in all).",
    )

    # --- retries and backpressure (the article's figures)
    retry_after_multiplier: float = Field(default=1.2, gt=0)
    retry_after_jitter: float = Field(default=0.2, ge=0, lt=1)
    default_retry_after_seconds: float = Field(default=1.0, gt=0)
    max_throttle_wait_hours: float | None = Field(
        default=24.0,
        gt=0,
        le=87_600,
        description=(
            "How long a job throttled by the provider (429/529) keeps being rescheduled, in "
            "hours from its enqueue: a throttle whose wait would end past it fails the job. "
            "Counted in time, not in 429s, so that a provider outage does not dead-letter good "
            "jobs (found by a fault run: 5 429s in 90 s failed every job). None: never."
        ),
    )
    backoff_base_seconds: float = Field(
        default=5.0, gt=0, description="First retry delay ceiling; doubles per attempt."
    )
    backoff_cap_seconds: float = Field(default=300.0, gt=0)

    # --- the batches lane (docs/batches.md); on/off per tenant is in pgqueue.batch_lane
    batches_max_requests: int = Field(
        default=10_000, ge=1, le=100_000, description="A batch is sealed at this many requests."
    )
    batches_max_age_seconds: float = Field(
        default=600.0, ge=0, le=86_400, description="...or when its first job is this old."
    )
    batches_poll_seconds: float = Field(
        default=30.0, gt=0, le=86_400, description="How often a submitted batch is polled."
    )
    batches_expired: Literal["messages", "failed"] = Field(
        default="messages",
        description="An expired batch request goes to the Messages API lane, or fails.",
    )
    batches_discount: float = Field(
        default=0.5, ge=0, le=1, description="The Batches API's discount on token prices."
    )
    price_input_usd_per_mtok: float = Field(
        default=3.0, ge=0, description="Messages API price of input tokens (cost saved)."
    )
    price_output_usd_per_mtok: float = Field(
        default=15.0, ge=0, description="Messages API price of output tokens (cost saved)."
    )

    # --- provider
    anthropic_base_url: str | None = Field(
        default=None, description="Overrides ANTHROPIC_BASE_URL (e.g. the local sandbox)."
    )
    anthropic_api_key_file: Path | None = Field(
        default=None, description="A file holding the API key; else ANTHROPIC_API_KEY is used."
    )
    anthropic_api_key: SecretStr | None = Field(default=None, exclude=True, repr=False)

    # --- dashboard
    dashboard_token: SecretStr | None = Field(
        default=None,
        exclude=True,
        repr=False,
        description="The dashboard's admin token (at least 16 characters); unset: read-only.",
    )

    @field_validator(
        "retention_seconds",
        "counters_compact_interval_seconds",
        "hot_tables_vacuum_interval_seconds",
        "prepare_threshold",
        "max_throttle_wait_hours",
        mode="before",
    )
    @classmethod
    def _none_switches_off(cls, value: object) -> object:
        """``none`` (any case, e.g. ``PGQUEUE_RETENTION_SECONDS=none``) switches the task off.

        Only these optional intervals (and ``prepare_threshold``) take it: elsewhere None means
        a default (``dsn``: the embedded server), which a typo must not select.
        """
        if isinstance(value, str) and value.strip().lower() == "none":
            return None
        return value

    @field_validator("dsn", mode="before")
    @classmethod
    def _blank_dsn_is_unset(cls, value: object) -> object:
        """A DSN of only whitespace (``PGQUEUE_DSN=' '``) is unset, like an empty one: libpq
        would read it as "all defaults" and connect to whatever the local socket serves (found
        by a tester)."""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @model_validator(mode="after")
    def _lease_outlives_work(self) -> Settings:
        if self.provider_timeout_seconds >= self.lease_seconds:
            raise ValueError(
                f"provider_timeout_seconds ({self.provider_timeout_seconds}) must be shorter than "
                f"lease_seconds ({self.lease_seconds}), or a second worker could run the same job"
            )
        if self.heartbeat_seconds > self.lease_seconds / 2:
            # Found by a tester: 119 s with a 120 s lease was taken; one failed heartbeat then
            # let the lease expire under a running job, and the job ran twice.
            raise ValueError(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be at most half of "
                f"lease_seconds ({self.lease_seconds}), so that a heartbeat that fails is tried "
                "again before the lease ends"
            )
        return self


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment, with keyword overrides (CLI flags) on top."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**clean)  # type: ignore[arg-type]
