"""API tokens: made, stored as digests, checked, and rate-limited.

A token is shown once, when it is made; the store keeps only its SHA-256 digest and
a short hint. Tokens are long and random (or at least 20 characters when a person
chooses one), so a fast digest is enough: there is nothing to brute-force. Lookups go
through a short-lived cache so that a busy consumer does not read the token table on
every request; a revocation on this server takes effect at once, on others within
``TokenCache.ttl`` seconds.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from ferryq.ops import Operations, Token

#: lmstfy's rule for a token a person chooses.
MIN_TOKEN_LENGTH = 20
HINT_LENGTH = 6
POOL = "default"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def generate() -> str:
    """A new token: 26 characters of Crockford base32, like lmstfy's ULID tokens."""
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    return "".join(secrets.choice(alphabet) for _ in range(26))


def writable(token: str) -> bool:
    """Whether a chosen token can travel in a header or a URL path: no spaces and no
    control characters, which clients trim or cannot send."""
    return all(c.isprintable() and not c.isspace() for c in token)


def hint(token: str) -> str:
    return token[:HINT_LENGTH] + "…"


def split_pool(raw: str) -> tuple[str, str]:
    """``pool:token`` or ``token`` (pool ``default``) → (pool, token)."""
    pool, sep, token = raw.partition(":")
    return (pool, token) if sep else (POOL, raw)


class TokenCache:
    """Tokens by digest, each kept for ``ttl`` seconds (misses too)."""

    def __init__(
        self, ops: Operations, ttl: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ops = ops
        self.ttl = ttl
        self.clock = clock
        self._entries: dict[str, tuple[float, Token | None]] = {}

    async def lookup(self, token: str) -> Token | None:
        key = digest(token)
        now = self.clock()
        entry = self._entries.get(key)
        if entry is None or now - entry[0] > self.ttl:
            if len(self._entries) > 10_000:
                self._entries.clear()
            entry = self._entries[key] = (now, await self.ops.token_get(key))
        found = entry[1]
        # The store found the row by its digest; comparing again in constant time keeps
        # the check itself free of timing differences whatever the lookup does.
        if found is None or not hmac.compare_digest(found.digest, key):
            return None
        return found

    def forget(self, digest_hex: str) -> None:
        self._entries.pop(digest_hex, None)


@dataclass(slots=True)
class _Window:
    started: float
    read: int = 0
    write: int = 0


class RateLimiter:
    """Per-token limits: at most ``limit_read`` consumes and ``limit_write`` publishes
    per ``limit_interval`` seconds, counted in fixed windows by this server process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._windows: dict[str, _Window] = {}

    def take(self, token: Token, kind: str, n: int = 1) -> bool:
        """Count ``n`` operations of ``kind`` ("read" or "write"); False if over limit."""
        limit = token.limit_read if kind == "read" else token.limit_write
        if limit is None or not token.limit_interval:
            return True
        window = self._window(token)
        used = window.read if kind == "read" else window.write
        if used + n > limit:
            return False
        self._add(window, kind, n)
        return True

    def refund(self, token: Token, kind: str, n: int = 1) -> None:
        """Give back operations that did nothing (an empty consume, a failed publish)."""
        window = self._windows.get(token.digest)
        if window is not None:
            self._add(window, kind, -n)

    def _window(self, token: Token) -> _Window:
        now = self.clock()
        window = self._windows.get(token.digest)
        if window is None or now - window.started >= (token.limit_interval or 0):
            window = self._windows[token.digest] = _Window(now)
        return window

    @staticmethod
    def _add(window: _Window, kind: str, n: int) -> None:
        if kind == "read":
            window.read = max(window.read + n, 0)
        else:
            window.write = max(window.write + n, 0)
