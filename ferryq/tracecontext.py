"""The W3C trace context a job carries in its ``meta``, under ``trace``
(docs/operations.md, "Tracing").

``meta["trace"]`` is ``{"traceparent": "00-<trace id>-<span id>-<flags>"}``, with
``"tracestate"`` beside it when there is one: the text map of the W3C Trace Context
headers. ``ferryq.otel`` writes it at enqueue and reads it in the worker; the HTTP
server copies it from a request's ``traceparent`` and ``tracestate`` headers, with no
OpenTelemetry installed. Checked here without it, as the W3C Trace Context
recommendation (level 1) reads them: a traceparent that does not parse is ignored,
and its tracestate with it; a tracestate that does not parse is dropped, one too long
is cut member by member.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

#: The key of ``meta`` that holds the trace context.
META_KEY = "trace"
#: version-traceid-parentid-flags, lower-case hex (version 00, or a later one read as 00).
TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
#: The longest tracestate kept: what every vendor must pass on, per W3C.
MAX_TRACESTATE = 512
#: At most this many list members in a tracestate (W3C).
MAX_TRACESTATE_MEMBERS = 32
#: Members longer than this go first when a tracestate is cut (W3C).
LONG_MEMBER = 128

_KEY = r"[a-z][_0-9a-z\-*/]{0,255}"
_TENANT_KEY = r"[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(rf"^(?:{_TENANT_KEY}|{_KEY})=(?:{_VALUE})$")
_ZEROS = frozenset({"0" * 32, "0" * 16})


class Headers(Protocol):
    """What the carrier of headers offers: every value of a name (Starlette's Headers)."""

    def getlist(self, key: str) -> list[str]: ...


def from_headers(headers: Headers) -> dict[str, str] | None:
    """The trace context of a request's ``traceparent``/``tracestate`` headers, as
    ``meta["trace"]`` holds it; None when there is no valid traceparent."""
    return carried(headers.getlist("traceparent"), headers.getlist("tracestate"))


def carried(traceparents: Sequence[str], tracestates: Sequence[str] = ()) -> dict[str, str] | None:
    """The trace context of these header values (each header may be sent more than
    once: a repeated traceparent is ambiguous and ignored, repeated tracestates join)."""
    if len(traceparents) != 1:
        return None
    traceparent = traceparents[0].strip(" \t")
    if not valid_traceparent(traceparent):
        return None
    context = {"traceparent": traceparent}
    tracestate = _tracestate(",".join(tracestates))
    if tracestate:
        context["tracestate"] = tracestate
    return context


def valid_traceparent(value: str) -> bool:
    """Whether ``value`` is a traceparent W3C lets a vendor use: the version is not
    ``ff`` and neither id is all zeros."""
    if not TRACEPARENT.fullmatch(value):
        return False
    version, trace_id, span_id, _ = value.split("-")
    return version != "ff" and trace_id not in _ZEROS and span_id not in _ZEROS


def _tracestate(joined: str) -> str | None:
    """The tracestate to keep: None if any member is malformed or a key repeats, else
    its members, cut to MAX_TRACESTATE characters: members over LONG_MEMBER go first,
    then the last ones."""
    members = [m.strip(" \t") for m in joined.split(",")]
    members = [m for m in members if m]
    if len(members) > MAX_TRACESTATE_MEMBERS or not all(_MEMBER.fullmatch(m) for m in members):
        return None
    keys = [m.partition("=")[0] for m in members]
    if len(set(keys)) != len(keys):
        return None
    while len(",".join(members)) > MAX_TRACESTATE:
        long = [i for i, m in enumerate(members) if len(m) > LONG_MEMBER]
        del members[long[-1] if long else -1]
    return ",".join(members) or None
