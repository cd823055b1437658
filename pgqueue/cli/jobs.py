"""Commands that act on jobs: enqueue, retry, cancel, prune."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import psycopg
import typer

from pgqueue.cli import (
    _INT32_MAX,
    _MAX_SECONDS,
    DsnOption,
    _dsn,
    _settings,
    app,
    cli_errors,
    console,
    err_console,
    finite_in_range,
    int_in_range,
)

#: A payload file is read up to this many times the payload cap (JSON text may carry more
#: whitespace than the stored form): found by a tester, ``--payload @/dev/zero`` read until
#: the machine ran out of memory.
PAYLOAD_FILE_FACTOR = 4
#: ... and never more than this (a jsonb value holds at most 255 MB): found by a tester, a cap
#: set to 1e11 made every file read reserve 400 GB.
PAYLOAD_FILE_MAX_BYTES = 1 << 30
_READ_CHUNK_BYTES = 1 << 20
#: How many of the jobs a bulk retry skipped `pgqueue retry` names (it counts them all).
_SKIPPED_SHOWN = 10


def _read_at_most(name: str, size: int) -> bytes:
    """The first ``size`` bytes of file ``name`` (fewer if it is shorter), read in chunks so
    that nothing is reserved for bytes the file does not have.

    Raises:
        OSError: the file cannot be opened or read.
    """
    parts: list[bytes] = []
    left = size
    with open(name, "rb") as handle:
        while left > 0:
            chunk = handle.read(min(left, _READ_CHUNK_BYTES))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
    return b"".join(parts)


def _read_payload(payload: str, max_payload_bytes: int) -> Any:
    """The JSON value of ``--payload``: its text, or the file after ``@``, read up to
    :data:`PAYLOAD_FILE_FACTOR` × ``max_payload_bytes`` bytes.

    Raises:
        InvalidArgument: no file name, or the file cannot be read or is not UTF-8.
        PayloadTooLarge: the file is longer than that.
        InvalidPayload: the text is not JSON, or is nested too deeply to parse.
    """
    import pgqueue

    raw = payload
    if payload.startswith("@"):
        name = payload[1:]
        if not name:
            raise pgqueue.InvalidArgument("--payload @FILE needs a file name after the @")
        limit = min(PAYLOAD_FILE_FACTOR * max_payload_bytes, PAYLOAD_FILE_MAX_BYTES)
        try:
            data = _read_at_most(name, limit + 1)
            raw = data.decode("utf-8")
        except OSError as exc:  # missing, a directory, no permission
            raise pgqueue.InvalidArgument(
                f"cannot read payload file {name!r}: {exc.strerror or exc}"
            ) from None
        except UnicodeDecodeError as exc:
            if len(data) > limit:  # cut in the middle of a character: too long anyway
                raw = ""
            else:
                raise pgqueue.InvalidArgument(
                    f"cannot read payload file {name!r}: not UTF-8 text "
                    f"({exc.reason} at offset {exc.start})"
                ) from None
        if len(data) > limit:
            raise pgqueue.PayloadTooLarge(
                f"payload file {name!r} is over {limit} bytes ({PAYLOAD_FILE_FACTOR} x the "
                f"payload cap of {max_payload_bytes}, at most {PAYLOAD_FILE_MAX_BYTES})"
            )
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise pgqueue.InvalidPayload(f"--payload is not JSON: {exc}") from None
    except RecursionError:  # found by a tester: a traceback for a payload nested ~1,000 deep
        raise pgqueue.InvalidPayload("--payload is nested too deeply to parse") from None


class _StderrLines(logging.Handler):
    """Each record's message as one plain line on stderr, control characters escaped."""

    def emit(self, record: logging.LogRecord) -> None:
        from pgqueue.display import printable

        err_console.print(printable(record.getMessage()), markup=False, highlight=False)


@contextmanager
def _waits_told() -> Iterator[None]:
    """While it is open, an enqueue that waits for room (a full tier of policy ``block``) says
    so on stderr, once: which tier or tenant, its cap, how long it may wait (the INFO record
    of :mod:`pgqueue.enqueue_admission`, shown without ``-v``, and only there)."""
    from pgqueue import enqueue_admission

    log = enqueue_admission.logger
    handler = _StderrLines(logging.INFO)
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # with -v, the root handler would print it a second time
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


