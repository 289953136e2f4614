"""Worker: one process's slots, its heartbeat, its share of maintenance, its shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import secrets
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from ferryq import logs, metrics
from ferryq._version import __version__
from ferryq.clock import ServerClock
from ferryq.errors import StoreError
from ferryq.faults import FaultLog
from ferryq.policy import JobOptions
from ferryq.store import safe_url
from ferryq.store.base import Claimed, Finish, FinishKind, FinishReport, Store, WorkerInfo
from ferryq.worker import attempt_log, executor
from ferryq.worker.completer import Completer
from ferryq.worker.executor import Attempt, Executor, Stop
from ferryq.worker.leases import LeaseKeeper
from ferryq.worker.maintenance import MaintenanceLoop
from ferryq.worker.periodic import PeriodicLoop
from ferryq.worker.producer import Producer

if TYPE_CHECKING:
    from ferryq.worker.app_protocol import WorkerApp

log = logging.getLogger("ferryq.worker")

# A stop waits up to the grace period for running jobs, then up to the grace period
# again, and at least this many seconds, for their outcomes to be written.
MIN_FINISH_WAIT = 5.0


class Worker:
    """Runs the app's tasks. ``await run()`` returns after a graceful stop or a burst;
    it raises StoreError if, as it stopped, the database would not take the outcome
    of every attempt (see docs/guarantees.md, Graceful shutdown)."""

    def __init__(
        self,
        app: WorkerApp,
        *,
        concurrency: int = 10,
        queues: Sequence[str] | None = None,
        burst: bool = False,
        prefetch: int | None = None,
        batch: int = 500,
        grace: float = 30.0,
        heartbeat_interval: float = 1.0,
        maintenance_interval: float = 0.5,
        leader_ttl: float = 5.0,
        name: str | None = None,
        handle_signals: bool = True,
        history_retention: float = 14 * 86400.0,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer (got {concurrency!r})")
        if prefetch is not None and prefetch < 0:
            raise ValueError("prefetch must not be negative")
        if grace < 0:
            raise ValueError("grace must not be negative")
        self.app = app
        self.concurrency = concurrency
        self.queues = list(queues) if queues else _task_queues(app)
        for queue in self.queues:
            JobOptions(queue=queue).validate()
        self.burst = burst
        self.prefetch = max(1, concurrency // 4) if prefetch is None else prefetch
        self.batch = batch
        self.grace = grace
        self.heartbeat_interval = heartbeat_interval
        self.maintenance_interval = maintenance_interval
        self.leader_ttl = leader_ttl
        if history_retention <= 0:
            raise ValueError("history_retention must be a positive number of seconds")
        self.history_retention = history_retention
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.handle_signals = handle_signals
        self.active: dict[int, Attempt] = {}  # claimed, handler not finished
        self._queued: list[_InOrder] = []  # claimed, waiting for a slot: a heap in order
        # Attempts whose job was claimed again (their lease lost) while they still run;
        # the new claim waits for them to end (``Attempt.successor``).
        self._superseded: dict[int, Attempt] = {}
        self._counts: dict[str, metrics.QueueMetrics] = {}  # by queue
        self.leases = LeaseKeeper(app.clock, self.active, self._drop_unstarted)
        self._executor: Executor | None = None
        # The executor's run, or run_with_hooks when the App has attempt hooks.
        self._run_handler: Callable[[Attempt], Awaitable[Finish]] | None = None
        self._faults = FaultLog(log)
        self._running = 0
        self.stale_completions = 0
        self.finished = 0
        self._threads: ThreadPoolExecutor | None = None
        self._beat_now = asyncio.Event()
        self._stop_requested = False
        self._parent: int | None = None  # the parent process when signals were installed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._store: Store | None = None
        self._producer: Producer | None = None
        self._completer: Completer | None = None
        self._started_at = 0.0
        self._maintenance: MaintenanceLoop | None = None
        self._periodic: PeriodicLoop | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        store = self._store = await self.app.store()
        await store.reserve()
        if any(not t.is_async for t in self.app.tasks.values()):
            self._threads = ThreadPoolExecutor(self.concurrency, thread_name_prefix="ferryq-job")
        completer = self._completer = Completer(self._on_written, store.refuses)
        producer = self._producer = Producer(
            store, completer, namespace=self.app.namespace, queues=self.queues,
            worker_id=self.id, capacity=self.concurrency + self.prefetch,
            batch=self.batch, clock=self.app.clock, start=self._start_claimed, active=self.active,
        )  # fmt: skip
        self._executor = Executor(
            worker=self.id, clock=self.app.clock, threads=self._threads,
            hooks=self.app.hooks if self.app.hooks.around_attempts else None,
            results_of=store.job_dependency_results, wake=self._request_heartbeat_threadsafe,
        )  # fmt: skip
        executor = self._executor
        self._run_handler = executor.run if executor.hooks is None else executor.run_with_hooks
        completer.bind(producer.cycle)
        maintenance = self._maintenance = MaintenanceLoop(
            store, self.id, self.app.clock, interval=self.maintenance_interval,
            leader_ttl=self.leader_ttl, retention=self.history_retention,
        )  # fmt: skip
        if self.app.schedules:
            self._periodic = PeriodicLoop(
                self.app, store, self.id, self.app.clock, interval=self.maintenance_interval,
                leader_ttl=self.leader_ttl,
            )  # fmt: skip
        self._started_at = self.app.clock()
        self._install_signals()
        database = safe_url(self.app.url)
        log.info(
            "worker %s started: queues %s, %d slots, namespace %s, database %s, ferryq %s",
            self.id, ",".join(self.queues), self.concurrency, self.app.namespace, database,
            __version__,
            extra=logs.fields(worker=self.id, queues=self.queues, concurrency=self.concurrency,
                              namespace=self.app.namespace, database=database,
                              version=__version__, burst=self.burst),
        )  # fmt: skip
        try:
            await self._beat()
        except Exception as exc:  # the heartbeat loop goes on trying
            self._faults.failed("heartbeat", exc)
        background = [
            asyncio.create_task(completer.run(), name="ferryq-completer"),
            asyncio.create_task(self._heartbeat_loop(), name="ferryq-heartbeat"),
            asyncio.create_task(maintenance.run(), name="ferryq-maintenance"),
        ]
        if self._periodic is not None:
            background.append(asyncio.create_task(self._periodic.run(), name="ferryq-periodic"))
        background.append(asyncio.create_task(self.leases.watch(), name="ferryq-lease-watch"))
        unwritten: list[Finish] = []
        try:
            if self.burst:
                await maintenance.once()
                if self._periodic is not None:
                    await self._periodic.once()
            await self._produce(producer)
        finally:
            for service in background[1:]:
                service.cancel()
            await completer.drain(max(self.grace, MIN_FINISH_WAIT))
            background[0].cancel()
            for service in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await service
            unwritten = completer.pending
            if unwritten:
                unwritten_ids = sorted(f.id for f in unwritten)
                log.error(
                    "stopping without writing the outcome of %d attempt(s), jobs %s: they "
                    "run again once their leases expire",
                    len(unwritten), logs.id_list(unwritten_ids),
                    extra=logs.fields(count=len(unwritten), job_ids=unwritten_ids,
                                      worker=self.id),
                )  # fmt: skip
                # Nor would the database take the goodbye: the worker's entry and any
                # leadership it holds expire with their heartbeat and lease.
            else:
                await self._leave(store)
            self._remove_signals()
            if self._threads is not None:
                self._threads.shutdown(wait=False, cancel_futures=True)
            log.info(
                "worker %s stopped after %.1f s: %d attempt(s) finished, %d stale, %d unwritten",
                self.id, self.app.clock() - self._started_at, self.finished,
                self.stale_completions, len(unwritten),
                extra=logs.fields(worker=self.id, queues=self.queues, database=database,
                                  uptime=round(self.app.clock() - self._started_at, 3),
                                  finished=self.finished, stale=self.stale_completions,
                                  unwritten=len(unwritten)),
            )  # fmt: skip
        if unwritten:
            raise StoreError(
                f"the outcome of {len(unwritten)} attempt(s) could not be written before "
                "the worker stopped; their jobs run again once their leases expire"
            )

    def stop(self) -> None:
        """Stop claiming, finish running jobs within the grace period, then return."""
        self._stop_requested = True
        if self._producer is not None:
            self._producer.stopping.set()

    async def _produce(self, producer: Producer) -> None:
        """Claim until stopped (or, in burst mode, until nothing is left), then stop
        the running jobs. A claim still waiting at the stop, for a locked or
        unreachable database, has the grace period beside the running jobs, then is
        cut off: finishes it carried are written with the others (or reported
        unwritten), and the database does not make a write whose caller has gone."""
        producing = asyncio.ensure_future(producer.run(self.burst))
        stopped = asyncio.ensure_future(producer.stopping.wait())
        try:
            await asyncio.wait((producing, stopped), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            producing.cancel()
            raise
        finally:
            stopped.cancel()
        if producing.done():
            producing.result()
            await self._shutdown()
            return
        await asyncio.gather(self._shutdown(), _cut_off(producing, self.grace))

    async def _shutdown(self) -> None:
        # Prefetched jobs that never started go straight back.
        while self._queued:
            self._settle_queued(heapq.heappop(self._queued).attempt, "returned")
        runners = [a.runner for a in self.active.values() if a.runner is not None]
        if runners:
            log.info("waiting up to %.0f s for %d running job(s)", self.grace, len(runners),
                     extra=logs.fields(grace=self.grace, count=len(runners), worker=self.id,
                                       job_ids=sorted(a.job.id for a in self.active.values()
                                                      if a.runner is not None)))  # fmt: skip
            await asyncio.wait(runners, timeout=self.grace)
        leftovers = [a for a in (*self.active.values(), *self._superseded.values()) if a.running]
        for attempt in leftovers:
            attempt.interrupt(Stop.SHUTDOWN)
        if leftovers:
            # The heartbeat still renews their leases: a sync handler blocked in C may
            # take a while to see the interruption, and must end before its job can
            # run elsewhere. A second signal exits at once.
            log.warning("stopping %d unfinished job(s); they go back to the queue",
                        len(leftovers), extra=logs.fields(count=len(leftovers), worker=self.id,
                        job_ids=sorted(a.job.id for a in leftovers)))  # fmt: skip
            await asyncio.wait([a.runner for a in leftovers if a.runner is not None])

    async def _leave(self, store: Store) -> None:
        async def leave() -> None:
            await store.worker_remove(self.id)
            if self._maintenance is not None:
                await self._maintenance.leave()
            if self._periodic is not None:
                await self._periodic.leave()

        try:
            await asyncio.wait_for(leave(), MIN_FINISH_WAIT)
        except TimeoutError:
            log.warning("could not deregister worker %s within %.0f s: its entry expires "
                        "with its heartbeat", self.id, MIN_FINISH_WAIT)  # fmt: skip
        except Exception:
            log.exception("could not deregister worker %s", self.id)

    # -- attempts ----------------------------------------------------------------

    def _start_claimed(self, jobs: list[Claimed]) -> None:
        """Jobs just claimed, in the order they are to start."""
        tasks, counts = self.app.tasks, self._counts
        for job in jobs:
            queue = counts.get(job.queue)
            if queue is None:
                queue = counts[job.queue] = metrics.QueueMetrics(job.namespace, job.queue)
            self._start(Attempt(job, tasks.get(job.task), job.lease_until, queue))

    def _start(self, attempt: Attempt) -> None:
        """A claimed job: run it now if a slot is free, else queue it (prefetch)."""
        job = attempt.job
        attempt.counts.claimed(max(attempt.lease_until - job.ttr - job.run_at, 0.0))
        previous = self.active.get(job.id)
        self.active[job.id] = attempt
        if previous is not None and not previous.running:
            # Claimed again while it waited here for a slot, its lease lost meanwhile:
            # the database has moved on, so the old claim just goes.
            self._drop_queued(previous)
            previous = None
        if (ending := self._superseded.get(job.id)) is not None:
            ending.successor = attempt  # still waiting for an older attempt to end
            return
        if previous is not None:
            # Claimed again while an attempt of ours still runs: its lease was lost
            # (the database was out of reach) and the job recovered. The new attempt
            # starts only once the old one has ended (``_release``), never beside it.
            log.warning("job %d was claimed again (fence %d) while its attempt with fence "
                        "%d still runs here: stopping that one first",
                        job.id, job.fence, previous.job.fence)  # fmt: skip
            self._superseded[job.id] = previous
            previous.successor = attempt
            previous.interrupt(Stop.LEASE)
            return
        if self._running < self.concurrency and not self._stop_requested:
            self._launch(attempt)  # the common case, said first
        else:
            self._enqueue_or_launch(attempt)

    def _enqueue_or_launch(self, attempt: Attempt) -> None:
        if self._producer is not None and self._producer.stopping.is_set():
            self._settle_queued(attempt, "returned")  # a claim that waited: not now
        elif self._running < self.concurrency:
            self._launch(attempt)
        else:
            heapq.heappush(self._queued, _InOrder(attempt))

    def _launch(self, attempt: Attempt) -> None:
        job, now = attempt.job, self.app.clock()
        if not self.leases.start(attempt, now):
            log.warning("job %d not started: its lease ran out before a slot was free", job.id)
            self._settle_queued(attempt, "returned")
            return
        self._running += 1
        attempt.counts.started(max(now - (attempt.lease_until - job.ttr), 0.0))
        attempt.runner = asyncio.create_task(self._run_attempt(attempt))

    async def _run_attempt(self, attempt: Attempt) -> None:
        assert self._run_handler is not None and self._executor is not None
        clock = self.app.clock
        try:
            finish = await self._run_handler(attempt)
        except asyncio.CancelledError:
            # run() handles the cancellation of the handler itself; a cancel that
            # lands after it returned must not lose the job.
            finish = Finish("returned", attempt.job.id, attempt.job.fence, clock())
        except Exception as exc:  # a fault of ours: the attempt still ends, and says so
            log.exception("running job %d failed outside its handler", attempt.job.id)
            finish = executor.failure(attempt.job, exc, clock(), self.id,
                                      started_at=attempt.started_at)  # fmt: skip
        else:
            if attempt_log.wanted(finish.kind):
                attempt_log.log_attempt(attempt, finish, self.id)
            if self._executor.hooks is not None:
                finish.finished_at = clock()  # the after hooks ran since
        self._running -= 1
        self._launch_queued()
        self._release(attempt, finish)

    def _launch_queued(self) -> None:
        """Start the first prefetched job, in ``order_time`` order, whose ttl has not
        passed meanwhile. One that expired waiting for a slot is handed back unstarted
        (docs/guarantees.md: never started after its ttl); the leader's next round
        expires it."""
        while self._queued and self._running < self.concurrency:
            attempt = heapq.heappop(self._queued).attempt
            expires_at = attempt.job.expires_at
            if expires_at is None or expires_at > self.app.clock():
                self._launch(attempt)
            else:
                self._settle_queued(attempt, "returned")

    def _drop_queued(self, attempt: Attempt) -> bool:
        """Take ``attempt`` out of the prefetched ones, if it is there."""
        entry = _InOrder(attempt)
        if entry not in self._queued:
            return False
        self._queued.remove(entry)
        heapq.heapify(self._queued)
        return True

    def _drop_unstarted(self, attempt: Attempt) -> None:
        """A cancel requested for a prefetched job that has not started: it ends so."""
        if self._drop_queued(attempt):
            self._settle_queued(attempt, "cancelled")

    def _settle_queued(self, attempt: Attempt, kind: FinishKind) -> None:
        """End a prefetched job that never started (shutdown, cancel, lease passed)."""
        self._release(attempt, Finish(kind, attempt.job.id, attempt.job.fence, self.app.clock()))

    def _release(self, attempt: Attempt, finish: Finish) -> None:
        job_id = attempt.job.id
        if self.active.get(job_id) is attempt:
            del self.active[job_id]
        elif self._superseded.get(job_id) is attempt:
            del self._superseded[job_id]
        assert self._producer is not None and self._completer is not None
        self._producer.slot_freed.set()
        started = attempt.started_at
        finish.lane = attempt.job.lane
        attempt.counts.ended(finish.kind, None if started is None else finish.finished_at - started)
        self.leases.ended(attempt, finish)
        self._completer.add(finish)
        if (successor := attempt.successor) is not None and self.active.get(job_id) is successor:
            self._enqueue_or_launch(successor)

    def _on_written(self, batch: list[Finish], report: FinishReport) -> None:
        self.leases.written(batch)
        self.finished += len(report.accepted)
        self.stale_completions += len(report.stale)
        if report.stale:
            metrics.STALE_REJECTIONS.inc(len(report.stale))
        if self._producer is not None:  # a burst may be waiting for the last write
            self._producer.slot_freed.set()

    # -- heartbeat: liveness, lease extension, cancellation ---------------------

    def _request_heartbeat_threadsafe(self) -> None:
        """Called from handlers, on the loop or in a thread: beat within milliseconds."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._beat_now.set)

    async def _heartbeat_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.leases.renew_within(self.heartbeat_interval)):
                    await self._beat_now.wait()
            self._beat_now.clear()
            try:
                await self._beat()
            except Exception as exc:
                self._faults.failed("heartbeat", exc)
            else:
                self._faults.succeeded("heartbeat")

    async def _beat(self) -> None:
        """Renew leases first (what keeps jobs from running twice), then say alive."""
        assert self._store is not None
        await self.leases.renew(self._store)
        now = self.app.clock()
        info = WorkerInfo(
            self.id, self.app.namespace, self.queues, socket.gethostname(), os.getpid(),
            self.concurrency, self._started_at, now, running=sorted(self.active),
            stats=metrics.METRICS.snapshot(),
        )  # fmt: skip
        await self._store.worker_beat(info)
        if isinstance(clock := self.app.clock, ServerClock) and clock.due():
            await clock.measure(self._store.server_time)

    # -- signals -----------------------------------------------------------------

    # A supervisor's children get SIGTERM when it dies (its parent-death signal), and
    # Linux sends that signal each time a child is handed on: to another thread of the
    # dying supervisor (its log writer, say), then to init. A worker whose parent has
    # died, or is dying, takes a SIGTERM during or after its stop for that repeat,
    # never for an operator's second signal, and stops as gracefully.

    def _install_signals(self) -> None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        assert self._loop is not None
        self._parent = os.getppid()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._on_signal, sig)

    def _remove_signals(self) -> None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        assert self._loop is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.remove_signal_handler(sig)
        if self._parent_gone():  # a late repeat must not kill the process as it exits
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def _parent_gone(self) -> bool:
        """The process this worker started under has died, or is dying: its first
        thread has ended (a process killed outright loses its threads one by one)."""
        if self._parent is None:
            return False
        if os.getppid() != self._parent:
            return True
        try:
            stat = Path(f"/proc/{self._parent}/stat").read_text()
        except OSError:  # no /proc: no parent-death signal either
            return False
        return stat.rpartition(")")[2].split()[0] == "Z"

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stop_requested and sig == signal.SIGTERM and self._parent_gone():
            log.info("SIGTERM again after the parent process %d died: still stopping",
                     self._parent, extra=logs.fields(signal=sig.name, worker=self.id,
                                                     parent=self._parent))  # fmt: skip
            return
        if self._stop_requested:
            log.warning("second %s: exiting at once", sig.name,
                        extra=logs.fields(signal=sig.name, worker=self.id))  # fmt: skip
            logging.shutdown()  # the lines still waiting in a batch
            os._exit(1)
        log.info("%s: stopping; running jobs have %.0f s to finish", sig.name, self.grace,
                 extra=logs.fields(signal=sig.name, grace=self.grace, worker=self.id))  # fmt: skip
        self.stop()


async def _cut_off(claiming: asyncio.Future[None], within: float) -> None:
    """Let the claim loop end by itself within ``within`` seconds, else cancel it."""
    done, _ = await asyncio.wait((claiming,), timeout=within)
    if not done:
        log.warning("a claim still waits for the database %g s after the stop: "
                    "giving it up", within)  # fmt: skip
        claiming.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await claiming


def _task_queues(app: WorkerApp) -> list[str]:
    return sorted({task.queue for task in app.tasks.values()}) or ["default"]


class _InOrder:
    """A prefetched attempt in the heap: the smallest ``order_time`` starts first."""

    __slots__ = ("attempt", "key")

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.key = (attempt.job.order_time, attempt.job.id)

    def __lt__(self, other: _InOrder) -> bool:
        return self.key < other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _InOrder) and other.attempt is self.attempt

    __hash__ = None  # type: ignore[assignment]
