"""The ``pgqueue`` command line: thin typer commands that parse, call one function, format.

The commands live in :mod:`pgqueue.cli.admin` (schema, roles, status, tenants, limits,
admission), :mod:`pgqueue.cli.jobs` (enqueue, retry, cancel, prune), :mod:`pgqueue.cli.browse`
(jobs list, jobs show, dashboard), :mod:`pgqueue.cli.run` (work, metrics, sandbox, replay, demo),
:mod:`pgqueue.cli.experiments` (bench, simulate) and :mod:`pgqueue.cli.batches` (the batches
lane); this module holds the app, the shared options and the error handling.

Every command goes through :func:`cli_errors`, so a user error prints one line and exits 2, an
environment problem (database unreachable, schema missing) prints one line and exits 1, and
neither shows a traceback.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

import psycopg
import sqlalchemy.exc
import typer
from rich.console import Console, ConsoleDimensions

from pgqueue.cli.typer_help import flags_show_no_type
from pgqueue.errors import (
    AdmissionError,
    InvalidArgument,
    PgqueueError,
    UsageError,
    from_sqlstate,
    numeric_argument,
)
from pgqueue.settings import Settings, load_settings

flags_show_no_type()
app = typer.Typer(
    help="pgqueue: a Postgres-native job queue for rate-limited LLM APIs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # markdown: a docstring's paragraphs flow to the terminal's width and ``code`` shows as
    # code (rich markup kept every line break of the source); tests/acceptance/test_cli_help.py
    rich_markup_mode="markdown",
)
tenants_app = typer.Typer(help="List and configure tenants (plan, quantum, daily budget).")
app.add_typer(tenants_app, name="tenants")
limits_app = typer.Typer(help="The provider's rate limits per model, shared by all workers.")
app.add_typer(limits_app, name="limits")
admission_app = typer.Typer(help="Admission control: caps of queued jobs and tier policies.")
app.add_typer(admission_app, name="admission")
embedded_app = typer.Typer(
    help="The embedded Postgres (used when no DSN is set) and the test suite's: status, stop."
)
app.add_typer(embedded_app, name="embedded")
#: The width of stdout when it is not a terminal: wider than any table pgqueue prints.
UNCUT_WIDTH = 10_000


class StdoutConsole(Console):
    """rich's Console for stdout, with two changes for when stdout is not a terminal.

    - Width :data:`UNCUT_WIDTH` (characters): rich fits tables to the terminal, or to 80
      columns when there is none, so `pgqueue jobs list | grep acme` cut every long row with
      "…" (found by a tester, issue 29). A table is as wide as its content; text is not
      wrapped either (``soft_wrap``). On a terminal, rich's own width (tables fit the screen).
    - A closed pipe (`pgqueue status --watch 1 | head -1`) raises :class:`BrokenPipeError`
      for :func:`cli_errors` to end the command quietly with exit 0; rich's own handling
      exits 1.
    """

    def _size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        return size if self.is_terminal else ConsoleDimensions(UNCUT_WIDTH, size.height)

    size = property(_size, Console.size.fset)  # type: ignore[attr-defined]

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def _stdout_closed() -> NoReturn:
    """The reader of stdout went away (`| head -1`): point stdout at /dev/null, so that the
    flush at exit does not fail again, and exit 0 with nothing on stderr (the recipe of
    Python's documentation, "Note on SIGPIPE" in :mod:`signal`; a reader that stopped reading
    is not an error of this command)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise typer.Exit(0)


# emoji=False: a stored name such as ':smile:' is shown as it is, not as an emoji (found by a
# tester; markup is turned off where names are printed, emoji codes are a separate switch).
console = StdoutConsole(soft_wrap=True, emoji=False)
err_console = Console(stderr=True, soft_wrap=True, emoji=False)

P = ParamSpec("P")
R = TypeVar("R")

DsnOption = Annotated[
    str | None,
    typer.Option("--dsn", help="Postgres DSN; default PGQUEUE_DSN, else the embedded server."),
]
_INT32_MAX = 2_147_483_647
#: bigint's largest value: the caps of queued jobs (pgqueue.admission, pgqueue.tenants) and
#: LIMITs are bigint, and psycopg sends a larger int as numeric, which no pgqueue function takes.
_INT64_MAX = 2**63 - 1
#: Jobs in flight per worker at most (Settings.concurrency, PGQUEUE_CONCURRENCY, takes the same);
#: the claim functions take an integer.
MAX_CONCURRENCY = 10_000
#: The addresses that keep a server on this machine (`dashboard`, `metrics`, `work
#: --metrics-host`: others warn).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: The largest number of seconds an option takes (~31.7 years): time.sleep and Event.wait
#: overflow past ~9.2e9 s, and now() minus more than ~2e11 s leaves Postgres' timestamps.
_MAX_SECONDS = 1e9


