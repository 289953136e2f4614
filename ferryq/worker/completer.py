"""Batches finished attempts into few writes (group commit).

Finishes accumulate while a write is in flight and go out together in the next one,
so batches grow with load and a lone finish is written at once, with no timer. The
write itself is the producer's cycle (finish and claim in one transaction); this
class owns the buffer and keeps writing until it is empty. A failed write is
retried: a finish is never dropped while the worker runs. Only a stopping worker
whose database stays unreachable gives up, after a bounded wait (``drain``), on
the finishes it could not write; their jobs run again once their leases expire.

A batch the database refuses because of one finish's values must not hold back every
finish behind it: after a failed write the next one takes half the batch, so such a
finish ends up written alone, and when the database refuses it alone (``refuses``)
it is replaced by a failed attempt that says so (``refused``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from ferryq import _json
from ferryq.faults import MAX_BACKOFF, FaultLog
from ferryq.logs import fields, id_list
from ferryq.store.base import Finish, FinishKind, FinishReport

log = logging.getLogger("ferryq.worker")
#: Stale completions logged one by one per batch; the rest of the batch in one line.
STALE_LINES = 20


class Completer:
    def __init__(
        self,
        on_written: Callable[[list[Finish], FinishReport], None],
        refuses: Callable[[BaseException], bool],
        max_batch: int = 2000,
    ) -> None:
        self._on_written = on_written
        self._refuses = refuses
        self._max_batch = self._take = max_batch
        # After a failed write: the first ``_suspect`` pending finishes hold one the
        # database refuses, and each write takes half of those still suspect.
        self._suspect = 0
        self._again_now = False  # the last failed write is being narrowed down: no wait
        self._pending: list[Finish] = []
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._flush: Callable[[], Awaitable[object]] | None = None
        self.writes = 0  # batches written so far: lets a burst know nothing changed
        self._faults = FaultLog(log)
        self._in_doubt: set[tuple[int, int]] = set()  # (id, fence) of finishes sent again

    def bind(self, flush: Callable[[], Awaitable[object]]) -> None:
        """``flush`` takes the pending finishes (``take``) and writes them."""
        self._flush = flush

    @property
    def backlog(self) -> int:
        return len(self._pending) + self._in_flight

    @property
    def pending(self) -> list[Finish]:
        """The finishes not written yet (those of a write in flight excepted)."""
        return list(self._pending)

    def add(self, finish: Finish) -> None:
        if not self._pending:  # else run() is already on its way to write them
            self._idle.clear()
            self._wake.set()
        self._pending.append(finish)

    def take(self) -> list[Finish]:
        batch = self._pending[: self._take]
        del self._pending[: len(batch)]
        self._in_flight += len(batch)
        return batch

    @property
    def in_doubt(self) -> bool:
        """A write failed and the finishes it held are being written apart: the next
        writes should hold nothing else, so that a refusal is theirs."""
        return self._suspect > 0

    def restore(self, batch: list[Finish], error: BaseException, alone: bool) -> None:
        """Put back a batch whose write failed with ``error``, ahead of newer finishes.
        The next write takes half of it; a finish the database refused when written
        ``alone`` (the write held nothing else) is replaced by a failed attempt."""
        self._in_flight -= len(batch)
        if isinstance(error, Exception) and batch:  # not a write cut off by the stop
            refusal = self._refuses(error)
            if not refusal:  # the connection may have dropped after the commit
                self._in_doubt.update((f.id, f.fence) for f in batch)
            if alone and len(batch) == 1 and refusal and batch[0].kind in _VALUES:
                log.error("the database refused the outcome of job %d (%s), writing a failed "
                          "attempt instead: %r", batch[0].id, batch[0].kind, error)  # fmt: skip
                self._again_now = (batch[0].error or {}).get("type") != REFUSED  # once
                batch = [refused(batch[0], error)]
                self._suspect, self._take = 0, self._max_batch
            else:
                self._suspect = len(batch)
                self._take = max(1, len(batch) // 2)
                self._again_now = refusal
        self._pending[:0] = batch
        if batch:  # run() may be waiting: the claiming cycle took these, not run()
            self._idle.clear()
            self._wake.set()

    def written(self, batch: list[Finish], report: FinishReport) -> None:
        self._in_flight -= len(batch)
        if batch:
            self._suspect = max(0, self._suspect - len(batch))
            self._take = (self._suspect + 1) // 2 if self._suspect else self._max_batch
            self.writes += 1
            self._on_written(batch, self._sorted_out(batch, report))
        if not self.backlog:
            self._idle.set()

    def _sorted_out(self, batch: list[Finish], report: FinishReport) -> FinishReport:
        """The report with the finishes sent again after a write whose outcome is
        unknown, and now refused, taken out of ``stale``: most likely that write
        landed, and they are not a late worker's. The rest are logged as stale."""
        if not self._in_doubt:
            _log_stale(report.stale, batch)
            return report
        fences = {f.id: f.fence for f in batch}
        resent = [i for i in report.stale if (i, fences[i]) in self._in_doubt]
        self._in_doubt.difference_update(fences.items())
        if resent:
            log.info("%d completion(s) sent again after a write whose answer was lost "
                     "were refused, most likely because that write landed: %s",
                     len(resent), id_list(resent),
                     extra=fields(count=len(resent), job_ids=resent))  # fmt: skip
        stale = [i for i in report.stale if i not in set(resent)]
        _log_stale(stale, batch)
        return FinishReport(report.accepted, stale)

    async def run(self) -> None:
        assert self._flush is not None, "bind() a flush before run()"
        delay = 0.05
        while True:
            if not self._pending:
                if self._closing and not self._in_flight:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            try:
                await self._flush()
            except Exception as exc:
                if self._again_now:  # the database answers: isolate the finish at once
                    self._again_now = False
                    log.warning("writing completions failed, %d pending: %r",
                                len(self._pending), exc)  # fmt: skip
                    continue
                self._faults.failed("writing completions", exc, retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF)
                continue
            self._faults.succeeded("writing completions")
            delay = 0.05

    async def drain(self, within: float) -> None:
        """Write everything pending, then let ``run`` return; or give up after
        ``within`` seconds, when ``run`` is to be cancelled (a write cut off puts its
        batch back in ``pending``)."""
        self._closing = True
        self._wake.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), within)


