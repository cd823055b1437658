"""The dashboard in a real headless browser (Chromium via selenium): the overview with jobs in
three tiers, filtering jobs and opening one, cancelling with and without the admin token,
and a tenant id and a payload holding <script> shown as text."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.dashboard.conftest import (
    MODEL,
    QUEUED,
    SCRIPT_TENANT,
    SCRIPT_TEXT,
    TOKEN,
    Client,
    Seeded,
    job_state,
    screenshot,
)

pytestmark = pytest.mark.timeout(90)


def _wait(driver: Any) -> WebDriverWait:
    return WebDriverWait(driver, 15)


# The live part is replaced every 0.5 s: elements found in it go stale, so its text is read
# in one script call, and a click in it is retried on a fresh element.
def _text(driver: Any, css: str) -> str:
    return str(driver.execute_script("return document.querySelector(arguments[0]).innerText", css))


def _cells(driver: Any, css: str, cell: str = "td, th") -> list[list[str]]:
    """The texts of the cells of each element matching ``css`` (rows), read at one moment."""
    script = (
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(r => Array.from(r.querySelectorAll(arguments[1])).map(c => c.innerText.trim()))"
    )
    return list(driver.execute_script(script, css, cell))


def _click_link(driver: Any, text: str) -> None:
    def click(d: Any) -> bool:
        d.find_element(By.LINK_TEXT, text).click()
        return True

    WebDriverWait(driver, 15, ignored_exceptions=[StaleElementReferenceException]).until(click)


def test_overview_shows_depth_in_three_tiers_and_refreshes(
    browser, board, db_dsn: str, seeded: Seeded
):
    browser.get(board + "/")
    [footer] = _cells(browser, "#depth tfoot tr:first-child", "th.n")
    # queued, running per tier: critical, standard, batch (+ the <script> job and a no-op job)
    assert footer == [
        str(QUEUED["critical"]),
        "0",
        str(QUEUED["standard"]),
        "0",
        str(QUEUED["batch"] + 2),
        "0",
    ]
    lanes = [row[0] for row in _cells(browser, "#depth tbody tr")]
    assert lanes == [MODEL, "pgqueue.noop"]
    latency = {row[0]: row for row in _cells(browser, "#latency tbody tr")}
    assert set(latency) == {"critical", "standard", "batch"}
    assert latency["critical"][4] == "0.80"  # p99 of the one finished critical job
    p99_classes = browser.execute_script(
        "return Array.from(document.querySelectorAll('#latency tbody tr'))"
        ".map(r => r.querySelectorAll('td')[4].className)"
    )
    assert p99_classes == ["n slo-ok", "n slo-ok", "n slo-ok"]
    assert _text(browser, "#throttles-total") == "5"
    assert _text(browser, "#demoted-total") == "1"
    assert MODEL in _text(browser, "#models")
    assert "Jain's fairness index" in _text(browser, "#jain")
    # the live part is fetched again without a reload
    _wait(browser).until(
        lambda d: int(d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshed") or 0) >= 2
    )
    assert _text(browser, "#throttles-total") == "5"
    screenshot(browser, "overview")
    browser.get(board + "/tenants")
    assert "acme" in _text(browser, "#tenants")
    screenshot(browser, "tenants")
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # a claim's fold stamps them
        conn.execute("SELECT pgqueue.fold(u.lane, u.tier) FROM pgqueue.lane_tiers_due() u")
    browser.get(board + "/schedule")
    [headers] = _cells(browser, "#schedule thead tr", "th")
    rows = _cells(browser, "#schedule tbody tr")
    assert len(rows) == sum(QUEUED.values()) + 2  # every due job, stamped for the page
    assert rows[0][headers.index("tier")] == "critical"
    # docs/dashboard-schedule.png comes from bench/schedule_screenshot.py (a realistic load)


def test_filter_jobs_and_open_one(browser, board, seeded: Seeded):
    browser.get(board + "/jobs")
    Select(browser.find_element(By.ID, "f-state")).select_by_visible_text("queued")
    Select(browser.find_element(By.ID, "f-tier")).select_by_visible_text("batch")
    browser.find_element(By.ID, "f-tenant").send_keys("acme")
    browser.find_element(By.ID, "f-apply").click()
    _wait(browser).until(ec.url_contains("tier=batch"))
    rows = _cells(browser, "#jobs tbody tr")
    ids = [int(r[0]) for r in rows]
    acme_batch = [seeded.by_tier["batch"][i] for i in (0, 3)] + [seeded.noop_job]
    assert ids == sorted(acme_batch, reverse=True)
    for r in rows:
        assert r[1:4] == ["acme", "batch", "queued"]
    screenshot(browser, "jobs")
    _click_link(browser, str(ids[-1]))
    _wait(browser).until(ec.url_contains(f"/jobs/{ids[-1]}"))
    assert _text(browser, "#job-state") == "queued"
    assert _text(browser, "#job-tenant") == "acme"
    assert '"batch job 0"' in _text(browser, "#payload")
    assert "enqueued" in _text(browser, "#timeline")
    screenshot(browser, "job")


def test_cancel_needs_the_token(browser, board, seeded: Seeded, db_dsn):
    job_id = seeded.by_tier["critical"][0]
    # Without the token: no button, and a forged POST (right CSRF token, own Origin) is refused.
    browser.get(f"{board}/jobs/{job_id}")
    assert not browser.find_elements(By.ID, "cancel")
    status, _, body = Client(board).post("/actions/cancel", {"job_id": str(job_id)})
    assert status == 403
    assert "actions need the admin token" in body
    # A wrong token unlocks nothing.
    browser.find_element(By.ID, "token").send_keys("not-the-token-at-all")
    browser.find_element(By.ID, "unlock").click()
    _wait(browser).until(ec.presence_of_element_located((By.ID, "message")))
    assert "not the admin token" in _text(browser, "#message")
    assert job_state(db_dsn, job_id) == "queued"
    # With it: unlock, cancel, see the job cancelled.
    browser.get(f"{board}/jobs/{job_id}")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "unlock").click()
    _wait(browser).until(ec.presence_of_element_located((By.ID, "cancel")))
    assert _text(browser, "#mode") == "actions unlocked"
    browser.find_element(By.CSS_SELECTOR, "#cancel-form input[name=reason]").send_keys(
        "from the test"
    )
    browser.find_element(By.ID, "cancel").click()
    _wait(browser).until(ec.text_to_be_present_in_element((By.ID, "done"), "Job cancelled."))
    assert _text(browser, "#job-state") == "cancelled"
    assert _text(browser, "#job-error") == "cancelled: from the test"
    assert job_state(db_dsn, job_id) == "cancelled"
    screenshot(browser, "cancelled")
    browser.find_element(By.ID, "lock").click()  # the next test starts read-only again
    _wait(browser).until(ec.presence_of_element_located((By.ID, "unlock")))


def test_script_in_tenant_and_payload_is_text(browser, board, seeded: Seeded):
    browser.get(f"{board}/jobs/{seeded.script_job}")
    assert _text(browser, "#job-tenant") == SCRIPT_TENANT
    assert SCRIPT_TEXT in _text(browser, "#payload")
    browser.get(f"{board}/jobs?state=queued")
    assert [SCRIPT_TENANT] in _cells(browser, "#jobs tbody tr", "td.tenant")
    browser.get(f"{board}/tenants")
    assert [SCRIPT_TENANT] in _cells(browser, "#tenants tbody tr", "a.tenant")
    for path in (f"/jobs/{seeded.script_job}", "/jobs", "/tenants", "/schedule"):
        browser.get(board + path)
        assert browser.execute_script(
            "return window.__pwned_tenant === undefined && window.__pwned_payload === undefined"
        )
        sources = [s.get_attribute("src") for s in browser.find_elements(By.TAG_NAME, "script")]
        assert sources == [board + "/static/dashboard.js"], path
