"""What the URL says about the connection pooler in front of the server (``?pooler=``),
and what the store does differently for it (docs/operations.md, "Behind a
connection pooler").

- ``none`` (the default): the store talks to the server itself. Its sessions' settings
  go in the startup packet, it keeps named prepared statements, LISTENs and leads by a
  session advisory lock.
- ``session``: a pooler that gives each client a server connection for the client's
  whole session (PgBouncer's ``pool_mode = session``). Everything works as without
  one, but a pooler refuses settings it does not know in the startup packet: they are
  set on each new connection instead.
- ``transaction``: a pooler that gives a client a server connection for one
  transaction at a time (PgBouncer's ``pool_mode = transaction``, RDS Proxy,
  Supabase's and Neon's poolers). Nothing may outlive a transaction: no settings in
  the startup packet, no prepared statement kept, no session advisory lock, no LISTEN.
  Every statement the store sends runs in an explicit transaction (see
  ``connection.PooledConn``), begun with the settings as ``SET LOCAL``.

The ``pooler`` parameter is ferryq's: it never reaches asyncpg, nor the server; nor
does ``connections``, the most server connections the store may hold
(``connection.Budget``).
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

from ferryq.errors import StoreError
from ferryq.store import safe_url

POOLER_MODES = ("none", "session", "transaction")
#: The URL's query parameters that asyncpg reads itself; it sends any other to the
#: server as a setting of the session, which a pooler refuses in the startup packet.
CONNECTION_PARAMETERS = frozenset({
    "host", "port", "dbname", "database", "user", "password", "passfile", "service",
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslnegotiation", "sslcrl",
    "sslpassword", "ssl_min_protocol_version", "ssl_max_protocol_version",
    "target_session_attrs", "krbsrvname", "gsslib",
})  # fmt: skip
_SETTING_NAME = re.compile(r"^[a-z_][a-z0-9_.]*$")


@dataclass(frozen=True)
class Pooling:
    """The pooler mode of a URL, and the URL as asyncpg gets it."""

    mode: str
    #: The URL for asyncpg: without ``pooler=``; behind a pooler, without the settings
    #: of the query too (those are in ``settings``).
    url: str
    #: Behind a pooler, the server settings the URL's query gave (``?search_path=x``),
    #: set by the store itself; empty otherwise (asyncpg sends them).
    settings: dict[str, str] = field(default_factory=dict)
    #: ``connections=N``: the most server connections the store may hold; None for
    #: the default.
    connections: int | None = None

    @property
    def transaction(self) -> bool:
        """Whether nothing may outlive a transaction (a transaction pooler)."""
        return self.mode == "transaction"

    @property
    def pooled(self) -> bool:
        return self.mode != "none"


def pooling_of(url: str) -> Pooling:
    """The pooler mode ``url`` names; a StoreError for a mode not known. A URL without
    ``pooler=`` comes back as it is."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    modes = [value for name, value in query if name == "pooler"]
    budgets = [value for name, value in query if name == "connections"]
    if not modes and not budgets:
        return Pooling("none", url)
    mode = modes[-1].lower() if modes else "none"
    if mode not in POOLER_MODES or len(set(modes)) > 1:
        raise StoreError(
            f"unknown pooler={','.join(modes)!s} in {safe_url(url)}: use pooler=transaction "
            "(PgBouncer's transaction mode and the like), pooler=session or pooler=none"
        )
    connections = _connections(budgets, url)
    rest = [(name, value) for name, value in query if name not in ("pooler", "connections")]
    settings: dict[str, str] = {}
    if mode != "none":
        settings = {name: value for name, value in rest if name not in CONNECTION_PARAMETERS}
        rest = [(name, value) for name, value in rest if name in CONNECTION_PARAMETERS]
        for name in settings:
            if not _SETTING_NAME.match(name):
                raise StoreError(f"{name!r} in {safe_url(url)} is not a server setting")
    stripped = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(rest)))
    return Pooling(mode, stripped, settings, connections)


def _connections(given: list[str], url: str) -> int | None:
    """``connections=N``'s N: a whole number, given once (how few is too few depends on
    what else the store holds: ``connection.Budget``)."""
    if not given:
        return None
    if len(set(given)) > 1 or not given[-1].isdigit():
        raise StoreError(
            f"connections={','.join(given)} in {safe_url(url)} is not a number of "
            "connections: give one whole number, e.g. connections=3"
        )
    return int(given[-1])


def assignments(settings: dict[str, str]) -> str:
    """``settings`` as the ``SET LOCAL`` statements of a simple query, each after a
    ``; `` (empty for none): ``; SET LOCAL a = 'x'; SET LOCAL b = 'y'``."""
    return "".join(f"; SET LOCAL {name} = {_literal(value)}" for name, value in settings.items())


def set_statements(settings: dict[str, str]) -> str:
    """``settings`` as session-wide ``SET`` statements, one simple query."""
    return "; ".join(f"SET {name} = {_literal(value)}" for name, value in settings.items())


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
