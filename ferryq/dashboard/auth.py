"""Who is looking: the dashboard's sign-in, its session cookie, and CSRF checks.

Two kinds of people sign in. The operator, with the server's admin credential
(``--admin-credential USER:PASSWORD``), sees every namespace; without a configured
credential there is no admin sign-in at all. Anyone holding a namespace token (the
lmstfy API's) sees that namespace only, for as long as the token exists.

A session is a cookie holding who signed in, until when, and a random CSRF value, signed
with HMAC-SHA256 under a key made when the server starts (so a restart signs everyone
out), or derived from a session secret the servers share (``--session-secret``), with
the admin credential, so that sessions outlive restarts and work on every server with
that secret, and end when either changes. It is ``HttpOnly`` and ``SameSite=Strict``,
scoped to the dashboard's path, and never holds a token: only the token's digest, looked
up again on use, so a revoked token's sessions end within seconds. Every form that
changes something carries the session's CSRF value, compared in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ferryq.errors import ConfigurationError
from ferryq.ops import Operations, Token

COOKIE = "ferryq_session"
LOGIN_COOKIE = "ferryq_login"  # the sign-in form's CSRF value, before any session
SESSION_SECONDS = 12 * 3600
MIN_SECRET_LENGTH = 32
TOKEN_RECHECK_SECONDS = 2.0

Role = Literal["admin", "token"]


@dataclass(frozen=True, slots=True)
class Viewer:
    """A signed-in person. ``namespace`` is None for the admin, who sees them all."""

    role: Role
    namespace: str | None
    name: str  # what the page header shows: the admin's user name, or the token's hint
    csrf: str
    digest: str | None = None  # the token's digest, for token sessions
    expires: float = 0.0

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_see(self, namespace: str) -> bool:
        return self.namespace is None or self.namespace == namespace


class Sessions:
    """Signs and reads session cookies; checks sign-ins."""

    def __init__(
        self,
        ops: Callable[[], Operations],
        credential: str | None,
        *,
        secret: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if credential is not None:
            check_admin_credential(credential)
        self._ops = ops
        self._key = secrets.token_bytes(32) if secret is None else session_key(secret, credential)
        self._clock = clock
        self.admin_enabled = credential is not None
        user, _, password = (credential or "").partition(":")
        self._admin_user = user
        self._admin_password = password.encode()
        self._tokens: dict[str, tuple[float, Token | None]] = {}

    # -- cookies -----------------------------------------------------------------

    def sign(self, viewer: Viewer) -> str:
        payload = {"r": viewer.role, "ns": viewer.namespace, "n": viewer.name,
                   "c": viewer.csrf, "d": viewer.digest, "e": viewer.expires}  # fmt: skip
        body = _b64(json.dumps(payload, separators=(",", ":")).encode())
        return f"{body}.{self._mac(body)}"

    async def read(self, cookie: str | None) -> Viewer | None:
        """The viewer of a valid, unexpired session cookie, else None."""
        if not cookie or cookie.count(".") != 1:
            return None
        body, mac = cookie.split(".")
        if not hmac.compare_digest(mac, self._mac(body)):
            return None
        try:
            raw = json.loads(_unb64(body))
            viewer = Viewer(raw["r"], raw["ns"], raw["n"], raw["c"], raw["d"], float(raw["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        if viewer.expires < self._clock():
            return None
        if viewer.role == "admin":
            return viewer if self.admin_enabled else None
        if viewer.role != "token" or viewer.digest is None:
            return None
        token = await self._token(viewer.digest)
        if token is None or token.namespace != viewer.namespace:
            return None
        return viewer

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())

    async def _token(self, digest: str) -> Token | None:
        now = time.monotonic()
        cached = self._tokens.get(digest)
        if cached is None or now - cached[0] > TOKEN_RECHECK_SECONDS:
            if len(self._tokens) > 10_000:
                self._tokens.clear()
            cached = self._tokens[digest] = (now, await self._ops().token_get(digest))
        return cached[1]

    # -- signing in --------------------------------------------------------------

    def admin(self, user: str, password: str) -> Viewer | None:
        if not self.admin_enabled:
            return None
        # Both parts are compared, always, so the time taken says nothing about which
        # part was wrong.
        user_ok = hmac.compare_digest(user.encode(), self._admin_user.encode())
        password_ok = hmac.compare_digest(password.encode(), self._admin_password)
        if not (user_ok and password_ok):
            return None
        return self._new("admin", None, user, None)

    def token(self, token: Token) -> Viewer:
        return self._new("token", token.namespace, token.hint, token.digest)

    def _new(self, role: Role, namespace: str | None, name: str, digest: str | None) -> Viewer:
        expires = self._clock() + SESSION_SECONDS
        return Viewer(role, namespace, name, secrets.token_urlsafe(24), digest, expires)


def csrf_ok(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def check_admin_credential(credential: str) -> None:
    """``USER:PASSWORD``, neither empty: an empty one would let anyone sign in."""
    user, colon, password = credential.partition(":")
    if not colon:
        raise ConfigurationError("the admin credential must be USER:PASSWORD")
    if not user or not password:
        raise ConfigurationError(
            "the admin credential must be USER:PASSWORD with neither USER nor PASSWORD empty"
        )


def check_session_secret(secret: str) -> None:
    if len(secret) < MIN_SECRET_LENGTH:
        raise ConfigurationError(
            f"the session secret must be at least {MIN_SECRET_LENGTH} characters"
        )


def session_key(secret: str, credential: str | None) -> bytes:
    """The signing key of sessions under a shared ``secret``: it changes with the
    admin credential too, so a new admin password ends the old admin sessions."""
    check_session_secret(secret)
    material = f"ferryq dashboard sessions\0{secret}\0{credential or ''}".encode()
    return hashlib.sha256(material).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
