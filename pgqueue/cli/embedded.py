"""``pgqueue embedded status | stop``: the embedded Postgres servers of this user.

Two folders belong to a user: the commands' server (``PGQUEUE_EMBEDDED_DATA_DIR``, else the
default data folder) and the test suite's (the same name with ``-test``). Both keep running
after the command or test run that started them; these commands show and stop them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pgqueue.cli import _settings, cli_errors, console, embedded_app
from pgqueue.display import cell

DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Only this folder (default: PGQUEUE_EMBEDDED_DATA_DIR or the user's data folder, "
        "and its -test sibling).",
    ),
]


def _folders(data_dir: Path | None) -> list[Path]:
    from pgqueue.db.embedded import default_data_dir, suite_data_dir

    if data_dir is not None:
        return [data_dir.expanduser().resolve()]
    base = (_settings().embedded_data_dir or default_data_dir()).expanduser().resolve()
    return [base, suite_data_dir(base)]


@embedded_app.command("status")
@cli_errors
def embedded_status(
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show whether the embedded servers run, with their process id and DSN (starts nothing)."""
    from pgqueue.db.embedded import server_status

    servers = [server_status(folder) for folder in _folders(data_dir)]
    if as_json:
        rows = [{"data_dir": str(s.data_dir), "pid": s.pid, "dsn": s.dsn} for s in servers]
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    table = Table(title="Embedded Postgres")
    for column in ("data folder", "state", "pid", "dsn"):
        table.add_column(column)
    for s in servers:
        state = "running" if s.running else "stopped"
        table.add_row(cell(s.data_dir), state, str(s.pid or ""), cell(s.dsn))
    console.print(table)


@embedded_app.command("stop")
@cli_errors
def embedded_stop(data_dir: DataDirOption = None) -> None:
    """Stop the embedded servers (a fast shutdown; the data stays, the next command restarts).

    Every checkout of this user that runs without a DSN shares these servers: commands and
    workers using them lose their connections.
    """
    from pgqueue.db.embedded import stop

    for folder in _folders(data_dir):
        stopped = stop(folder)
        console.print(cell(f"{folder}: {'stopped' if stopped else 'not running'}"))