def _log_stale(stale: list[int], batch: list[Finish]) -> None:
    """A line for each finish refused because its fencing token is no longer the job's
    (the job was recovered, or claimed again, meanwhile): the first STALE_LINES of a
    batch one by one, the others together."""
    if not stale:
        return
    finishes = {f.id: f for f in batch}
    for job_id in stale[:STALE_LINES]:
        finish = finishes.get(job_id)
        fence = None if finish is None else finish.fence
        outcome = None if finish is None else finish.kind
        log.warning("stale completion of job %d refused: fence %s is no longer current (the "
                    "job was recovered or claimed again meanwhile); outcome %s dropped", job_id,
                    fence, outcome, extra=fields(job_id=job_id, fence=fence,
                    outcome=outcome))  # fmt: skip
    if rest := stale[STALE_LINES:]:
        log.warning("and %d more stale completion(s) refused: %s", len(rest), id_list(rest),
                    extra=fields(count=len(rest), job_ids=rest))  # fmt: skip


#: What a finish's values are, by its kind: what the database may have refused.
_VALUES = {"succeeded": "result", "next": "next stage", "retry": "error", "dead": "error"}
#: The error type of an attempt whose outcome the database refused.
REFUSED = "OutcomeRefused"


def refused(finish: Finish, error: BaseException) -> Finish:
    """The failed attempt written in place of ``finish``, whose values the database
    refused with ``error``: a retry stays a retry and a dead job dead, their error
    replaced by this one; a result or a next stage refused ends the job dead, as one
    that cannot be serialized does. Cancelled and returned finishes carry no values of
    their own, so they stay as they are."""
    if finish.kind not in _VALUES:
        return finish
    former = finish.error or {}

    def kept(key: str, kind: type) -> Any:
        value = former.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return None
        return _json.printable(value) if isinstance(value, str) else value

    message = _json.printable(f"{type(error).__name__}: {error}")[:2000]
    replacement = {
        "type": REFUSED,
        "message": f"the database refused this attempt's {_VALUES[finish.kind]}: {message}",
        "traceback": None,
        "attempt": kept("attempt", int),
        "stage": kept("stage", str),
        "worker": kept("worker", str),
        "at": finish.finished_at if math.isfinite(finish.finished_at) else None,
    }
    kind: FinishKind = "retry" if finish.kind == "retry" else "dead"
    return dataclasses.replace(
        finish, kind=kind, result="null", error=replacement, stage=None, context=None,
        run_at=finish.run_at if kind == "retry" else None,
        order_time=finish.order_time if kind == "retry" else None,
    )  # fmt: skip
