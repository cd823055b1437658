"""Where the database is: ``PGQUEUE_DSN`` / ``--dsn``, else the embedded server."""

from __future__ import annotations

from pgqueue.db.embedded import embedded_dsn
from pgqueue.settings import Settings


def resolve_dsn(settings: Settings, dsn: str | None = None) -> str:
    """The DSN to use: an explicit one, else ``settings.dsn``, else the embedded server's.

    Raises:
        EmbeddedPostgresError: no DSN was given and the embedded server could not start.
    """
    chosen = dsn or settings.dsn
    if chosen:
        return chosen
    return embedded_dsn(settings.embedded_data_dir)
