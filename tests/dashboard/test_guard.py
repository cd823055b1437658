"""The dashboard's safety rules over plain HTTP: read-only without a token, actions only
after the token unlocked them, CSRF token and Origin checked, unknown Host names refused,
security headers on every page."""

from __future__ import annotations

import pytest

from pgqueue.dashboard.app import DashboardConfig
from pgqueue.dashboard.server import running_dashboard
from tests.dashboard.conftest import TOKEN, Client, Seeded, job_state

pytestmark = pytest.mark.timeout(60)


def _unlock(client: Client) -> None:
    status, headers, _ = client.post("/login", {"token": TOKEN, "next": "/"})
    assert status == 303, headers
    assert client.cookie("pgqueue_admin")


def test_a_dashboard_without_token_is_read_only(db_dsn, seeded: Seeded):
    job_id = seeded.by_tier["batch"][0]
    with running_dashboard(DashboardConfig(dsn=db_dsn, token=None)) as url:
        client = Client(url)
        status, _, page = client.request("/")
        assert status == 200
        assert 'id="mode">read-only' in page
        assert client.post("/login", {"token": TOKEN})[0] == 403
        status, _, body = client.post("/actions/cancel", {"job_id": str(job_id)})
    assert status == 403
    assert "read-only" in body
    assert job_state(db_dsn, job_id) == "queued"


def test_an_unlocked_browser_cancels(client: Client, seeded: Seeded, db_dsn):
    job_id = seeded.by_tier["batch"][1]
    _unlock(client)
    status, headers, _ = client.post("/actions/cancel", {"job_id": str(job_id), "reason": "r"})
    assert status == 303
    assert headers["location"] == f"/jobs/{job_id}?done=cancelled"
    assert job_state(db_dsn, job_id) == "cancelled"


def test_a_post_from_another_site_or_without_csrf_is_refused(client: Client, seeded, db_dsn):
    job_id = seeded.by_tier["batch"][2]
    _unlock(client)
    form = {"job_id": str(job_id)}
    status, _, body = client.post("/actions/cancel", form, Origin="http://evil.example")
    assert (status, "another site" in body) == (403, True)
    status, _, body = client.request("/actions/cancel", form, {"Origin": client.base})
    assert (status, "CSRF" in body) == (403, True)
    wrong = {**form, "csrf": "x" * 43}
    status, _, _ = client.request("/actions/cancel", wrong, {"Origin": client.base})
    assert status == 403
    assert job_state(db_dsn, job_id) == "queued"


def test_an_admin_cookie_of_another_process_is_not_admin(db_dsn, seeded: Seeded):
    """The admin cookie is an HMAC of a per-process secret: a restart ends every session,
    and knowing the cookie's form does not forge it."""
    job_id = seeded.by_tier["batch"][0]
    with running_dashboard(DashboardConfig(dsn=db_dsn, token=TOKEN)) as url:
        first = Client(url)
        _unlock(first)
        cookie = first.cookie("pgqueue_admin")
    with running_dashboard(DashboardConfig(dsn=db_dsn, token=TOKEN)) as url:
        second = Client(url)
        second.request("/")
        headers = {
            "Origin": url,
            "Cookie": f"pgqueue_admin={cookie}; pgqueue_csrf={second.cookie('pgqueue_csrf')}",
        }
        form = {"job_id": str(job_id), "csrf": second.cookie("pgqueue_csrf") or ""}
        plain = Client(url)  # no jar: the Cookie header as given
        status, _, body = plain.request("/actions/cancel", form, headers)
    assert status == 403
    assert "actions need the admin token" in body
    assert job_state(db_dsn, job_id) == "queued"


def test_unknown_host_names_are_refused(client: Client):
    """DNS rebinding: a page of evil.example resolving to 127.0.0.1 must not read the data."""
    status, _, _ = client.request("/", headers={"Host": "evil.example"})
    assert status == 400
    assert client.request("/", headers={"Host": "localhost"})[0] == 200


def test_pages_carry_security_headers(client: Client, seeded: Seeded):
    for path in ("/", "/tenants", "/schedule", "/jobs", f"/jobs/{seeded.script_job}"):
        status, headers, body = client.request(path)
        assert status == 200, path
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert headers["x-content-type-options"] == "nosniff"
        assert "<script>window" not in body
    status, headers, _ = client.request("/")
    assert "HttpOnly" in headers.get("set-cookie", "") or client.cookie("pgqueue_csrf")


def test_bad_input_is_a_clear_400(client: Client):
    assert client.request("/jobs?state=bogus")[0] == 400
    assert client.request("/jobs?tier=urgent")[0] == 400
    assert client.request("/jobs?before=abc")[0] == 400
    # a tenant id no tenant can have; a field of spaces means any tenant, as for state and tier
    assert client.request("/jobs?tenant=%E2%80%8B")[0] == 400  # U+200B
    assert client.request("/jobs?tenant=%20%20&state=%20")[0] == 200
    assert client.request("/jobs/999999")[0] == 404
    _unlock(client)
    status, _, body = client.post("/actions/cancel", {"job_id": "abc"})
    assert status == 400 and "integer" in body
    status, _, body = client.post("/actions/cancel", {"job_id": "999999"})
    assert status == 404
    assert client.post("/actions/nope", {})[0] == 404
    status, headers, _ = client.post("/login", {"token": TOKEN, "next": "//evil.example/x"})
    assert headers["location"].startswith("/?")