@app.command()
@cli_errors
def enqueue(
    tenant: Annotated[str, typer.Argument(help="Tenant id.")],
    origin: Annotated[
        str, typer.Option(help="user_action | scheduled | batch_job (any case).")
    ] = "scheduled",
    sla_seconds: Annotated[float | None, typer.Option(help="SLA in seconds; none = batch.")] = None,
    prompt: Annotated[str | None, typer.Option(help="User message text.")] = None,
    payload: Annotated[
        str | None, typer.Option(help="Messages API parameters as JSON, or @file.json.")
    ] = None,
    model: Annotated[str, typer.Option(help="Model, with --prompt.")] = "claude-haiku-4-5",
    max_tokens: Annotated[int, typer.Option(help="max_tokens, with --prompt, 1 to 2^31-1.")] = 256,
    kind: Annotated[
        str,
        typer.Option(help="Handler kind (a worker needs a handler registered for it)."),
    ] = "anthropic.messages",
    dedupe_key: Annotated[
        str | None,
        typer.Option(help="While a job of this tenant with this key is live, return its id."),
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Enqueue one job and print its id.

    When admission control does not take the job, nothing is printed on stdout and the
    command exits 75 (EX_TEMPFAIL), saying why on stderr: QueueFull for a full tier of policy
    `reject` (or `block`, after its wait), "dropped" for policy `drop` (nothing stored; the
    drop is counted)."""
    import pgqueue

    int_in_range("--max-tokens", max_tokens, 1, _INT32_MAX)
    if (prompt is None) == (payload is None):
        raise pgqueue.InvalidArgument("give exactly one of --prompt TEXT or --payload JSON")
    if prompt is not None and not prompt.strip():  # found by a tester: --prompt "" was queued
        raise pgqueue.InvalidArgument(
            "--prompt must hold text: the Messages API refuses empty text content"
        )
    settings = _settings()
    body: Any
    if payload is not None:
        body = _read_payload(payload, settings.max_payload_bytes)
    else:
        body = {
            "model": model,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        }
    # any case, as --tier (found by a tester: --origin USER_ACTION was an unknown origin)
    lowered = origin.strip().lower()
    if lowered in {o.value for o in pgqueue.Origin}:
        origin = lowered
    with psycopg.connect(_dsn(settings, dsn)) as conn, _waits_told():
        job_id = pgqueue.enqueue(
            conn,
            tenant_id=tenant,
            origin=origin,
            payload=body,
            sla_seconds=sla_seconds,
            kind=kind,
            dedupe_key=dedupe_key,
            settings=settings,
        )
    if job_id is None:
        # found by a tester: "dropped ..." went to stdout with exit 0, so `id=$(pgqueue
        # enqueue ...)` held that text; not enqueued, as for QueueFull
        err_console.print("dropped (tier full, policy drop): not enqueued", markup=False)
        raise typer.Exit(75)
    console.print(job_id)


@app.command()
@cli_errors
def retry(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    tier: Annotated[
        str | None, typer.Option(help="critical | standard | batch (any case).")
    ] = None,
    reason: Annotated[
        str | None, typer.Option(help="Substring of last_error (case-insensitive).")
    ] = None,
    since: Annotated[
        datetime | None, typer.Option(help="Failed at or after (ISO 8601, UTC if no zone).")
    ] = None,
    until: Annotated[datetime | None, typer.Option(help="Failed before (ISO 8601).")] = None,
    all_failed: Annotated[
        bool, typer.Option("--all", help="Re-queue every failed job (no filter).")
    ] = False,
    dsn: DsnOption = None,
) -> None:
    """Re-queue failed jobs in bulk, with fresh attempt counters. A job whose dedupe key a
    live (queued or running) job holds is left failed, and a second line counts and names such
    jobs; of failed jobs sharing a key, the newest is re-queued."""
    from pgqueue.admin import requeue_failed
    from pgqueue.errors import InvalidArgument
    from pgqueue.validation import check_tenant_id, check_tier

    if not all_failed and all(v is None for v in (tenant, tier, reason, since, until)):
        raise InvalidArgument(
            "give a filter (--tenant, --tier, --reason, --since, --until) or --all"
        )
    if reason is not None and not reason.strip():
        # found by a tester: '' matched every failed job, past the "a filter or --all" guard
        raise InvalidArgument("--reason must not be empty (use --all to re-queue every job)")
    if tenant is not None:
        check_tenant_id(tenant)  # '' matched no job and said "re-queued 0"; cancel refuses it
    if tier is not None:
        tier = check_tier(tier)  # any case, as --plan: BATCH is batch
    since_utc = since.replace(tzinfo=UTC) if since and since.tzinfo is None else since
    until_utc = until.replace(tzinfo=UTC) if until and until.tzinfo is None else until
    with psycopg.connect(_dsn(_settings(), dsn)) as conn:
        done = requeue_failed(
            conn, tenant_id=tenant, tier=tier, reason=reason, since=since_utc, until=until_utc
        )
    console.print(f"re-queued {len(done)} failed job(s)")
    if done.skipped:
        named = [
            f"job {s.job_id} (held by job {s.held_by})"
            if s.held_by is not None
            else f"job {s.job_id} (held by a live job)"
            for s in done.skipped[:_SKIPPED_SHOWN]
        ]
        if len(done.skipped) > _SKIPPED_SHOWN:
            named.append(f"{len(done.skipped) - _SKIPPED_SHOWN} more")
        console.print(
            f"skipped {len(done.skipped)} failed job(s): a live job holds their dedupe key: "
            + ", ".join(named),
            markup=False,
            highlight=False,
        )


# ignore_unknown_options: click reads a token starting with "-" as an option, so `cancel -5`
# said "No such option: -5" in typer's box; now -5 is the job id, which pgqueue.cancel refuses
# in one line. (A mistyped option, `--tenat`, is then read as the job id: "not a valid integer".)
@app.command(context_settings={"ignore_unknown_options": True})
@cli_errors
def cancel(
    job_id: Annotated[
        int | None, typer.Argument(help="The job's id (what enqueue printed).")
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(help="Only if the job is this tenant's; with --all-queued, whose jobs."),
    ] = None,
    all_queued: Annotated[
        bool,
        typer.Option("--all-queued", help="Every queued job of --tenant (running ones finish)."),
    ] = False,
    tier: Annotated[
        str | None, typer.Option(help="With --all-queued: only this tier's jobs (any case).")
    ] = None,
    reason: Annotated[
        str | None, typer.Option(help="Stored in last_error as 'cancelled: \\<reason>'.")
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Cancel a queued or running job (a running job's handler stops at its next heartbeat),
    or with --all-queued every queued job of a tenant."""
    import pgqueue
    from pgqueue.db import queries
    from pgqueue.errors import InvalidArgument
    from pgqueue.validation import check_tenant_id, check_tier

    if all_queued:
        if job_id is not None or tenant is None:
            raise InvalidArgument("--all-queued takes --tenant and no job id")
    elif job_id is None:
        raise InvalidArgument("give a job id, or --all-queued --tenant T")
    elif tier is not None:
        raise InvalidArgument("--tier goes with --all-queued")
    if tier is not None:
        tier = check_tier(tier)  # any case, as --plan (pgqueue.cancel_queued takes lower case)
    with psycopg.connect(_dsn(_settings(), dsn)) as conn:
        if tenant is not None:
            # A producer role may cancel only with its tenant scope set: --tenant sets it
            # unless the session has one (found by a tester: the CLI could not cancel as one).
            queries.run(conn, "session_scope_default", {"tenant_id": check_tenant_id(tenant)})
        if all_queued:
            assert tenant is not None
            n = pgqueue.cancel_queued(conn, tenant, tier=tier, reason=reason)
            console.print(
                f"cancelled {n} queued job(s) of tenant {tenant!r}", markup=False, highlight=False
            )
            return
        assert job_id is not None
        try:
            state = pgqueue.cancel(conn, job_id, tenant_id=tenant, reason=reason)
        except psycopg.errors.InsufficientPrivilege as exc:
            if tenant is None and "pgqueue.tenant_id" in (exc.diag.message_primary or ""):
                # a producer role without --tenant: bad input, with the way out (found by a
                # tester: it read as "database error", exit 1)
                raise InvalidArgument(
                    "this role cancels only its tenant's jobs: give --tenant TENANT"
                ) from None
            raise
    if state == "cancelled":
        console.print(f"job {job_id} cancelled")
    else:
        console.print(f"job {job_id} had already {state}; left as it is")


@app.command()
@cli_errors
def prune(
    older_than: Annotated[
        float,
        typer.Option(help="Delete jobs finished more than this many seconds ago, 0 to 1e9."),
    ] = 7 * 86_400.0,
    dsn: DsnOption = None,
) -> None:
    """Retention: delete finished jobs (queued and running jobs are never touched), and the
    scheduler's flow rows of tenants with no queued job left in their lane and tier."""
    from pgqueue.admin import prune_finished, prune_flows

    finite_in_range("--older-than", older_than, 0.0, _MAX_SECONDS)
    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        deleted = prune_finished(conn, older_than_seconds=older_than)
        flows = prune_flows(conn)
    console.print(f"deleted {deleted} finished job(s)")
    console.print(f"deleted {flows} idle scheduler flow row(s)")