def check_can_listen(host: str, port: int) -> None:
    """Raise :class:`InvalidArgument` unless a server can listen on ``host``:``port`` now.

    Found by a tester: with the port taken, or a host that does not resolve, the sandbox
    printed its address, then uvicorn's error, and exited 3.
    """
    import socket

    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            probe.bind(address)
    except OSError as exc:  # socket.gaierror is one
        raise InvalidArgument(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _say(kind: str, message: str) -> None:
    """``kind: message`` in red on stderr, one line: the message's control characters escaped
    (a database error quotes the text it refused as it is; :func:`pgqueue.display.printable`)."""
    from rich.markup import escape

    from pgqueue.display import printable

    err_console.print(f"[red]{escape(kind)}:[/red] {escape(printable(message))}", highlight=False)


class _PrintableFormatter(logging.Formatter):
    """Log lines with their control characters escaped (:func:`pgqueue.display.printable`):
    a record may quote a kind, a model or a provider's error text. A traceback that follows
    keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        from pgqueue.display import printable

        return printable(super().formatMessage(record))


def _bound(value: float) -> str:
    return f"{value:g}".replace("e+0", "e").replace("e+", "e")


def _range(low: float, high: float, low_open: bool, high_open: bool) -> str:
    if not (low_open or high_open or math.isinf(high)):
        return f"between {_bound(low)} and {_bound(high)}"
    text = f"{'greater than' if low_open else 'at least'} {_bound(low)}"
    if math.isinf(high):
        return text if low_open else f"of {text}"
    return f"{text} and {'less than' if high_open else 'at most'} {_bound(high)}"


def finite_in_range(
    option: str,
    value: float | None,
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Check a float option here, not with typer's ``min``/``max``: NaN passes no comparison,
    so typer refused ``nan`` with the message for a too-large value (and ``-inf`` with the one
    for a too-small value), and with no ``max`` it took ``inf``. ``None`` (not given) passes.
    ``high`` left at infinity: no upper bound, but the number must still be finite;
    ``low_open`` / ``high_open``: the bound itself is refused (``--poll-interval`` > 0).

    Raises:
        InvalidArgument: NaN, an infinity, or a number outside ``low`` to ``high``.
    """
    if value is None:
        return
    above = low < value if low_open else low <= value
    below = value < high if high_open else value <= high
    if not (math.isfinite(value) and above and below):
        raise InvalidArgument(
            f"{option} must be a finite number {_range(low, high, low_open, high_open)}, "
            f"got {value!r}"
        )


def _int_bound(value: int) -> str:
    return {_INT64_MAX: "2^63-1", _INT32_MAX: "2^31-1"}.get(value, str(value))


def int_in_range(option: str, value: int | None, low: int, high: int) -> None:
    """Check an int option here, not with typer's ``min``/``max`` (which answer in a box of
    several lines): ``low`` to ``high``, both included. ``None`` (not given) passes. Every int
    option has an upper bound (found by a tester: `admission set --max-queued
    99999999999999999999` reached the database as numeric and read "SchemaOutOfDate").

    Raises:
        InvalidArgument: a number outside ``low`` to ``high``.
    """
    from pgqueue.validation import _shown

    if value is not None and not low <= value <= high:
        raise InvalidArgument(
            f"{option} must be an integer from {_int_bound(low)} to {_int_bound(high)}, "
            f"got {_shown(value, 40)}"
        )


def _check_text_arguments(fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Refuse a command's string arguments that are not valid UTF-8 text, naming the first.

    Python decodes command-line bytes that are not UTF-8 with surrogateescape, so
    `--tenant $'\\xff'` arrives as a string with a lone surrogate, which cannot be sent to
    the database or encoded anywhere (found by a tester: a UnicodeEncodeError traceback).
    Paths are left alone: a file name need not be UTF-8 to be opened; so is a ``--payload``
    given as ``@FILE`` (found by a tester: a payload file whose name is not UTF-8 was refused).

    Raises:
        InvalidArgument: "--tenant is not valid UTF-8 text".
    """
    from pgqueue.validation import is_utf8_encodable

    for name, value in kwargs.items():
        if name == "payload" and isinstance(value, str) and value.startswith("@"):
            continue  # a file name (the file's text is checked when it is read)
        if isinstance(value, str) and not is_utf8_encodable(value):
            raise InvalidArgument(f"{_parameter_name(fn, name)} is not valid UTF-8 text")


def _parameter_name(fn: Callable[..., Any], name: str) -> str:
    """How the command line spells parameter ``name`` of command ``fn``: its long option
    (``--all`` for ``all_failed``), or "argument <name>" for a positional argument."""
    import inspect
    import typing

    from typer.models import ArgumentInfo, OptionInfo

    try:
        hint = typing.get_type_hints(fn, include_extras=True).get(name)
    except Exception:  # an annotation that does not resolve: the plain spelling below
        hint = None
    for info in typing.get_args(hint)[1:] if typing.get_origin(hint) is Annotated else ():
        if isinstance(info, ArgumentInfo):
            return f"argument {name}"
        if isinstance(info, OptionInfo):
            # In Annotated, typer reads a first positional string as a declaration.
            decls = [info.default, *(info.param_decls or ())]
            spelled = [d for d in decls if isinstance(d, str) and d.startswith("--")]
            return spelled[0] if spelled else "--" + name.replace("_", "-")
    parameter = inspect.signature(fn).parameters.get(name)
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return f"argument {name}"  # typer: no default and no Option, an argument
    return "--" + name.replace("_", "-")


# The server's own words when it answered a connection and refused it: libpq writes its
# startup error as "FATAL:  <message>" (no such database or role, a failed password, no
# pg_hba.conf entry, too many clients), or "fe_sendauth: <message>" when the server asked for a
# password the client does not have.
_REFUSED_BY_SERVER = re.compile(r"\b(?:FATAL:\s+|fe_sendauth:\s+)(\S.*)")


def _connection_failure(exc: psycopg.OperationalError) -> tuple[str, str]:
    """The label and message of a failed connection: "cannot connect to Postgres" and the
    server's message when a server answered and refused it, else "cannot reach Postgres"
    (refused, no such host or socket, a timeout) and libpq's first line."""
    text = str(exc).strip()
    refused = _REFUSED_BY_SERVER.search(text)
    if refused:
        return "cannot connect to Postgres", refused.group(1).strip()
    return "cannot reach Postgres", text.splitlines()[0] if text else repr(exc)


def prepared_statements_advice(exc: psycopg.Error) -> str:
    """What to set when a prepared statement went missing or was found twice (42P05, 26000):
    the connections go through a pooler in transaction mode."""
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (
        f"{said}: the connection goes through a pooler in transaction or statement mode "
        "(PgBouncer), which moves sessions between server connections. Set "
        "PGQUEUE_PREPARE_THRESHOLD=none (psycopg then prepares nothing), or give PgBouncer >= "
        "1.21 max_prepared_statements; with --listen, use a session-mode pool or --no-listen"
    )


def _pgqueue_error(exc: psycopg.Error) -> PgqueueError | None:
    """pgqueue's own error for a ``PQxxx`` SQLSTATE raised by its SQL (a malformed
    ``pgqueue.*`` setting is ``PQ012``, :class:`InvalidSetting`), else None. Found by a
    tester: `pgqueue status` and `pgqueue metrics` said "invalid DSN or query" and exit 2 for a
    bad ``ALTER DATABASE ... SET pgqueue.default_quantum``; `pgqueue work` said InvalidSetting,
    exit 1."""
    if not (exc.sqlstate or "").startswith("PQ"):
        return None
    return from_sqlstate(
        exc.sqlstate, exc.diag.message_primary or str(exc), exc.diag.message_detail
    )


def cli_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the errors a user can meet into one line on stderr and an exit code.

    Exit 2: bad input (:class:`UsageError`, bad files, a malformed DSN). Exit 75 (EX_TEMPFAIL):
    the queue refused the job for now (:class:`AdmissionError`: ``QueueFull``,
    ``DedupeKeyHeld``); retry later. Exit 1: the environment (unreachable database, missing
    schema, a bad ``pgqueue.*`` setting, any other pgqueue or database error). A ``PQxxx``
    SQLSTATE from pgqueue's SQL is first mapped to its Python error (:func:`from_sqlstate`).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            _check_text_arguments(fn, kwargs)
            try:
                return fn(*args, **kwargs)
            except psycopg.Error as exc:
                mapped = _pgqueue_error(exc)
                if mapped is None:
                    raise
                raise mapped from exc
        except typer.Exit:
            raise
        except BrokenPipeError:  # before OSError: stdout's reader went away
            _stdout_closed()
        except UsageError as exc:
            _say(type(exc).__name__, str(exc))
            raise typer.Exit(2) from None
        except AdmissionError as exc:
            _say(type(exc).__name__, str(exc))
            raise typer.Exit(75) from None
        except PgqueueError as exc:
            _say(type(exc).__name__, str(exc))
            raise typer.Exit(1) from None
        except psycopg.OperationalError as exc:
            if exc.sqlstate:
                # The server answered a statement (a lock or statement timeout, a shutdown):
                # it was reached. A failed connection carries no SQLSTATE.
                _say("database error", exc.diag.message_primary or str(exc))
            else:
                _say(*_connection_failure(exc))
            raise typer.Exit(1) from None
        except (
            psycopg.errors.UndefinedTable,
            psycopg.errors.InvalidSchemaName,
            psycopg.errors.UndefinedFunction,
            psycopg.errors.UndefinedColumn,
        ) as exc:
            said = exc.diag.message_primary or type(exc).__name__
            if numeric_argument(said):  # an int beyond 64 bits, sent as numeric: bad input
                _say(
                    "InvalidArgument",
                    f"a number is out of range (beyond 64-bit integers): {said}",
                )
                raise typer.Exit(2) from None
            # pgqueue's own statements found no such object: the schema is missing, or it was
            # changed under a running command (found by a tester: a downgrade under running
            # workers said "invalid DSN or query" and exit 2).
            _say(
                "SchemaOutOfDate",
                "the pgqueue schema here is missing or not the one this pgqueue expects "
                f"({said}); run `pgqueue migrate`",
            )
            raise typer.Exit(1) from None
        except psycopg.errors.NumericValueOutOfRange as exc:
            _say("InvalidArgument", exc.diag.message_primary or str(exc))
            raise typer.Exit(2) from None
        except (psycopg.errors.InvalidCatalogName, psycopg.errors.InsufficientPrivilege) as exc:
            # 3D000 from a statement (CREATE DATABASE ... TEMPLATE, a database dropped under
            # `pgqueue simulate` or `demo`) and 42501 (a role without CREATEDB running
            # `simulate`, without a grant or outside its row-level security): psycopg files
            # them under ProgrammingError, which read "invalid DSN or query", exit 2. A missing
            # database or a missing privilege is the environment: exit 1, as for a database
            # missing at connect (an OperationalError: "cannot connect to Postgres").
            _say("database error", exc.diag.message_primary or str(exc))
            raise typer.Exit(1) from None
        except (
            psycopg.errors.DuplicatePreparedStatement,
            psycopg.errors.InvalidSqlStatementName,
        ) as exc:
            # 42P05 / 26000 on psycopg's own prepared statements (_pg3_N): a pooler in
            # transaction mode runs each transaction on any server connection (found by a fault
            # run: behind PgBouncer, a worker exited 2 with "invalid DSN or query").
            _say("prepared statements not kept", prepared_statements_advice(exc))
            raise typer.Exit(2) from None
        except psycopg.ProgrammingError as exc:
            _say("invalid DSN or query", str(exc).strip().splitlines()[0])
            raise typer.Exit(2) from None
        except psycopg.Error as exc:
            _say("database error", exc.diag.message_primary or str(exc))
            raise typer.Exit(1) from None
        except sqlalchemy.exc.DBAPIError as exc:  # a migration's statement failed (alembic)
            orig = exc.orig
            message = orig.diag.message_primary if isinstance(orig, psycopg.Error) else None
            _say("database error", message or str(orig or exc).strip().splitlines()[0])
            raise typer.Exit(1) from None
        except OSError as exc:
            _say(type(exc).__name__, str(exc))
            raise typer.Exit(2) from None
        except UnicodeEncodeError as exc:  # text from elsewhere than the arguments (checked)
            _say("InvalidArgument", f"text that is not valid UTF-8: {exc}")
            raise typer.Exit(2) from None

    return wrapper


def _settings(**overrides: Any) -> Settings:
    import pydantic

    try:
        return load_settings(**overrides)
    except pydantic.ValidationError as exc:
        # One line: pydantic's own text takes three per error, and a link.
        _say("invalid settings", "; ".join(_setting_error(e) for e in exc.errors()))
        raise typer.Exit(2) from None
    except ValueError as exc:
        _say("invalid settings", str(exc))
        raise typer.Exit(2) from None


def _setting_error(error: Any) -> str:
    """One error of pydantic's as "field: message (got 'value')" (env names hold the field
    name: PGQUEUE_<FIELD>); a rule over several fields has no field."""
    from pgqueue.validation import _shown

    field = ".".join(str(part) for part in error.get("loc", ()))
    text = f"{field}: {error['msg']}" if field else error["msg"]
    if field and "input" in error:
        text += f" (got {_shown(error['input'], 40)})"
    return text


def _dsn(settings: Settings, dsn: str | None) -> str:
    from pgqueue.db.connect import resolve_dsn

    return resolve_dsn(settings, dsn)


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
) -> None:
    """Configure logging for every command."""
    handler = logging.StreamHandler()
    handler.setFormatter(_PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])


# The commands register themselves on `app` when imported.
# Registered in this order, which is the order of `pgqueue --help`.
# isort: off
from pgqueue.cli import admin, jobs, browse, run, experiments, embedded, batches  # noqa: E402, F401
# isort: on
