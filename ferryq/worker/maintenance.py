"""Leader-only duties, each a small step of one tick.

Every worker runs the loop; only the holder of the ``maintenance`` leadership acts,
so there is no single point of failure and no extra process to deploy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ferryq import metrics
from ferryq.logs import fields, id_list
from ferryq.store.base import Store
from ferryq.worker.executor import LeaseExpired, failure
from ferryq.worker.leadership import LeaderLoop

log = logging.getLogger("ferryq.maintenance")

DAY = 86400.0
LEADER = "maintenance"
#: After the database answers again from an outage (or a lock, or a stall) the leader
#: waits this long before recovering expired leases: workers are back within a second
#: (their back-off is capped at one) and write the outcomes they held, or renew the
#: leases of what still runs, so finished jobs do not run again.
SETTLE = 5.0


@dataclass(slots=True)
class MaintenanceReport:
    promoted: int = 0
    recovered: int = 0
    expired: int = 0
    folded: int = 0
    pruned_history: int = 0
    pruned_workers: int = 0


class Maintenance:
    def __init__(
        self,
        store: Store,
        holder: str,
        *,
        retention: float = 14 * DAY,
        worker_dead_after: float = 60.0,
        batch: int = 1000,
        prune_every: int = 60,
    ) -> None:
        self.store = store
        self.holder = holder
        self.retention = retention
        self.worker_dead_after = worker_dead_after
        self.batch = batch
        self.prune_every = prune_every
        self._ticks = 0

    async def tick(self, now: float, *, recover: bool = True) -> MaintenanceReport:
        """One round of every duty; call it only while holding the leadership.
        ``recover=False`` leaves expired leases for a later round."""
        report = MaintenanceReport()
        report.promoted = await self.store.job_promote_due(now, self.batch)
        if recover:
            report.recovered = await self.recover_leases(now)
        report.expired = len(await self.store.job_expire(now, self.batch))
        report.folded = await self.store.history_fold(now)
        if self._ticks % self.prune_every == 0:
            report.pruned_history = await self.store.history_prune(now - self.retention, self.batch)
            report.pruned_workers = await self.store.worker_prune(now - self.worker_dead_after)
        self._ticks += 1
        return report

    async def recover_leases(self, now: float) -> int:
        """Attempts whose lease ran out count as failed; the retry policy decides."""
        expired = await self.store.job_expired_leases(now, self.batch)
        if not expired:
            return 0
        finishes = [
            failure(
                job,
                LeaseExpired(f"lease expired: no completion within ttr {job.ttr:g} s"),
                now,
                self.holder,
            )
            for job in expired
        ]
        for job, finish in zip(expired, finishes, strict=True):
            finish.lane = job.lane
        report = await self.store.job_finish_many(finishes)
        metrics.LEASE_RECOVERIES.inc(len(report.accepted))
        if report.accepted:
            log.warning("recovered %d job(s) whose lease expired: %s", len(report.accepted),
                        id_list(report.accepted), extra=fields(count=len(report.accepted),
                        job_ids=report.accepted, worker=self.holder))  # fmt: skip
        return len(report.accepted)


class MaintenanceLoop(LeaderLoop[MaintenanceReport | None]):
    """The maintenance duties, in whichever worker or server holds ``LEADER``."""

    def __init__(
        self,
        store: Store,
        holder: str,
        clock: Callable[[], float],
        *,
        interval: float = 0.5,
        leader_ttl: float = 5.0,
        retention: float = 14 * DAY,
    ) -> None:
        super().__init__(store, holder, clock, LEADER, interval=interval, leader_ttl=leader_ttl)
        self.maintenance = Maintenance(store, holder, retention=retention)
        self._recover_from = 0.0  # monotonic time

    async def act(self, now: float) -> MaintenanceReport | None:
        return await self.maintenance.tick(now, recover=time.monotonic() >= self._recover_from)

    def reconnected(self, gap: float) -> None:
        # Workers cut off as long as this process hold outcomes they could not write
        # and leases they could not renew. Recovering those leases at once would run
        # again jobs whose handlers finished meanwhile: they get SETTLE seconds first.
        self._recover_from = time.monotonic() + SETTLE
        log.warning("the database answered after %.1f s without a maintenance round: lease "
                    "recovery waits %.0f s for workers to write what they hold", gap, SETTLE,
                    extra=fields(gap=round(gap, 3), wait=SETTLE, worker=self.holder))  # fmt: skip

    def idle(self) -> MaintenanceReport | None:
        return None
