"""The metrics registry and its Prometheus text, as pure logic."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import Mount, Route

from ferryq.metrics import BUCKETS, Registry, gauge_text
from ferryq.server.monitoring import UNMATCHED, route_pattern


def test_counters_render_per_process_and_label() -> None:
    registry = Registry()
    done = registry.counter("x_done", "Done.", ("queue",))
    done.inc(2, "mail")
    done.inc(1, "mail")
    done.inc(1, 'we"ird\\q\n')
    text = registry.render([("p1", registry.snapshot()), ("p2", {"x_done": [[["a"], [7.0]]]})])
    assert text.startswith("# HELP x_done_total Done.\n# TYPE x_done_total counter\n")
    assert 'x_done_total{process="p1",queue="mail"} 3' in text
    assert 'x_done_total{process="p1",queue="we\\"ird\\\\q\\n"} 1' in text
    assert 'x_done_total{process="p2",queue="a"} 7' in text


def test_histograms_are_cumulative_with_sum_and_count() -> None:
    registry = Registry()
    run = registry.histogram("x_seconds", "Run time.")
    for value in (0.0005, 0.003, 0.003, 1000.0):
        run.observe(value)
    lines = registry.render([("p", registry.snapshot())]).splitlines()
    buckets = [line for line in lines if line.startswith("x_seconds_bucket")]
    assert len(buckets) == len(BUCKETS) + 1
    assert buckets[0] == 'x_seconds_bucket{process="p",le="0.001"} 1'
    assert 'x_seconds_bucket{process="p",le="0.005"} 3' in buckets
    assert buckets[-1] == 'x_seconds_bucket{process="p",le="+Inf"} 4'
    assert 'x_seconds_count{process="p"} 4' in lines
    assert 'x_seconds_sum{process="p"} 1000.0065' in lines


def test_a_snapshot_is_plain_json_and_empty_families_are_left_out() -> None:
    registry = Registry()
    registry.counter("unused", "Never counted.")
    registry.counter("used", "Counted.").inc()
    assert registry.snapshot() == {"used": [[[], [1.0]]]}


def test_gauges() -> None:
    text = gauge_text("g", "A gauge.", [({"state": "ready"}, 2), ({}, 0.5)])
    assert text.splitlines() == [
        "# HELP g A gauge.",
        "# TYPE g gauge",
        'g{state="ready"} 2',
        "g 0.5",
    ]


def test_the_route_label_is_the_pattern_of_the_route_that_serves_the_request() -> None:
    async def endpoint(request: object) -> None: ...

    inner = Starlette(routes=[Route("/jobs/{job_id:int}", endpoint)])
    routes = [
        Route("/api/{ns}/{q}", endpoint, methods=["PUT"]),
        Route("/healthz", endpoint, methods=["GET"]),
        Mount("/ui", inner),
    ]

    def pattern(method: str, path: str) -> str:
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        return route_pattern(routes, scope)

    assert pattern("PUT", "/api/ns1/mail") == "/api/{ns}/{q}"
    assert pattern("GET", "/api/ns1/mail") == "/api/{ns}/{q}"  # 405 from that route
    assert pattern("GET", "/healthz") == "/healthz"
    assert pattern("GET", "/ui/jobs/42") == "/ui/jobs/{job_id:int}"
    assert pattern("GET", "/ui/nothing") == "/ui/{path:path}"
    assert pattern("GET", "/no/such/path/42") == pattern("GET", "/x") == UNMATCHED
