"""An app with tracing for the cross-process tracing test.

The worker runs it as ``ferryq worker tests.integration.otel_tasks:app --burst``; the
producer as ``python -m tests.integration.otel_tasks`` (it enqueues one job inside a
span of its own). Each process writes its finished spans, one JSON object a line, to
the file named by ``FERRYQ_TEST_SPANS``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import ferryq
from ferryq.otel import Tracing


class JsonLinesExporter(SpanExporter):
    """Finished spans as JSON lines, appended to a file as each ends."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:
            for span in spans:
                out.write(json.dumps(span_record(span)) + "\n")
        return SpanExportResult.SUCCESS


def span_record(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "parent_trace_id": None if span.parent is None else f"{span.parent.trace_id:032x}",
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
    }


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


provider = TracerProvider()
provider.add_span_processor(
    SimpleSpanProcessor(JsonLinesExporter(Path(os.environ["FERRYQ_TEST_SPANS"])))
)
tracer = provider.get_tracer("tests")

app = ferryq.App(os.environ["FERRYQ_URL"])
app.use(Tracing(provider))


@app.task(name="traced.render", queue="renders")
def render(page: int) -> int:
    with tracer.start_as_current_span("render page"):
        return page * 2


def produce() -> None:
    """Enqueue one job inside a span of this process; print the job's id."""
    with tracer.start_as_current_span("checkout", kind=trace.SpanKind.SERVER):
        handle = render.enqueue(21)
    print(handle.id, flush=True)
    app.close()
    provider.shutdown()


if __name__ == "__main__":
    produce()
