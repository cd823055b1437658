"""``pgqueue dashboard``: a live web view of the queue, with operator actions behind a token.

:mod:`~pgqueue.dashboard.data` reads (the views ``pgqueue status`` reads, by named queries),
:mod:`~pgqueue.dashboard.guard` keeps it safe (admin token, CSRF, allowed hosts),
:mod:`~pgqueue.dashboard.actions` writes (each action one named SQL function),
:mod:`~pgqueue.dashboard.app` is the Starlette app and its pages (Jinja templates, autoescaped),
:mod:`~pgqueue.dashboard.server` runs it under uvicorn.
"""

from pgqueue.dashboard.app import DashboardConfig, create_app

__all__ = ["DashboardConfig", "create_app"]
