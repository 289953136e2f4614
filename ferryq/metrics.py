"""Counters and histograms of one process, and their Prometheus text form.

Every process (worker or server) counts into the module's ``METRICS``. Workers
publish a snapshot with each heartbeat; the server's ``/metrics`` renders its own
snapshot and every live worker's, each labelled with the process it came from, next
to the job counts read from the database. Counting is a dict update: cheap enough
for the hot path.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Seconds: from a millisecond pickup to a five-minute job.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
           30.0, 60.0, 300.0)  # fmt: skip


@dataclass(slots=True)
class Family:
    name: str
    kind: str  # "counter" or "histogram"
    help: str
    labels: tuple[str, ...]
    # counter: labels -> value; histogram: labels -> [bucket counts..., sum, count]
    values: dict[tuple[str, ...], list[float]] = field(default_factory=dict)


class Registry:
    def __init__(self) -> None:
        self._families: dict[str, Family] = {}
        self._lock = threading.Lock()  # sync handlers count from their threads

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(self, self._family(name, "counter", help, labels))

    def histogram(self, name: str, help: str, labels: Sequence[str] = ()) -> Histogram:
        return Histogram(self, self._family(name, "histogram", help, labels))

    def _family(self, name: str, kind: str, help: str, labels: Sequence[str]) -> Family:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = Family(name, kind, help, tuple(labels))
        return family

    def snapshot(self) -> dict[str, Any]:
        """Every value, JSON-ready: ``{name: [[labels, values], ...]}``."""
        with self._lock:
            return {
                f.name: [[list(k), list(v)] for k, v in f.values.items()]
                for f in self._families.values()
                if f.values
            }

    def render(self, sources: Iterable[tuple[str, Mapping[str, Any]]]) -> str:
        """Prometheus text of snapshots from several processes, ``(process, snapshot)``."""
        lines: list[str] = []
        snapshots = list(sources)
        for family in self._families.values():
            # Text format 0.0.4: HELP and TYPE name the samples, a counter's _total too.
            shown = f"{family.name}_total" if family.kind == "counter" else family.name
            lines.append(f"# HELP {shown} {family.help}")
            lines.append(f"# TYPE {shown} {family.kind}")
            names = ("process", *family.labels)
            for process, snapshot in snapshots:
                for labels, values in snapshot.get(family.name, []):
                    named = dict(zip(names, (process, *labels), strict=False))
                    lines.extend(_samples(family, named, values))
        return "\n".join(lines) + "\n"


class Counter:
    __slots__ = ("_lock", "_values", "family", "registry")

    def __init__(self, registry: Registry, family: Family) -> None:
        self.registry = registry
        self.family = family
        self._lock, self._values = registry._lock, family.values

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        with self._lock:
            self._slot(labels)[0] += amount

    def _slot(self, labels: tuple[str, ...]) -> list[float]:
        """The value of ``labels``, made if new; the registry's lock held."""
        slot = self._values.get(labels)
        if slot is None:
            slot = self._values[labels] = [0.0]
        return slot


class Histogram:
    __slots__ = ("_lock", "_values", "family", "registry")

    def __init__(self, registry: Registry, family: Family) -> None:
        self.registry = registry
        self.family = family
        self._lock, self._values = registry._lock, family.values

    def observe(self, value: float, *labels: str) -> None:
        with self._lock:
            _put(self._slot(labels), value)

    def _slot(self, labels: tuple[str, ...]) -> list[float]:
        """The buckets, sum and count of ``labels``, made if new; the lock held."""
        slot = self._values.get(labels)
        if slot is None:
            slot = self._values[labels] = [0.0] * (len(BUCKETS) + 3)
        return slot


def gauge_text(name: str, help: str, samples: Iterable[tuple[Mapping[str, str], float]]) -> str:
    lines = [f"# HELP {name} {help}", f"# TYPE {name} gauge"]
    lines += [f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples]
    return "\n".join(lines) + "\n"


def _samples(family: Family, labels: dict[str, str], values: list[float]) -> list[str]:
    if family.kind == "counter":
        return [f"{family.name}_total{_labels(labels)} {_number(values[0])}"]
    out = []
    cumulative = 0.0
    for bound, count in zip((*BUCKETS, math.inf), values, strict=False):
        cumulative += count
        le = "+Inf" if bound == math.inf else repr(bound)
        out.append(f"{family.name}_bucket{_labels({**labels, 'le': le})} {_number(cumulative)}")
    out.append(f"{family.name}_sum{_labels(labels)} {_number(values[-2])}")
    out.append(f"{family.name}_count{_labels(labels)} {_number(values[-1])}")
    return out


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


