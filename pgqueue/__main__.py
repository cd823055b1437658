"""The ``pgqueue`` command's entry point (and ``python -m pgqueue``): the typer app, with a
Ctrl-C while the command line is still loading reported in one line.

Found by a tester: Ctrl-C in the first second of a command (typer, rich, psycopg and the
commands being imported) printed a ``KeyboardInterrupt`` traceback. It now prints
"interrupted" and exits 130, as a Ctrl-C during a command does (typer's exit code; the demo
prints "interrupted" too). The import of the ``pgqueue`` package itself comes before this
module; the ``pgqueue`` command runs it from ``_pgqueue_launcher`` (outside the package), which
catches a Ctrl-C there too; ``python -m pgqueue`` cannot.
"""

from __future__ import annotations

import sys

#: The exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED_EXIT = 130


def main() -> None:
    """Run the ``pgqueue`` command line; a Ctrl-C before the command starts prints
    "interrupted" on stderr and exits :data:`INTERRUPTED_EXIT` (no traceback).

    Raises:
        SystemExit: always, with the command's exit status.
    """
    from _pgqueue_launcher import stop_servers_on_sigterm

    stop_servers_on_sigterm(sys.argv)  # (again, for `python -m pgqueue`)
    try:
        from pgqueue.cli import app

        app()
    except KeyboardInterrupt:
        # Ctrl-C during a command's run is typer's: exit 130. This is the one before it.
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
        raise SystemExit(INTERRUPTED_EXIT) from None


if __name__ == "__main__":
    main()
