"""``pgqueue batches``: switch the batches lane on or off, and list its batches
(docs/batches.md)."""

from __future__ import annotations

from typing import Annotated

import psycopg
import typer
from rich.table import Table

from pgqueue.cli import DsnOption, _dsn, _settings, app, cli_errors, console, int_in_range
from pgqueue.display import cell, printable

batches_app = typer.Typer(
    help="The batches lane: batch-tier jobs through the Message Batches API (docs/batches.md)."
)
app.add_typer(batches_app, name="batches")

TenantOption = Annotated[
    str | None,
    typer.Option(help="Only this tenant (its own setting wins); default: every tenant."),
]

_INT64_MAX = 2**63 - 1


def _switch(tenant: str | None, enabled: bool, dsn: str | None) -> None:
    from pgqueue.batches.lane import set_lane
    from pgqueue.validation import check_tenant_id

    if tenant is not None:
        check_tenant_id(tenant)
    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        set_lane(conn, tenant, enabled)
    who = f"tenant {tenant}" if tenant is not None else "every tenant without its own setting"
    console.print(f"batches lane {'on' if enabled else 'off'} for {who}", markup=False)


@batches_app.command("on")
@cli_errors
def batches_on(tenant: TenantOption = None, dsn: DsnOption = None) -> None:
    """Send batch-tier `anthropic.messages` jobs through the Message Batches API."""
    _switch(tenant, True, dsn)


@batches_app.command("off")
@cli_errors
def batches_off(tenant: TenantOption = None, dsn: DsnOption = None) -> None:
    """Send batch-tier jobs through the Messages API, one by one, as usual."""
    _switch(tenant, False, dsn)


@batches_app.command("list")
@cli_errors
def batches_list(
    dsn: DsnOption = None,
    limit: Annotated[int, typer.Option(help="The newest N batches, 1 to 2^63-1.")] = 20,
) -> None:
    """The lane's settings and its newest batches: state, provider id, results, times."""
    from pgqueue.db import queries

    int_in_range("--limit", limit, 1, _INT64_MAX)
    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        lanes = queries.run(conn, "batch_lane_list")
        rows = queries.run(conn, "batch_list", {"limit": limit})
    on = ", ".join(f"{r['tenant_id'] or '(every tenant)'} {'on' if r['enabled'] else 'off'}"
                   for r in lanes)  # fmt: skip
    console.print(f"lane: {printable(on) or 'off (no setting)'}", markup=False)
    table = Table(title="Batches")
    for col in ("id", "state", "provider id", "requests", "ok", "errored", "expired", "canceled",
                "submitted", "ended"):  # fmt: skip
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r["id"]),
            cell(r["state"]),
            cell(r["provider_batch_id"]),
            *(str(r[k]) for k in ("requests", "succeeded", "errored", "expired", "canceled")),
            str(r["submitted_at"] or ""),
            str(r["ended_at"] or ""),
        )
    console.print(table)
