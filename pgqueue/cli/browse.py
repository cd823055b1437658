"""Commands that look at jobs: ``jobs list``, ``jobs show ID``, and ``dashboard`` (the web
view, with actions behind an admin token)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import psycopg
import typer
from rich.json import JSON
from rich.table import Table
from rich.text import Text

from pgqueue.cli import (
    _INT64_MAX,
    _MAX_SECONDS,
    LOOPBACK_HOSTS,
    DsnOption,
    _dsn,
    _settings,
    app,
    check_can_listen,
    cli_errors,
    console,
    err_console,
    finite_in_range,
    int_in_range,
)
from pgqueue.display import cell, printable_data

jobs_app = typer.Typer(help="Find jobs (`jobs list`) and look at one (`jobs show ID`).")
app.add_typer(jobs_app, name="jobs")

#: The shortest admin token the dashboard takes.
MIN_TOKEN_CHARS = 16


def _when(value: Any) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


@jobs_app.command("list")
@cli_errors
def jobs_list(
    state: Annotated[
        str | None,
        typer.Option(help="queued | running | succeeded | failed | cancelled (any case)."),
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's jobs.")] = None,
    tier: Annotated[
        str | None, typer.Option(help="critical | standard | batch (any case).")
    ] = None,
    kind: Annotated[str | None, typer.Option(help="Only jobs of this kind (handler).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many jobs, 1 to 1000.")] = 50,
    before: Annotated[
        int | None, typer.Option(help="Only ids below this one (the next page), 1 to 2^63-1.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, one array.")] = False,
    dsn: DsnOption = None,
) -> None:
    """List jobs, newest first, filtered by state, tenant, tier and kind."""
    from pgqueue.observability.jobs import MAX_LIST_LIMIT, JobFilter, list_jobs
    from pgqueue.validation import check_tenant_id

    if tenant is not None:
        check_tenant_id(tenant)  # '' is refused here; an empty form field means "any"
    int_in_range("--limit", limit, 1, MAX_LIST_LIMIT)
    int_in_range("--before", before, 1, _INT64_MAX)
    where = JobFilter.checked(state=state, tenant_id=tenant, tier=tier, kind=kind)
    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        rows = list_jobs(conn, where, limit=limit, before_id=before)
    if as_json:
        sys.stdout.write(json.dumps(rows, default=str) + "\n")
        return
    table = Table(title=f"Jobs ({len(rows)}, newest first)")
    for col in ("id", "tenant", "tier", "state", "lane", "attempts", "enqueued", "finished"):
        table.add_column(col, justify="right" if col in ("id", "attempts") else "left")
    table.add_column("last error", overflow="fold", max_width=48)
    for r in rows:
        table.add_row(  # cells: stored strings, never rich markup nor control characters
            str(r["id"]),
            cell(r["tenant_id"]),
            cell(r["tier"]),
            cell(r["state"]),
            cell(r["lane"]),
            f"{r['attempts']}/{r['max_attempts']}",
            _when(r["enqueued_at"]),
            _when(r["finished_at"]),
            cell(r["last_error"]),
        )
    console.print(table)
    if len(rows) == limit:
        console.print(f"older: --before {rows[-1]['id']}", markup=False, highlight=False)


@jobs_app.command("show")
@cli_errors
def jobs_show(
    job_id: Annotated[int, typer.Argument(help="The job's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    dsn: DsnOption = None,
) -> None:
    """One job: state, tenant, tier, attempts, error, timeline, payload and result."""
    from pgqueue.errors import UnknownJob
    from pgqueue.observability.jobs import job_detail

    int_in_range("job id", job_id, 1, _INT64_MAX)
    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        job = job_detail(conn, job_id)
    if job is None:
        raise UnknownJob(f"no job {job_id}")
    if as_json:
        sys.stdout.write(json.dumps(job, default=str) + "\n")
        return
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="dim")
    facts.add_column()
    for label, value in (
        ("state", job["state"]),
        ("tenant", job["tenant_id"]),
        ("tier", f"{job['tier']} (origin {job['origin']}, SLA {job['sla_seconds']})"),
        ("kind / lane", f"{job['kind']} / {job['lane']}"),
        ("attempts", f"{job['attempts']} of {job['max_attempts']}"),
        ("throttle retries", str(job["throttle_retries"])),
        ("cost", f"{job['cost']:g}"),
        ("tokens used", f"{job['input_tokens'] or 0} in, {job['output_tokens'] or 0} out"),
        ("last error", job["last_error"] or "-"),
    ):
        facts.add_row(label, cell(value))
    console.print(Text(f"Job {job_id}", style="bold"))
    console.print(facts)
    timeline = Table(title="Timeline")
    for col in ("at", "event", "detail"):
        timeline.add_column(col)
    for e in job["timeline"]:
        timeline.add_row(_when(e["at"]), cell(e["event"]), cell(e["detail"]))
    console.print(timeline)
    console.print(Text("Payload", style="bold"))
    console.print(JSON.from_data(printable_data(job["payload"]), default=str))
    console.print(Text("Result", style="bold"))
    console.print(JSON.from_data(printable_data(job["result"]), default=str))


@app.command()
@cli_errors
def dashboard(
    host: Annotated[
        str, typer.Option(help="Address to bind; 127.0.0.1 keeps it on this machine.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port, 1 to 65535.")] = 8780,
    token: Annotated[
        str | None,
        typer.Option(
            help="Admin token that unlocks actions (at least 16 characters); better "
            "PGQUEUE_DASHBOARD_TOKEN. Without one the dashboard is read-only."
        ),
    ] = None,
    refresh_seconds: Annotated[
        float, typer.Option(help="Pages refresh every N seconds, 0 (off) to 3600.")
    ] = 3.0,
    window: Annotated[
        float, typer.Option(help="Latency and fairness window, seconds, 1 to 1e9.")
    ] = 300.0,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(help="Another Host name to serve (repeat); 127.0.0.1 and localhost are."),
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Serve the web dashboard: overview, tenants, schedule, jobs; actions with the token."""
    from pgqueue.dashboard.app import DashboardConfig
    from pgqueue.dashboard.server import serve
    from pgqueue.db import queries
    from pgqueue.errors import InvalidArgument, SchemaOutOfDate

    int_in_range("--port", port, 1, 65_535)
    finite_in_range("--refresh-seconds", refresh_seconds, 0.0, 3600.0)
    finite_in_range("--window", window, 1.0, _MAX_SECONDS)
    settings = _settings()
    secret = token or (
        settings.dashboard_token.get_secret_value() if settings.dashboard_token else None
    )
    if secret is not None and len(secret) < MIN_TOKEN_CHARS:
        raise InvalidArgument(
            f"the admin token (--token or PGQUEUE_DASHBOARD_TOKEN) must be at least "
            f"{MIN_TOKEN_CHARS} characters"
        )
    hosts = ["127.0.0.1", "localhost", *(allowed_host or [])]
    if host not in ("0.0.0.0", "::") and host not in hosts:
        hosts.append(host)
    target = _dsn(settings, dsn)
    with psycopg.connect(target, autocommit=True) as conn:  # fail now, in one line
        if not queries.run(conn, "schema_exists")["present"]:
            raise SchemaOutOfDate("no pgqueue schema in this database; run `pgqueue migrate`")
    check_can_listen(host, port)  # a busy port: one line naming the address, exit 2
    if host not in LOOPBACK_HOSTS:
        err_console.print(
            f"warning: serving on {host}, beyond this machine, over plain HTTP; put it behind "
            "TLS, and list the names it is reached by with --allowed-host",
            markup=False,
            highlight=False,
        )
    mode = "actions need the admin token" if secret else "read-only (no admin token)"
    console.print(
        f"pgqueue dashboard on http://{host}:{port}/ ({mode})", markup=False, highlight=False
    )
    config = DashboardConfig(
        dsn=target,
        token=secret,
        refresh_seconds=refresh_seconds,
        window_seconds=window,
        allowed_hosts=tuple(hosts),
    )
    serve(config, host=host, port=port)
