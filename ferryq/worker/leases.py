"""Leases: never two attempts of one job at once.

A claim leases the job to this worker for its ttr, under a new fencing token (its
fence). The database gives the job to another worker only once the lease has passed
(lease recovery, by the maintenance leader), and refuses the outcome of a fence that
is no longer the job's. This module is the worker's side of that promise
(docs/guarantees.md, Leases and time-to-run), all of it:

- **Renewal** (``LeaseKeeper.renew``, at every heartbeat). Every lease this worker
  holds is renewed once a third of its ttr has passed, and at once when its handler
  asks (``ctx.heartbeat()``) or has progress to store (``ctx.progress()``): those of
  attempts running, of attempts waiting for a slot, and of attempts that ended but
  whose outcome is not written yet, so that the outcome, once the database answers
  again, still finds its lease.
- **What a renewal finds.** A lease lost (the job recovered, or claimed again
  elsewhere) stops its attempt (``Stop.LEASE``); a cancel requested stops it
  (``Stop.CANCEL``), or ends it unstarted if it still waits for a slot.
- **No start on a passing lease** (``LeaseKeeper.start``): an attempt whose lease is
  within the margin below does not start; it goes back unrun.
- **The watch** (``LeaseKeeper.watch``), on the worker's own clock, which never waits
  for the database: an attempt whose lease could not be renewed is stopped
  ``lease_margin`` before the lease passes, and if it has not stopped when half that
  margin is left (a handler that ignores cancellation, a sync call blocked in C), the
  process exits (``EXIT_STUCK``) rather than run beside the attempt the database may
  start elsewhere. The same watch stops attempts past their time limit.

The runner adds one rule of its own (``Worker._start``): a job claimed again while an
attempt of it still runs here waits for that attempt to end.

A handler and the keeper talk through the attempt's ``AttemptSignals``
(ferryq/context.py), made with its Context: an attempt without a Context cannot ask
for anything, and costs the keeper nothing but its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterable

from ferryq.store.base import Finish, Leases, Store
from ferryq.worker.executor import Attempt, Stop

log = logging.getLogger("ferryq.worker")

#: An attempt whose lease could not be renewed is stopped this long before the lease
#: passes (a quarter of the ttr for short ones), so that lease recovery never starts
#: the job elsewhere while it still runs here.
LEASE_MARGIN = 1.0
#: The exit status of a worker that could not stop an attempt before its lease passed
#: (a handler that ignores cancellation, or a sync call blocked in C): it exits at
#: once rather than let the job run twice at the same time.
EXIT_STUCK = 70
#: The watch looks at least this often, and never more often than every MIN_LOOK s.
MAX_LOOK = 1.0
MIN_LOOK = 0.01


def lease_margin(ttr: float) -> float:
    return min(LEASE_MARGIN, ttr / 4)


def _exit_stuck() -> None:
    logging.shutdown()
    os._exit(EXIT_STUCK)


class LeaseKeeper:
    """Renews and watches the leases of one worker's attempts.

    ``active`` is the worker's own map of the attempts it holds, running or waiting
    for a slot, by job id; ``drop_unstarted`` ends one of those that waits, cancelled.
    ``exit_stuck`` ends the process (tests give their own)."""

    def __init__(
        self,
        clock: Callable[[], float],
        active: dict[int, Attempt],
        drop_unstarted: Callable[[Attempt], None],
        exit_stuck: Callable[[], None] = _exit_stuck,
    ) -> None:
        self._clock = clock
        self._active = active
        self._drop_unstarted = drop_unstarted
        self._exit_stuck = exit_stuck
        # Ended attempts whose outcome is not written yet, by (job id, fence).
        self._unwritten: dict[tuple[int, int], Attempt] = {}
        self._look_now = asyncio.Event()
        self._next_look = -math.inf  # when the watch looks next, on the clock

    # -- what the runner tells the keeper ------------------------------------------

    def start(self, attempt: Attempt, now: float) -> bool:
        """Start ``attempt`` at ``now`` (its start time, its time limit), unless its
        lease passed, or nearly, while it waited for a slot: the database may give the
        job to another worker any moment, and it must not start here then. The watch
        looks sooner if the attempt needs it to; otherwise (the common case) starting
        costs nothing more."""
        job = attempt.job
        first = attempt.lease_until - (LEASE_MARGIN if job.ttr >= 4 * LEASE_MARGIN else job.ttr / 4)
        if first <= now:  # within lease_margin(ttr) of passing
            return False
        attempt.started_at = now
        if job.timeout is not None:
            attempt.deadline = now + job.timeout
            first = min(first, attempt.deadline)
        if first < self._next_look:
            self._look_now.set()
        return True

    def ended(self, attempt: Attempt, finish: Finish) -> None:
        """``attempt`` ended with ``finish``: its lease is renewed until that is written."""
        self._unwritten[attempt.job.id, finish.fence] = attempt

    def written(self, finishes: Iterable[Finish]) -> None:
        for finish in finishes:
            self._unwritten.pop((finish.id, finish.fence), None)

    def look_now(self) -> None:
        """Have the watch look at once (the clock may have moved on)."""
        self._look_now.set()

    def renew_within(self, interval: float) -> float:
        """How long the heartbeat may wait: ``interval``, or less, so that no lease
        runs out between two renewals."""
        shortest = min((a.job.ttr for a in self._active.values()), default=math.inf)
        return min(interval, shortest / 3)

    # -- renewal ---------------------------------------------------------------------

    async def renew(self, store: Store) -> None:
        """Renew the leases due (see the module's docstring), then act on what the
        database says of them."""
        now = self._clock()
        active = self._active
        holding = {**{a.job.id: a for a in self._unwritten.values()}, **active}
        # The claim stamped started_at with its own time; the first renewal after the
        # handler began writes when it really did (a finish writes it too).
        started = {
            job_id: a.started_at for job_id, a in active.items()
            if a.started_at is not None and not a.start_written and a.running
        }  # fmt: skip
        # What attempts reported through ctx.progress since the last renewal.
        progress = {
            job_id: report for job_id, a in active.items()
            if a.signals is not None and (report := a.signals.take_progress()) is not None
        }  # fmt: skip
        extend = [
            job_id for job_id, a in holding.items()
            if a.lease_until - now < a.job.ttr * 2 / 3
            or (a.signals is not None and a.signals.take_renewal())
            or job_id in started or job_id in progress
        ]  # fmt: skip
        held = [(i, a.job.fence) for i, a in holding.items()]
        if not held:
            return
        try:
            leases = await store.job_leases(held, extend, now, started, progress)
        except BaseException:
            for job_id, report in progress.items():  # kept for the next renewal
                attempt = active.get(job_id)
                if attempt is not None and attempt.signals is not None:
                    attempt.signals.keep_progress(report)
            raise
        self._renewed(leases, holding, started, now)

    def _renewed(
        self, leases: Leases, holding: dict[int, Attempt], started: dict[int, float], now: float
    ) -> None:
        """Act on what a renewal found: leases extended, lost, cancels requested."""
        for job_id in leases.extended:
            if (attempt := holding.get(job_id)) is not None:
                attempt.lease_until = now + attempt.job.ttr
                attempt.start_written = attempt.start_written or job_id in started
        # What the renewal found is about the attempts it asked for (``holding``): by
        # the time it answers, a finished one may have been claimed again, here, by a
        # new attempt with a new fence, which is neither lost nor told of a cancel yet.
        for job_id in leases.lost:  # recovered or claimed again elsewhere: stop wasting work
            if (attempt := holding.get(job_id)) is not None and attempt.running:
                attempt.interrupt(Stop.LEASE)
        for job_id in leases.cancel_requested:
            attempt = holding.get(job_id)
            if attempt is None or self._active.get(job_id) is not attempt:
                continue
            if attempt.runner is None:
                self._drop_unstarted(attempt)
            else:
                attempt.interrupt(Stop.CANCEL)
        self._look_now.set()

    # -- the watch: a clock that never waits for the database ----------------------

    async def watch(self) -> None:
        """Look at the running attempts whenever a lease or a time limit may need it
        (``check``), until cancelled."""
        while True:
            self._look_now.clear()
            now = self._clock()
            wake = max(self.check(now), MIN_LOOK)
            self._next_look = now + wake
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wake):
                    await self._look_now.wait()

    def check(self, now: float) -> float:
        """Act on the leases and time limits as of ``now``: stop the attempts past
        their time limit, and those whose lease could not be renewed; exit if one of
        those cannot be stopped before its lease passes. The seconds until the next
        look."""
        wake = MAX_LOOK
        for attempt in list(self._active.values()):
            if not attempt.running:
                continue
            if attempt.deadline is not None and attempt.stop is None:
                if now >= attempt.deadline:
                    _time_out(attempt)
                else:
                    wake = min(wake, attempt.deadline - now)
            margin = lease_margin(attempt.job.ttr)
            stop_at = attempt.lease_until - margin
            if now < stop_at:
                wake = min(wake, stop_at - now)
                continue
            if attempt.stop is not Stop.LEASE:
                log.warning("job %d: its lease (ttr %g s) could not be renewed and passes in "
                            "%.2f s: stopping the attempt", attempt.job.id, attempt.job.ttr,
                            attempt.lease_until - now)  # fmt: skip
                attempt.interrupt(Stop.LEASE)
            give_up_at = attempt.lease_until - margin / 2
            if now >= give_up_at:
                self._abandon(attempt, now)
            wake = min(wake, give_up_at - now)
        return wake

    def _abandon(self, attempt: Attempt, now: float) -> None:
        log.critical(
            "job %d (%s) did not stop when asked and its lease passes in %.2f s: exiting "
            "now so that it cannot run here while another worker runs it",
            attempt.job.id, attempt.job.task, attempt.lease_until - now,
        )  # fmt: skip
        self._exit_stuck()


def _time_out(attempt: Attempt) -> None:
    job = attempt.job
    log.warning("job %d (%s) ran past its time limit of %g s: stopping it", job.id, job.task,
                job.timeout, extra={"fields": {"job_id": job.id, "task": job.task,
                                               "timeout": job.timeout}})  # fmt: skip
    attempt.interrupt(Stop.TIMEOUT)
