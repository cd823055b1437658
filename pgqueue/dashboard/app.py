"""The dashboard's Starlette app: pages (overview, tenants, schedule, jobs, one job), the
login that unlocks actions, and the actions.

Every page is a Jinja template rendered with autoescape on, so a tenant id or payload holding
``<script>`` shows as text. A page's live part is re-fetched every ``refresh_seconds`` by
``static/dashboard.js`` (the same URL with ``fragment=1``). Responses carry a Content Security
Policy that allows only the dashboard's own script and style (no inline script), so escaped
text is not the only line of defence. Reads run on a small pool of autocommit connections;
each action is one transaction (:mod:`pgqueue.dashboard.actions`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import psycopg
from jinja2 import Environment, PackageLoader
from psycopg_pool import ConnectionPool
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pgqueue.dashboard import actions, data
from pgqueue.dashboard.guard import CSRF_FIELD, Guard, Refused
from pgqueue.errors import DedupeKeyHeld, PgqueueError, UnknownJob, UsageError
from pgqueue.models import JobState, Tier
from pgqueue.observability.jobs import JobFilter, job_detail, list_jobs

#: A form body larger than this is refused (the forms hold a few short fields).
MAX_FORM_BYTES = 16_384
#: Jobs per page of the jobs list.
JOBS_PER_PAGE = 50
#: Jain's index is read again when a page finds it older than this (in the background).
FAIRNESS_MAX_AGE_SECONDS = 10.0

log = logging.getLogger(__name__)

_SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}

#: What a finished action says on the page it returns to (by code: nothing from the request
#: is echoed but numbers).
_DONE = {
    "cancelled": "Job cancelled.",
    "finished": "The job had already finished; left as it is.",
    "retried": "Job put back in the queue.",
    "not-retried": "Only a failed or cancelled job can be retried; left as it is.",
    "redriven": "Failed jobs re-queued: {n}.",
    "redriven-skipped": (
        "Failed jobs re-queued: {n}. Left failed: {m}, whose dedupe key a live job holds."
    ),
    "tenant": "Tenant saved.",
    "login": "Actions unlocked.",
    "logout": "Logged out: read-only.",
}


@dataclass(frozen=True)
class DashboardConfig:
    """How one dashboard runs.

    Args:
        dsn: the database.
        token: the admin token; None makes the dashboard read-only.
        refresh_seconds: how often pages refresh their live part; 0 turns it off.
        window_seconds: the latency and fairness window (as ``pgqueue status --window``).
        allowed_hosts: the ``Host`` names served (others get 400, against DNS rebinding).
        pool_size: connections at most.
    """

    dsn: str
    token: str | None = None
    refresh_seconds: float = 3.0
    window_seconds: float = 300.0
    allowed_hosts: tuple[str, ...] = field(default=("127.0.0.1", "localhost"))
    pool_size: int = 4


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("pgqueue.dashboard", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["secs"] = lambda v: "-" if v is None else f"{v:.2f}"
    env.filters["pct"] = lambda v: "-" if v is None else f"{100 * v:.1f} %"
    env.filters["jain"] = lambda v: "no data" if v is None else f"{v:.3f}"
    env.filters["num"] = lambda v: "-" if v is None else f"{v:,.0f}"
    # JSON as plain text (autoescape escapes it), not tojson's Markup with \u003c escapes
    env.filters["pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False, default=str)
    env.filters["when"] = lambda v: "-" if v is None else v.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return env


class Dashboard:
    """The app's state: config, guard, templates, the connection pool."""

    def __init__(self, config: DashboardConfig) -> None:
        self.config = config
        self.guard = Guard(config.token)
        self.env = _environment()
        self.pool = ConnectionPool(
            config.dsn,
            min_size=1,
            max_size=config.pool_size,
            kwargs={"autocommit": True, "application_name": "pgqueue-dashboard"},
            timeout=10.0,  # a page waits this long for a connection, then answers 503
            open=False,
        )
        # the connections of the pages and actions under way (cancel_statements cancels them)
        self._in_use: set[psycopg.Connection[Any]] = set()
        self._in_use_lock = threading.Lock()
        self.stopping = False
        self._fairness_read: tuple[float, dict[str, Any]] | None = None
        self._fairness_lock = threading.Lock()
        self.executor = ThreadPoolExecutor(
            max_workers=config.pool_size, thread_name_prefix="pgqueue-dashboard"
        )

    # --- connections

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one page part or action; :meth:`cancel_statements` cancels
        its statement. Raises ``psycopg.errors.QueryCanceled`` once the dashboard is stopping
        (the page answers 503)."""
        with self.pool.connection() as conn:
            with self._in_use_lock:
                if self.stopping:
                    raise psycopg.errors.QueryCanceled("the dashboard is stopping")
                self._in_use.add(conn)
            try:
                yield conn
            finally:
                with self._in_use_lock:
                    self._in_use.discard(conn)

    def cancel_statements(self) -> None:
        """The server is stopping: cancel the statements of the pages and actions under way
        (they answer 503; an action's transaction rolls back) and start no more. Found by a
        tester: a page whose query waited for a lock held the stop for as long as the lock,
        then ended in a CancelledError traceback."""
        with self._in_use_lock:
            self.stopping = True
            running = list(self._in_use)
        for conn in running:
            with contextlib.suppress(psycopg.Error):
                conn.cancel_safe(timeout=2.0)

    # --- rendering

    def render(
        self, request: Request, page: str, title: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        """The page ``page`` (its live part alone when ``fragment=1``), with the CSRF cookie."""
        csrf, new = self.guard.csrf_token(request)
        done = _DONE.get(request.query_params.get("done", ""), "")
        n = request.query_params.get("n", "")
        m = request.query_params.get("m", "")
        context = {
            **context,
            "request": request,
            "title": title,
            "page": page,
            "csrf": csrf,
            "csrf_field": CSRF_FIELD,
            "actions_enabled": self.guard.actions_enabled,
            "admin": self.guard.is_admin(request),
            "refresh_seconds": self.config.refresh_seconds,
            "done": done.format(n=int(n) if n.isdigit() else 0, m=int(m) if m.isdigit() else 0),
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        }
        fragment = request.query_params.get("fragment") == "1"
        name = f"parts/{page}.html" if fragment else "page.html"
        body = self.env.get_template(name).render(context)
        response = HTMLResponse(body, status_code=status, headers=_SECURITY_HEADERS)
        if new:
            self.guard.set_csrf(response, csrf)
        return response

    def refused(self, request: Request, status: int, message: str) -> Response:
        return self.render(request, "message", "Refused", {"message": message}, status=status)

    # --- pages

    def overview(self, request: Request) -> Response:
        # The parts side by side, each on a connection of its own: the page takes as long as
        # the slowest part, not their sum (bench/dashboard.py).
        window = self.config.window_seconds
        futures = [self.executor.submit(self._read, part, window) for part in data.OVERVIEW_PARTS]
        found: dict[str, Any] = self._fairness()
        for future in futures:
            found.update(future.result())
        return self.render(request, "overview", "Overview", found)

    def _fairness(self) -> dict[str, Any]:
        """Jain's index, read at most every :data:`FAIRNESS_MAX_AGE_SECONDS`: a page that finds
        it older shows it as it is (with its age) and has it read again in the background, so
        no page waits for it but the first. Its query scans the queued jobs and the window's
        served jobs: 0.25-0.5 s at 1M jobs on a busy 2-core machine (docs/dashboard.md)."""
        now = time.monotonic()
        cached = self._fairness_read
        if cached is None:
            cached = (now, self._read(data.fairness, self.config.window_seconds))
            self._fairness_read = cached
        elif now - cached[0] > FAIRNESS_MAX_AGE_SECONDS and self._fairness_lock.acquire(
            blocking=False
        ):
            self.executor.submit(self._refresh_fairness)
        return {**cached[1], "fairness_age_seconds": now - cached[0]}

    def _refresh_fairness(self) -> None:
        try:
            value = self._read(data.fairness, self.config.window_seconds)
            self._fairness_read = (time.monotonic(), value)
        except Exception:  # the next page tries again; its error is the page's to show
            if not self.stopping:  # (cancelled by the stop)
                log.warning("reading Jain's index failed", exc_info=True)
        finally:
            self._fairness_lock.release()

    def _read(self, part: Callable[..., dict[str, Any]], window_seconds: float) -> dict[str, Any]:
        with self.connection() as conn:
            return part(conn, window_seconds=window_seconds)

    def tenants(self, request: Request) -> Response:
        with self.connection() as conn:
            rows = data.tenants(conn, window_seconds=self.config.window_seconds)
        context = {"tenants": rows, "window_seconds": self.config.window_seconds}
        return self.render(request, "tenants", "Tenants", context)

    def schedule(self, request: Request) -> Response:
        with self.connection() as conn:
            found = data.schedule(conn)
        return self.render(request, "schedule", "Schedule", found)

    def jobs(self, request: Request) -> Response:
        q = request.query_params
        form = {k: q.get(k, "") for k in ("state", "tenant", "tier", "kind")}
        try:
            where = JobFilter.checked(
                state=form["state"], tenant_id=form["tenant"], tier=form["tier"], kind=form["kind"]
            )
            before = q.get("before", "")
            before_id = actions.parse_job_id(before) if before else None
        except UsageError as exc:
            return self.refused(request, 400, str(exc))
        with self.connection() as conn:
            rows = list_jobs(conn, where, limit=JOBS_PER_PAGE, before_id=before_id)
        older = None
        if len(rows) == JOBS_PER_PAGE:
            kept = {k: v for k, v in form.items() if v}
            older = "/jobs?" + urlencode({**kept, "before": rows[-1]["id"]})
        context = {
            "jobs": rows,
            "form": form,
            "states": [s.value for s in JobState],
            "tiers": [t.value for t in Tier],
            "older": older,
        }
        return self.render(request, "jobs", "Jobs", context)

    def job(self, request: Request) -> Response:
        job_id: int = request.path_params["job_id"]
        try:
            with self.connection() as conn:
                found = job_detail(conn, job_id)
        except UsageError as exc:
            return self.refused(request, 400, str(exc))
        if found is None:
            return self.refused(request, 404, f"No job {job_id}.")
        return self.render(request, "job", f"Job {job_id}", {"job": found})

    # --- login and actions

    async def _form(self, request: Request) -> dict[str, str]:
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            raise Refused(400, "refused: the form is too large")
        try:
            return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "refused: the form is not readable") from None

    async def login(self, request: Request) -> Response:
        try:
            form = await self._form(request)
            self.guard.check_post(request, form, admin=False)
        except Refused as exc:
            return self.refused(request, exc.status, exc.message)
        if not self.guard.token_matches(form.get("token", "")):
            return self.refused(request, 403, "refused: that is not the admin token")
        response = RedirectResponse(_back(form, "login"), status_code=303)
        self.guard.grant_admin(response)
        return response

    async def logout(self, request: Request) -> Response:
        try:
            form = await self._form(request)
            self.guard.check_post(request, form, admin=False)
        except Refused as exc:
            return self.refused(request, exc.status, exc.message)
        response = RedirectResponse(_back(form, "logout"), status_code=303)
        self.guard.revoke_admin(response)
        return response

    async def action(self, request: Request) -> Response:
        name = request.path_params["name"]
        run = _ACTIONS.get(name)
        if run is None:
            return self.refused(request, 404, "No such action.")
        try:
            form = await self._form(request)
            self.guard.check_post(request, form)
        except Refused as exc:
            return self.refused(request, exc.status, exc.message)
        from starlette.concurrency import run_in_threadpool

        try:
            target = await run_in_threadpool(self._run_action, run, form)
        except UnknownJob as exc:
            return self.refused(request, 404, str(exc))
        except UsageError as exc:
            return self.refused(request, 400, str(exc))
        except DedupeKeyHeld as exc:  # a raw unique violation, a 500, before revision 0070
            return self.refused(request, 409, str(exc))
        except psycopg.errors.CheckViolation as exc:
            return self.refused(request, 400, exc.diag.message_primary or "refused by the table")
        return RedirectResponse(target, status_code=303)

    def _run_action(
        self, run: Callable[[psycopg.Connection[Any], dict[str, str]], str], form: dict[str, str]
    ) -> str:
        with self.connection() as conn:
            return run(conn, form)


def _back(form: dict[str, str], done: str, n: int | None = None, m: int | None = None) -> str:
    """Where to go after a form: its ``next`` field when it is a path of this site, else the
    overview; with the ``done`` code (and counts) for the message."""
    target = form.get("next", "/")
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        target = "/"
    path = target.split("?", 1)[0]
    params = dict(parse_qsl(target.split("?", 1)[1])) if "?" in target else {}
    for key in ("done", "n", "m", "fragment"):
        params.pop(key, None)
    params["done"] = done
    if n is not None:
        params["n"] = str(n)
    if m is not None:
        params["m"] = str(m)
    return f"{path}?{urlencode(params)}"


def _cancel(conn: psycopg.Connection[Any], form: dict[str, str]) -> str:
    job_id = actions.parse_job_id(form.get("job_id", ""))
    state = actions.cancel_job(conn, job_id, form.get("reason", "").strip() or None)
    return _back({"next": f"/jobs/{job_id}"}, "cancelled" if state == "cancelled" else "finished")


def _retry(conn: psycopg.Connection[Any], form: dict[str, str]) -> str:
    job_id = actions.parse_job_id(form.get("job_id", ""))
    state = actions.retry(conn, job_id)
    return _back({"next": f"/jobs/{job_id}"}, "retried" if state == "queued" else "not-retried")


def _redrive(conn: psycopg.Connection[Any], form: dict[str, str]) -> str:
    n, skipped = actions.redrive(
        conn, form.get("tenant_id", ""), form.get("tier", "").strip() or None
    )
    if skipped:
        return _back({"next": "/tenants"}, "redriven-skipped", n, skipped)
    return _back({"next": "/tenants"}, "redriven", n)


def _tenant(conn: psycopg.Connection[Any], form: dict[str, str]) -> str:
    actions.configure_tenant(
        conn,
        form.get("tenant_id", ""),
        form.get("plan", "").strip(),
        form.get("quantum", "").strip(),
    )
    return _back({"next": "/tenants"}, "tenant")


_ACTIONS: dict[str, Callable[[psycopg.Connection[Any], dict[str, str]], str]] = {
    "cancel": _cancel,
    "retry": _retry,
    "redrive": _redrive,
    "tenant": _tenant,
}


def create_app(config: DashboardConfig) -> Starlette:
    """The dashboard as an ASGI app; its connection pool opens at startup (lifespan) and
    closes at shutdown. Database errors on a page answer 503 with the database's message."""
    board = Dashboard(config)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        from starlette.concurrency import run_in_threadpool

        await run_in_threadpool(board.pool.open)
        try:
            yield
        finally:
            board.executor.shutdown(wait=True)
            await run_in_threadpool(board.pool.close)

    async def database_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, PgqueueError):  # SchemaOutOfDate and the like
            return board.refused(request, 503, f"{type(exc).__name__}: {exc}")
        message = exc.diag.message_primary if isinstance(exc, psycopg.Error) else None
        return board.refused(request, 503, f"database error: {message or exc}")

    static = Path(__file__).with_name("static")
    routes = [
        Route("/", board.overview),
        Route("/tenants", board.tenants),
        Route("/schedule", board.schedule),
        Route("/jobs", board.jobs),
        Route("/jobs/{job_id:int}", board.job),
        Route("/login", board.login, methods=["POST"]),
        Route("/logout", board.logout, methods=["POST"]),
        Route("/actions/{name}", board.action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=static), name="static"),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(config.allowed_hosts))]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={psycopg.Error: database_error, PgqueueError: database_error},
    )
    app.state.dashboard = board
    return app