METRICS = Registry()
ENQUEUED = METRICS.counter("ferryq_jobs_enqueued", "Jobs enqueued.", ("namespace", "queue"))
CLAIMED = METRICS.counter("ferryq_jobs_claimed", "Attempts started (jobs claimed).",
                          ("namespace", "queue"))  # fmt: skip
FINISHED = METRICS.counter("ferryq_attempts_finished", "Attempts ended, by outcome.",
                           ("namespace", "queue", "outcome"))  # fmt: skip
RUN_SECONDS = METRICS.histogram("ferryq_job_run_seconds", "Run time of attempts.",
                                ("namespace", "queue"))  # fmt: skip
LAG_SECONDS = METRICS.histogram("ferryq_job_lag_seconds",
                                "Queue lag: claimed_at - due time, per claimed job.",
                                ("namespace", "queue"))  # fmt: skip
START_DELAY_SECONDS = METRICS.histogram(
    "ferryq_job_start_delay_seconds",
    "Start delay: started_at - claimed_at, per started attempt (prefetched jobs wait).",
    ("namespace", "queue"),
)
LEASE_RECOVERIES = METRICS.counter(
    "ferryq_lease_recoveries", "Attempts whose lease ran out, recovered by the leader."
)
STALE_REJECTIONS = METRICS.counter(
    "ferryq_stale_token_rejections", "Finishing writes rejected for a stale fencing token."
)
HTTP_REQUESTS = METRICS.counter("ferryq_http_requests", "HTTP requests served.",
                                ("listener", "route", "method", "status"))  # fmt: skip
HTTP_SECONDS = METRICS.histogram("ferryq_http_request_seconds", "HTTP request durations.",
                                 ("listener", "route"))  # fmt: skip


_LOCK = METRICS._lock


class QueueMetrics:
    """What a worker counts for every attempt of one queue, held where the registry
    keeps it: each update takes the lock once and looks nothing up, as a worker makes
    three of them an attempt (claimed, started, ended)."""

    __slots__ = ("_claimed", "_delay", "_finished", "_labels", "_lag", "_ran")

    def __init__(self, namespace: str, queue: str) -> None:
        self._labels = (namespace, queue)
        self._claimed: list[float] | None = None
        self._lag: list[float] | None = None
        self._delay: list[float] | None = None
        self._ran: list[float] | None = None
        self._finished: dict[str, list[float]] = {}  # by outcome

    def claimed(self, lag: float) -> None:
        """A job claimed, ``lag`` seconds after it was due."""
        _LOCK.acquire()  # not ``with``: twice the cost, three times an attempt
        try:
            if self._claimed is None or self._lag is None:
                self._claimed = CLAIMED._slot(self._labels)
                self._lag = LAG_SECONDS._slot(self._labels)
            self._claimed[0] += 1
            _put(self._lag, lag)
        finally:
            _LOCK.release()

    def started(self, delay: float) -> None:
        """An attempt started, ``delay`` seconds after its claim."""
        _LOCK.acquire()
        try:
            if self._delay is None:
                self._delay = START_DELAY_SECONDS._slot(self._labels)
            _put(self._delay, delay)
        finally:
            _LOCK.release()

    def ended(self, outcome: str, ran: float | None) -> None:
        """An attempt ended with ``outcome``, its handler having run ``ran`` seconds
        (None: it never started)."""
        _LOCK.acquire()
        try:
            count = self._finished.get(outcome)
            if count is None:
                count = self._finished[outcome] = FINISHED._slot((*self._labels, outcome))
            count[0] += 1
            if ran is not None:
                if self._ran is None:
                    self._ran = RUN_SECONDS._slot(self._labels)
                _put(self._ran, ran)
        finally:
            _LOCK.release()


def _put(slot: list[float], value: float) -> None:
    """``value`` into a histogram's ``slot``, the registry's lock held."""
    slot[bisect.bisect_left(BUCKETS, value)] += 1  # the last bucket is +Inf
    slot[-2] += value
    slot[-1] += 1
