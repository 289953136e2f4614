"""A lane's claim order read from what the database keeps and what handlers log.

A lane promises that its jobs are claimed in id order (docs/guarantees.md, Lanes),
not that their handlers begin in that order: a worker killed between a claim and its
handler's start puts that start off by a lease, and a job waiting for a slot in its
worker starts late, both legitimately. The database keeps each job's last claim
(``claimed_at``, ``fence``); for a job claimed once (fence 1) that is its first claim.
A claim's time is taken before its write, so the claim was written at or after it; a
handler's start is logged after its claim was written. So a job claimed once whose
claim time is later than a later job's logged start was claimed after that job: an
order violation, and nothing else makes one (no clock slack is needed, the clock being
the machine's). Jobs claimed more than once are left out as the earlier job (their
first claim time is gone), never as the later one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ferryq.job import Job


def assert_claimed_in_id_order(
    lane: str, jobs: Iterable[Job], started: Mapping[int, float], where: str = ""
) -> None:
    """``jobs``: a lane's; ``started``: the first logged start of each job that has one."""
    latest: tuple[float, int] | None = None  # (claimed_at, id): of the jobs so far claimed
    for job in sorted(jobs, key=lambda job: job.id):  # once, the one claimed last
        start = started.get(job.id)
        if latest is not None and start is not None:
            claimed_at, earlier = latest
            assert claimed_at <= start, (
                f"{where}lane {lane}: job {earlier} was claimed at {claimed_at:.6f}, after "
                f"the later job {job.id} had started at {start:.6f}"
            )
        if job.fence == 1 and job.claimed_at is not None:
            latest = max(latest or (job.claimed_at, job.id), (job.claimed_at, job.id))
