"""A lane's guarantees read from what lanes_app.py's handlers log and what the
database keeps: the attempts of each job (a start line, and an end line unless its
worker was killed mid-way), then, lane by lane, its limit and its claim order.

How a killed attempt is counted, and why the bounds used are never too early: see
tests/acceptance/test_lanes_chaos.py, whose checks these are (2 to 4 of its
docstring); a run without kills has an end for every attempt, and the same checks
hold with nothing left to bound.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import ferryq
from ferryq.job import Job
from tests.acceptance.lane_order import assert_claimed_in_id_order


@dataclass
class Attempt:
    job_id: int
    lane: str
    seq: int
    attempt: int
    fence: int
    start: float
    pid: int
    end: float | None = None
    outcome: str | None = None


async def all_jobs(app: ferryq.App, task: str) -> dict[int, Job]:
    """Every job of ``task`` the database keeps, by id, page by page."""
    jobs: dict[int, Job] = {}
    after: int | None = None
    while True:
        page = await app.list_jobs_async(task=task, after_id=after, limit=5000)
        if not page:
            return jobs
        jobs.update((job.id, job) for job in page)
        after = min(job.id for job in page)


def read_attempts(log_dir: Path) -> dict[tuple[int, int], Attempt]:
    """Attempts by (job id, fence). A last line cut short by SIGKILL is ignored."""
    attempts: dict[tuple[int, int], Attempt] = {}
    ends: list[list[str]] = []
    for path in log_dir.glob("*.log"):
        text = path.read_text()
        lines = text.split("\n")
        for line in lines[:-1]:  # the part after the last newline was never finished
            parts = line.split()
            if parts[0] == "S":
                _, lane, seq, job_id, attempt, fence, at, pid = parts
                key = (int(job_id), int(fence))
                assert key not in attempts, f"two starts logged for job {job_id} fence {fence}"
                attempts[key] = Attempt(int(job_id), lane, int(seq), int(attempt), int(fence),
                                        float(at), int(pid))  # fmt: skip
            else:
                ends.append(parts)
    for _, _lane, _seq, job_id, _attempt, fence, at, _pid, outcome in ends:
        found = attempts[(int(job_id), int(fence))]
        found.end, found.outcome = float(at), outcome
    return attempts


def attempts_by_job(attempts: dict[tuple[int, int], Attempt]) -> dict[int, list[Attempt]]:
    """Each job's attempts, in fence order."""
    by_job: defaultdict[int, list[Attempt]] = defaultdict(list)
    for found in attempts.values():
        by_job[found.job_id].append(found)
    for runs in by_job.values():
        runs.sort(key=lambda a: a.fence)
    return by_job


def assert_lane_kept(
    where: str,
    lane: str,
    limit: int,
    members: list[Job],
    jobs: dict[int, Job],
    by_job: dict[int, list[Attempt]],
) -> None:
    """Checks 2 to 4 of tests/acceptance/test_lanes_chaos.py's docstring for one lane
    of limit ``limit``: ``members``, its jobs in id order; ``jobs``, every job by id."""
    first = {j.id: by_job[j.id][0] for j in members if by_job.get(j.id)}

    def span_end(a: Attempt) -> float:
        """When the attempt stopped holding its lane place as running (an attempt cut
        short by a kill: its job's next start, or its end; see the chaos test)."""
        if a.end is not None:
            return a.end
        later = [b.start for b in by_job[a.job_id] if b.fence > a.fence]
        if later:
            return min(later)
        finished = jobs[a.job_id].finished_at
        assert finished is not None, f"{where}: job {a.job_id} terminal without finished_at"
        return finished

    # 2. Limit 1: the next job starts only after its predecessor is terminal.
    if limit == 1:
        for prev, job in itertools.pairwise(members):
            if job.id not in first or prev.finished_at is None:
                continue
            started = first[job.id].start
            assert started >= prev.finished_at, (
                f"{where}: lane {lane}: job {job.id} (seq {job.args[1]}) first started at "
                f"{started:.6f}, {prev.finished_at - started:.6f} s before its predecessor "
                f"{prev.id} was terminal ({prev.state} at {prev.finished_at:.6f}); "
                f"predecessor attempts {by_job.get(prev.id)}, job attempts {by_job[job.id]}"
            )

    # 3. Never more than the limit running, attempt by attempt ...
    spans = [(a.start, span_end(a), a) for j in members for a in by_job.get(j.id, [])]
    _at_most(where, lane, limit, "attempts running", spans)
    # ... nor more than the limit of jobs holding a place, retries included.
    places = [
        (first[j.id].start, j.finished_at or 0.0, first[j.id]) for j in members if j.id in first
    ]
    _at_most(where, lane, limit, "jobs between first start and terminal", places)

    # 4. Claims in id order.
    assert_claimed_in_id_order(lane, members, {i: a.start for i, a in first.items()}, f"{where}: ")


def _at_most(
    where: str, lane: str, limit: int, what: str, spans: list[tuple[float, float, Attempt]]
) -> None:
    """No instant lies inside more than ``limit`` of the half-open spans [start, end)."""
    for start, end, a in spans:
        assert end >= start, f"{where}: lane {lane}: {a} ended at {end:.6f}, before it began"
    events = sorted(
        [(end, 0, a) for _start, end, a in spans] + [(start, 1, a) for start, _end, a in spans],
        key=lambda e: (e[0], e[1]),
    )  # at equal times an end comes before a start
    current: list[Attempt] = []
    for at, kind, a in events:
        if kind == 0:
            current.remove(a)
            continue
        current.append(a)
        assert len(current) <= limit, (
            f"{where}: lane {lane} (limit {limit}): {len(current)} {what} at {at:.6f}: "
            + "; ".join(str(c) for c in current)
        )
