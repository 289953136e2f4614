"""One log line per attempt outcome, on the ``ferryq.attempts`` logger.

The line names the job, its task, the try of how many, the outcome, how long the
handler ran and the error in short; its fields (``ferryq.logs``) carry the same and
more, for the JSON format. It is made for every attempt, so it is made cheaply: the
record is built directly, without the search for the caller's frame that
``Logger.log`` does (the record names this module as its source), and as a copy of
one made once where the standard record class is in use.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Final

from ferryq.hooks import Outcome
from ferryq.worker.executor import Attempt

log: Final = logging.getLogger("ferryq.attempts")

#: The level of an attempt's line, by outcome.
LEVELS: Final[dict[str, int]] = {
    "succeeded": logging.INFO, "next": logging.INFO, "cancelled": logging.INFO,
    "returned": logging.INFO, "retry": logging.WARNING, "dead": logging.ERROR,
}  # fmt: skip
_SAID: Final = {"succeeded": "succeeded", "retry": "failed", "dead": "failed for good",
                "next": "finished its stage", "returned": "returned unfinished"}  # fmt: skip


def _record(level: int, text: str) -> logging.LogRecord:
    """A record as ``Logger.log`` would make it. With the standard record class, it is
    a copy of one made once, with the time, level and message of this one: what the
    standard class works out per record (this file's name, the thread's: the event
    loop's, the process's) is the same for every attempt line of a worker."""
    factory = logging.getLogRecordFactory()
    if factory is not logging.LogRecord:  # the application's own: made as it wants
        return factory(log.name, level, __file__, 0, text, None, None, "log_attempt")
    global _template
    if _template is None or _template.process != os.getpid():
        _template = logging.LogRecord(log.name, level, __file__, 0, "", None, None, "log_attempt")
    record = _new_record(logging.LogRecord)
    record.__dict__.update(_template.__dict__)
    created = time.time()
    record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
    record.relativeCreated = (created - _template.created) * 1000 + _template.relativeCreated
    record.levelno, record.levelname = level, logging.getLevelName(level)
    record.msg = text
    return record


_template: logging.LogRecord | None = None
_new_record = object.__new__


def wanted(outcome: Outcome) -> bool:
    return log.isEnabledFor(LEVELS[outcome.kind])


def log_attempt(attempt: Attempt, outcome: Outcome, worker: str) -> None:
    """Log the line of ``attempt`` (check ``wanted`` first: this does not)."""
    job, kind, timed_out = attempt.job, outcome.kind, outcome.timed_out
    said = "timed out" if timed_out else _SAID.get(kind, kind)
    text = (f"job {job.id} {job.task} attempt {job.attempts}/{job.max_tries} {said} in "
            f"{outcome.duration:.3f} s")  # fmt: skip
    if outcome.retry_at is not None:
        ended = (attempt.started_at or 0.0) + outcome.duration
        text += f", retry in {max(outcome.retry_at - ended, 0.0):.1f} s"
    error = outcome.error
    if error is not None:
        text += f": {error}"
    record = _record(LEVELS[kind], text)
    record.fields = {
        "job_id": job.id, "task": job.task, "queue": job.queue, "lane": job.lane,
        "attempt": job.attempts, "max_tries": job.max_tries, "outcome": kind,
        "timed_out": timed_out, "duration": round(outcome.duration, 6), "error": error,
        "retry_at": outcome.retry_at, "stage": job.stage, "fence": job.fence, "worker": worker,
    }  # fmt: skip
    log.handle(record)
