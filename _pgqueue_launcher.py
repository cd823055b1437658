"""The ``pgqueue`` command's launcher: a module outside the ``pgqueue`` package, so that a
Ctrl-C while the package itself imports (about 0.8 s of a command's first second: its
``__init__`` imports the enqueue API, psycopg, SQLAlchemy's ORM, pydantic) is caught too.

Found by a tester: Ctrl-C in a command's first second printed a ``KeyboardInterrupt``
traceback. It prints "interrupted" and exits 130 (:mod:`pgqueue.__main__`, which
``python -m pgqueue`` runs, catches the rest of the start-up).
"""

from __future__ import annotations

import os
import signal
import sys

#: The commands that serve until stopped: a SIGTERM is their normal end, exit 0.
SERVERS = frozenset({"sandbox", "dashboard"})


def _stopped(signum: int, frame: object) -> None:
    # Ends the process at once rather than raising SystemExit: an exception a signal handler
    # raises while a finalizer runs (gc during the imports) is printed and dropped, and the
    # command would serve on, deaf to the SIGTERM (the likely cause of one such hang of the
    # suite under load). Nothing needs closing yet: the server replaces this handler first.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def stop_servers_on_sigterm(argv: list[str]) -> None:
    """For ``pgqueue sandbox`` and ``pgqueue dashboard`` (``argv``'s first word not an
    option), make a SIGTERM while the command loads end it with exit 0, as one while it serves
    does (found by a tester: in the first 1-3 s, before the server's own handler was
    installed, it killed them, exit 143). The server replaces this handler as it starts."""
    command = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
    if command in SERVERS:
        signal.signal(signal.SIGTERM, _stopped)


def main() -> None:
    """Run the ``pgqueue`` command line (:func:`pgqueue.__main__.main`); a Ctrl-C while it
    loads prints "interrupted" and exits 130.

    Raises:
        SystemExit: always, with the command's exit status.
    """
    stop_servers_on_sigterm(sys.argv)
    try:
        from pgqueue.__main__ import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
        raise SystemExit(130) from None  # pgqueue.__main__.INTERRUPTED_EXIT, not imported yet
    run()


if __name__ == "__main__":
    main()
