"""Who may act through the dashboard, and from where: the admin token, the CSRF check.

Without an admin token configured the dashboard is read-only: every action is refused. With
one, a browser unlocks the actions by posting the token once (``/login``); it gets an admin
cookie holding an HMAC of a per-process secret keyed by the token (never the token itself; a
restart ends every session). Each form carries a CSRF token that must equal the
``pgqueue_csrf`` cookie (double submit: another site can make a browser send the cookie but
cannot read it to put it in the form), and a POST whose ``Origin`` (or, without one,
``Referer``) names another site is refused. Both cookies are ``HttpOnly`` and
``SameSite=Strict``. Which ``Host`` names are served at all is the app's
``TrustedHostMiddleware`` (against DNS rebinding).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

ADMIN_COOKIE = "pgqueue_admin"
CSRF_COOKIE = "pgqueue_csrf"
CSRF_FIELD = "csrf"


class Refused(Exception):
    """A request the dashboard will not serve: ``status`` (403 or 400) and why, for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Guard:
    """The admin token and the CSRF rules of one dashboard process.

    Args:
        token: the admin token (``--token`` / ``PGQUEUE_DASHBOARD_TOKEN``); None: read-only.
    """

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None
        self._secret = secrets.token_bytes(32)

    @property
    def actions_enabled(self) -> bool:
        """Whether an admin token is configured (else nobody can act)."""
        return self._token is not None

    def _session_value(self) -> str:
        assert self._token is not None
        return hmac.new(self._token, self._secret, hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        """Whether ``given`` is the admin token (in constant time); always False read-only."""
        if self._token is None:
            return False
        return hmac.compare_digest(given.encode(), self._token)

    def is_admin(self, request: Request) -> bool:
        """Whether this browser has unlocked the actions (its admin cookie is this process's)."""
        if self._token is None:
            return False
        cookie = request.cookies.get(ADMIN_COOKIE, "")
        return hmac.compare_digest(cookie.encode(), self._session_value().encode())

    def grant_admin(self, response: Response) -> None:
        """Give the browser the admin cookie (after :meth:`token_matches`)."""
        response.set_cookie(
            ADMIN_COOKIE, self._session_value(), httponly=True, samesite="strict", path="/"
        )

    @staticmethod
    def revoke_admin(response: Response) -> None:
        """Take the admin cookie back (log out)."""
        response.delete_cookie(ADMIN_COOKIE, path="/", httponly=True, samesite="strict")

    @staticmethod
    def csrf_token(request: Request) -> tuple[str, bool]:
        """The browser's CSRF token and whether it is new (then :meth:`set_csrf` must send it)."""
        found = request.cookies.get(CSRF_COOKIE, "")
        if len(found) >= 32:
            return found, False
        return secrets.token_urlsafe(32), True

    @staticmethod
    def set_csrf(response: Response, token: str) -> None:
        """Send the CSRF cookie with a page whose forms carry ``token``."""
        response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path="/")

    def check_post(self, request: Request, form: dict[str, str], *, admin: bool = True) -> None:
        """Refuse a POST from another site, without a matching CSRF token, or (``admin``)
        from a browser that has not unlocked the actions.

        Raises:
            Refused: 403, with the reason.
        """
        expected = f"{request.url.scheme}://{request.headers.get('host', '')}"
        origin = request.headers.get("origin")
        if origin is None and request.headers.get("referer"):
            parts = urlsplit(request.headers["referer"])
            origin = f"{parts.scheme}://{parts.netloc}"
        if origin is not None and origin != expected:
            raise Refused(403, "refused: the form was posted from another site")
        cookie = request.cookies.get(CSRF_COOKIE, "")
        field = form.get(CSRF_FIELD, "")
        if not cookie or not hmac.compare_digest(cookie.encode(), field.encode()):
            raise Refused(403, "refused: the form's CSRF token is missing or stale; reload")
        if not admin:
            return
        if not self.actions_enabled:
            raise Refused(
                403,
                "refused: this dashboard is read-only (start it with --token or "
                "PGQUEUE_DASHBOARD_TOKEN to allow actions)",
            )
        if not self.is_admin(request):
            raise Refused(403, "refused: actions need the admin token (unlock them first)")
