"""Fixtures of the dashboard tests: a dashboard served on a test database, jobs in three tiers,
an HTTP client that keeps cookies, and a headless Chromium (Debian's chromium and
chromium-driver, driven by selenium; nothing is downloaded).

Without Chromium the browser tests are skipped, except in CI (``CI=true``), where a missing
browser fails them: ``.ci/run`` installs it.
"""

from __future__ import annotations

import http.cookiejar
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.dashboard.app import DashboardConfig
from pgqueue.dashboard.server import running_dashboard
from pgqueue.db import queries

TOKEN = "test-admin-token-0123456789"
SCRIPT_TENANT = "<script>window.__pwned_tenant=1</script>"
SCRIPT_TEXT = "<script>window.__pwned_payload=1</script>"
MODEL = "claude-haiku-4-5"
#: Queued jobs per tier that :func:`seed` makes (critical, standard, batch).
QUEUED = {"critical": 3, "standard": 4, "batch": 5}


def _payload(text: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": text}]}


@dataclass
class Seeded:
    """Ids of the jobs :func:`seed` made."""

    by_tier: dict[str, list[int]]
    script_job: int
    noop_job: int


def seed(dsn: str) -> Seeded:
    """Queued jobs in three tiers from three tenants (one named with a <script> tag, whose
    payload holds one too), a queued no-op job (another lane), finished jobs for the latency
    table, a model's limits, and throttle events that demote tenant "acme"."""
    by_tier: dict[str, list[int]] = {t: [] for t in QUEUED}
    origin = {
        "critical": ("user_action", None),
        "standard": ("scheduled", 60.0),
        "batch": ("batch_job", None),
    }
    tenants = ["acme", "globex", "initech"]
    with psycopg.connect(dsn) as conn:
        for tier, n in QUEUED.items():
            for i in range(n):
                o, sla = origin[tier]
                job_id = pgqueue.enqueue(
                    conn,
                    tenant_id=tenants[i % 3],
                    origin=o,
                    sla_seconds=sla,
                    payload=_payload(f"{tier} job {i}"),
                )
                assert job_id is not None
                by_tier[tier].append(job_id)
        script_job = pgqueue.enqueue(
            conn, tenant_id=SCRIPT_TENANT, origin="batch_job", payload=_payload(SCRIPT_TEXT)
        )
        noop_job = pgqueue.enqueue(
            conn, tenant_id="acme", origin="batch_job", payload={"n": 1}, kind="pgqueue.noop"
        )
        assert script_job is not None and noop_job is not None
        by_tier["batch"].append(script_job)
        by_tier["batch"].append(noop_job)
        for tier, seconds in (("critical", 0.8), ("standard", 4.0), ("batch", 30.0)):
            conn.execute(
                "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, state, payload,"
                " enqueued_at, started_at, finished_at)"
                " VALUES ('globex', 'user_action', %s::pgqueue.tier, 'succeeded', '{}',"
                " now() - make_interval(secs => %s), now(), now())",
                (tier, seconds),
            )
        queries.run(conn, "ratelimit_set", {"model": MODEL, "rpm": 50, "itpm": 40000, "otpm": 8000})
        for _ in range(5):
            conn.execute(
                "INSERT INTO pgqueue.throttle_events (tenant_id, model, status_code,"
                " retry_after_seconds) VALUES ('acme', %s, 429, 2)",
                (MODEL,),
            )
        conn.commit()
    return Seeded(by_tier, script_job, noop_job)


def job_state(dsn: str, job_id: int) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT state::text FROM pgqueue.jobs WHERE id = %s", (job_id,))
        found = row.fetchone()
    assert found is not None
    return str(found[0])


@pytest.fixture
def seeded(db_dsn: str) -> Seeded:
    return seed(db_dsn)


@pytest.fixture
def board(db_dsn: str) -> Iterator[str]:
    """A dashboard with the admin token, refreshing every 0.5 s; its base URL."""
    config = DashboardConfig(dsn=db_dsn, token=TOKEN, refresh_seconds=0.5)
    with running_dashboard(config) as url:
        yield url


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Client:
    """An HTTP client with a cookie jar; answers (status, headers, body) without raising."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), NoRedirect()
        )

    def request(
        self, path: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        from urllib.parse import urlencode

        body = None if form is None else urlencode(form).encode()
        req = urllib.request.Request(self.base + path, data=body, headers=headers or {})
        try:
            with self.opener.open(req, timeout=10) as answer:
                return answer.status, dict(answer.headers), answer.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read().decode()

    def cookie(self, name: str) -> str | None:
        return next((c.value for c in self.jar if c.name == name), None)

    def post(
        self, path: str, form: dict[str, str], **headers: str
    ) -> tuple[int, dict[str, str], str]:
        """POST ``form`` with this client's CSRF token and the dashboard's own Origin."""
        if self.cookie("pgqueue_csrf") is None:
            self.request("/")
        full = {"csrf": self.cookie("pgqueue_csrf") or "", **form}
        return self.request(path, full, {"Origin": self.base, **headers})


@pytest.fixture
def client(board: str) -> Client:
    return Client(board)


def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A headless Chromium under selenium, with a fresh profile; skipped (failed in CI) when
    Debian's chromium and chromium-driver are not installed."""
    found = _chromium()
    if found is None:
        message = (
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium must never try to download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=found[1]))
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: Any, name: str) -> None:
    """Save a screenshot as ``dashboard-<name>.png`` in PGQUEUE_DASHBOARD_SCREENSHOTS (a
    folder; the README's come from ``PGQUEUE_DASHBOARD_SCREENSHOTS=docs``), when it is set."""
    folder = os.environ.get("PGQUEUE_DASHBOARD_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"dashboard-{name}.png"))
