"""Enqueues the jobs of periodic tasks: one per tick, from one leader at a time.

Every worker of an App with periodic tasks runs the loop; only the holder of the
periodic leadership acts. The leadership is named after the namespace and the task
names, so processes that know the same periodic tasks share one leader, and a
process that knows none (a server, say) never takes it.

Exactly one job per tick rests on two things: the database remembers how far each
schedule was handled (``checked_until``), so a new leader or a restarted one goes on
from there; and each tick's job carries a unique key made of the task and the tick,
so an enqueue repeated by two leaders at once, or by a leader that died between its
enqueue and recording it, returns the existing job instead of a second one.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ferryq import periodic
from ferryq.periodic import Periodic
from ferryq.store.base import PeriodicAdvance, PeriodicEntry, PeriodicState, Store
from ferryq.worker.leadership import LeaderLoop

if TYPE_CHECKING:
    from ferryq.handle import JobHandle
    from ferryq.worker.app_protocol import WorkerApp

log = logging.getLogger("ferryq.periodic")

#: How often the leader declares its periodic tasks again (schedule changes, the
#: time shown as their last update).
DECLARE_EVERY = 30.0


def leadership(namespace: str, tasks: list[str]) -> str:
    digest = hashlib.sha256("\n".join([namespace, *sorted(tasks)]).encode()).hexdigest()
    return f"periodic:{digest[:16]}"


class Scheduler:
    """One round of enqueueing due ticks; call it only while leading."""

    def __init__(self, app: WorkerApp, on_time: float = periodic.ON_TIME) -> None:
        self.app = app
        self.on_time = on_time
        self.entries = [
            PeriodicEntry(p.task, p.schedule.spec, p.queue, p.catch_up)
            for p in app.schedules.values()
        ]
        self._declared_at: float | None = None

    async def tick(self, store: Store, now: float) -> list[int]:
        """Enqueue every tick due by ``now``; return the ids of the jobs it created."""
        created: list[int] = []
        # The tasks are declared (a write) now and then; in between, a read will do.
        declared = self._declared_at
        if declared is None or not 0 <= now - declared < DECLARE_EVERY:
            states = await store.periodic_sync(self.app.namespace, self.entries, now)
            self._declared_at = now
        else:
            states = await store.periodic_list(self.app.namespace)
        for state in states:
            schedule = self.app.schedules.get(state.task)
            if schedule is not None:
                created += await self._run_due(store, schedule, state, now)
        return created

    async def _run_due(
        self, store: Store, task: Periodic, state: PeriodicState, now: float
    ) -> list[int]:
        ticks = periodic.due_ticks(
            task.schedule, state.checked_until, now, task.catch_up, self.on_time
        )
        created: list[int] = []
        last: tuple[float, int] | None = None
        for tick in ticks:
            handle = await self._enqueue(task, tick, now)
            last = (tick, handle.id)
            if handle.created:
                created.append(handle.id)
        checked_until = max(state.checked_until, now)
        next_tick = task.schedule.next_after(checked_until)
        if not ticks and next_tick == state.next_tick:
            return []  # no tick passed since the last round: nothing to write
        skipped = _count_skipped(task, state.checked_until, now, ticks)
        if skipped:
            log.warning("periodic task %s: %d missed tick(s) skipped (catch_up=%d)",
                        task.task, skipped, task.catch_up)  # fmt: skip
        advance = PeriodicAdvance(
            checked_until=checked_until, next_tick=next_tick,
            updated_at=now, last_tick=last[0] if last else None,
            last_job=last[1] if last else None,
        )  # fmt: skip
        await store.periodic_advance(self.app.namespace, task.task, state.checked_until, advance)
        return created

    async def _enqueue(self, task: Periodic, tick: float, now: float) -> JobHandle:
        registered = self.app.tasks[task.task]
        options = registered.defaults.merged(
            run_at=tick,
            unique_key=periodic.tick_key(task.task, tick),
            unique_for=periodic.dedup_window(tick, now),
            meta={"periodic": {"tick": tick, "schedule": task.schedule.spec}},
        )
        (handle,) = await self.app.enqueue_raw(task.task, ["[]"], options)
        return handle


def _count_skipped(task: Periodic, after: float, now: float, enqueued: list[float]) -> int:
    """How many ticks in ``(after, now]`` were left out, for the log: counted up to
    100 past the ones enqueued, so a long gap is not walked through."""
    skipped, seen, taken = 0, 0, set(enqueued)
    tick = task.schedule.previous_before(math.nextafter(now, math.inf))
    while tick > after and seen < len(taken) + 100:
        skipped += tick not in taken
        seen += 1
        tick = task.schedule.previous_before(tick)
    return skipped


class PeriodicLoop(LeaderLoop[list[int]]):
    """The periodic enqueues, in whichever process holds the periodic leadership of
    these tasks; a round returns the ids of the jobs it enqueued."""

    def __init__(
        self,
        app: WorkerApp,
        store: Store,
        holder: str,
        clock: Callable[[], float],
        *,
        interval: float = 0.5,
        leader_ttl: float = 5.0,
    ) -> None:
        name = leadership(app.namespace, list(app.schedules))
        super().__init__(store, holder, clock, name, interval=interval, leader_ttl=leader_ttl)
        self.scheduler = Scheduler(app)

    async def act(self, now: float) -> list[int]:
        return await self.scheduler.tick(self.store, now)

    def idle(self) -> list[int]:
        return []
