"""The ``pgqueue`` command's launcher: a module outside the ``pgqueue`` package, so that a
Ctrl-C while the package itself imports (about 0.8 s of a command's first second: its
``__init__`` imports the enqueue API, psycopg, SQLAlchemy's ORM, pydantic) is caught too.

Found by a tester: Ctrl-C in a command's first second printed a ``KeyboardInterrupt``
traceback. It prints "interrupted" and exits 130 (:mod:`pgqueue.__main__`, which
``python -m pgqueue`` runs, catches the rest of the start-up).
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run the ``pgqueue`` command line (:func:`pgqueue.__main__.main`); a Ctrl-C while it
    loads prints "interrupted" and exits 130.

    Raises:
        SystemExit: always, with the command's exit status.
    """
    try:
        from pgqueue.__main__ import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
        raise SystemExit(130) from None
    run()


if __name__ == "__main__":
    main()
