"""OpenTelemetry tracing for ferryq: ``app.use(ferryq.otel.Tracing())``.

Needs the ``otel`` extra (``pip install 'ferryq[otel]'``); nothing else in ferryq
imports OpenTelemetry. Built on the hooks (``ferryq.hooks``):

- every enqueue call gets a span ``send <queue>`` (kind PRODUCER), and the W3C trace
  context of that span is stored in the jobs' ``meta["trace"]``
  (``{"traceparent": ..., "tracestate": ...}``, written by the global propagator);
- every attempt gets a span ``process <queue>`` (kind CONSUMER) whose parent, and
  link, is the context carried in the job, and which is the current span while the
  handler runs (sync or async): spans the handler starts are its children.

Span names, kinds and the ``messaging.*`` attributes follow the OpenTelemetry
semantic conventions for messaging as of v1.27.0 (``send``/``process``); ferryq's
own attributes are under ``messaging.ferryq.*`` (docs/operations.md, Tracing, lists
them all). A job enqueued with a trace context already in its meta (the HTTP server
copies a request's ``traceparent`` header there) keeps that context: it is the
message's creation context, so the send span becomes its child (when no span is
current) and links to it, and the consumer's parent is the publisher's span.

A hook that fails (a broken exporter or provider) is logged and skipped by ferryq,
like any hook: the job is enqueued and run all the same.
"""

from __future__ import annotations

from contextvars import Token
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError("ferryq.otel needs OpenTelemetry: pip install 'ferryq[otel]'") from exc

import ferryq
from ferryq.context import Context
from ferryq.faults import one_line
from ferryq.hooks import Enqueue, Outcome
from ferryq.tracecontext import META_KEY

__all__ = ["SCHEMA_URL", "Tracing"]

#: The semantic conventions these spans follow.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.27.0"
SYSTEM = "ferryq"
#: Outcomes of an attempt that failed: its span's status is ERROR.
FAILED = frozenset({"retry", "dead"})


class Tracing:
    """Spans around every enqueue and attempt: ``app.use(Tracing())``.

    ``tracer_provider``: the provider to take the tracer from; by default the global
    one (``opentelemetry.trace.set_tracer_provider``), even one set after this is
    made. Install it in the producing processes
    (to start traces and carry them in the jobs) and in the workers (to continue
    them); a worker without it still runs every job, untraced.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(
            "ferryq", ferryq.__version__, tracer_provider, schema_url=SCHEMA_URL
        )
        # Spans between a before and an after hook, by the id of the call or context
        # (kept with them, so that an id is not reused while the entry lives).
        self._sends: dict[int, tuple[Enqueue, Span]] = {}
        self._attempts: dict[int, tuple[Context, Span, Token[otel_context.Context] | None]] = {}

    # -- enqueue -----------------------------------------------------------------------

    def before_enqueue(self, enqueue: Enqueue) -> None:
        queue = enqueue.options.queue or "default"
        current = otel_context.get_current()
        given = _creation_context(enqueue.meta)
        parent, links = current, []
        if given is not None:  # a context of the caller's own: link to it, never replace it
            links = [Link(given)]
            if not trace.get_current_span(current).get_span_context().is_valid:
                parent = trace.set_span_in_context(trace.NonRecordingSpan(given), current)
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": queue,
            "messaging.ferryq.task": enqueue.task,
        }
        if enqueue.count != 1:
            attributes["messaging.batch.message_count"] = enqueue.count
        if enqueue.options.lane is not None:
            attributes["messaging.ferryq.lane"] = enqueue.options.lane
        span = self._tracer.start_span(
            f"send {queue}", context=parent, kind=SpanKind.PRODUCER, links=links,
            attributes=attributes,
        )  # fmt: skip
        self._sends[id(enqueue)] = (enqueue, span)
        if given is None:
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context=trace.set_span_in_context(span, current))
            if carrier:
                enqueue.meta[META_KEY] = carrier

    def after_enqueue(self, enqueue: Enqueue) -> None:
        entry = self._sends.pop(id(enqueue), None)
        if entry is None:  # its before hook failed, or was not ours
            return
        span = entry[1]
        try:
            if enqueue.exception is not None:
                _failed(span, enqueue.exception)
            elif enqueue.count == 1 and enqueue.ids:
                span.set_attribute("messaging.message.id", str(enqueue.ids[0]))
        finally:
            span.end()

    # -- attempts ----------------------------------------------------------------------

    def before_attempt(self, ctx: Context) -> None:
        current = otel_context.get_current()
        parent, links = current, []
        carrier = _carrier(ctx.meta)
        if carrier is not None:
            creation = _span_context(carrier)
            if creation is not None:
                links = [Link(creation)]
                parent = propagate.extract(carrier, context=current)
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": ctx.queue,
            "messaging.message.id": str(ctx.job_id),
            "messaging.ferryq.task": ctx.task,
            "messaging.ferryq.attempt": ctx.attempt,
            "messaging.ferryq.max_tries": ctx.max_tries,
        }
        if ctx.lane is not None:
            attributes["messaging.ferryq.lane"] = ctx.lane
        if ctx.stage is not None:
            attributes["messaging.ferryq.stage"] = ctx.stage
        span = self._tracer.start_span(
            f"process {ctx.queue}", context=parent, kind=SpanKind.CONSUMER, links=links,
            attributes=attributes,
        )  # fmt: skip
        self._attempts[id(ctx)] = (ctx, span, None)
        # Current for the handler: before and after hooks run in the attempt's task.
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        self._attempts[id(ctx)] = (ctx, span, token)

    def after_attempt(self, ctx: Context, outcome: Outcome) -> None:
        entry = self._attempts.pop(id(ctx), None)
        if entry is None:
            return
        _, span, token = entry
        try:
            if token is not None:
                otel_context.detach(token)
        finally:
            try:
                span.set_attribute("messaging.ferryq.outcome", outcome.kind)
                span.set_attribute("messaging.ferryq.timed_out", outcome.timed_out)
                if outcome.kind in FAILED and outcome.exception is not None:
                    _failed(span, outcome.exception)
            finally:
                span.end()


def _carrier(meta: Any) -> dict[str, str] | None:
    """The text map a job carries under ``meta["trace"]``, if it is one."""
    carried = meta.get(META_KEY) if isinstance(meta, dict) else None
    if not isinstance(carried, dict):
        return None
    return {k: v for k, v in carried.items() if isinstance(k, str) and isinstance(v, str)}


def _span_context(carrier: dict[str, str]) -> trace.SpanContext | None:
    """The span context the carrier holds, if a valid one."""
    extracted = propagate.extract(carrier, context=otel_context.Context())
    found = trace.get_current_span(extracted).get_span_context()
    return found if found.is_valid else None


def _creation_context(meta: dict[str, Any]) -> trace.SpanContext | None:
    carrier = _carrier(meta)
    return None if carrier is None else _span_context(carrier)


def _failed(span: Span, exc: BaseException) -> None:
    kind = type(exc)
    module = kind.__module__
    span.set_attribute("error.type", kind.__qualname__ if module == "builtins"
                       else f"{module}.{kind.__qualname__}")  # fmt: skip
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, one_line(exc)))
