"""One log line per attempt outcome, on the ``ferryq.attempts`` logger.

The line names the job, its task, the try of how many, the outcome, how long the
handler ran and the error in short; its fields (``ferryq.logs``) carry the same and
more, for the JSON format. It is made for every attempt whose level the logger takes
(``wanted``: nothing at all is made otherwise), so it is made cheaply: the record is
built directly, without the search for the caller's frame that ``Logger.log`` does
(the record names this module as its source), and as a copy of one made once where
the standard record class is in use.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Final

from ferryq.faults import one_line
from ferryq.outcome import TimedOut
from ferryq.store.base import Finish
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
    global _template, _template_fields
    if _template is None:
        _template = logging.LogRecord(log.name, level, __file__, 0, "", None, None, "log_attempt")
        _template_fields = _template.__dict__
    record = _new_record(logging.LogRecord)
    record.__dict__ = values = _template_fields.copy()
    created = time.time()
    # As LogRecord works it out (created % 1 is created - int(created), exactly).
    values["created"], values["msecs"] = created, int(created % 1.0 * 1000) + 0.0
    values["relativeCreated"] = (created - _template.created) * 1000 + _template.relativeCreated
    values["levelno"], values["levelname"] = level, _LEVEL_NAMES[level]
    values["msg"] = text
    return record


_template: logging.LogRecord | None = None
_template_fields: dict[str, object] = {}
_new_record = object.__new__


def _forget_template() -> None:
    """A forked process makes its own: the template names the process."""
    global _template
    _template = None


os.register_at_fork(after_in_child=_forget_template)
_LEVEL_NAMES: Final = {level: logging.getLevelName(level) for level in set(LEVELS.values())}


def wanted(kind: str) -> bool:
    """Whether the logger takes the line of an attempt that ended ``kind``."""
    return log.isEnabledFor(LEVELS[kind])


def log_attempt(attempt: Attempt, finish: Finish, worker: str) -> None:
    """Log the line of ``attempt``, which ended with ``finish`` (check ``wanted``
    first: this does not)."""
    job, kind, error = attempt.job, finish.kind, attempt.error
    started = attempt.started_at
    duration = 0.0 if started is None else max(finish.finished_at - started, 0.0)
    if error is None:  # the common case: said in one piece
        timed_out, error_line, retry_at = False, None, None
        text = (f"job {job.id} {job.task} attempt {job.attempts}/{job.max_tries} "
                f"{_SAID.get(kind, kind)} in {duration:.3f} s")  # fmt: skip
    else:
        timed_out, error_line = isinstance(error, TimedOut), one_line(error)
        said = "timed out" if timed_out else _SAID.get(kind, kind)
        text = (f"job {job.id} {job.task} attempt {job.attempts}/{job.max_tries} {said} in "
                f"{duration:.3f} s")  # fmt: skip
        retry_at = finish.run_at if kind == "retry" else None
        if retry_at is not None:
            text += f", retry in {max(retry_at - ((started or 0.0) + duration), 0.0):.1f} s"
        text += f": {error_line}"
    record = _record(LEVELS[kind], text)
    record.fields = {
        "job_id": job.id, "task": job.task, "queue": job.queue, "lane": job.lane,
        "attempt": job.attempts, "max_tries": job.max_tries, "outcome": kind,
        "timed_out": timed_out, "duration": round(duration, 6), "error": error_line,
        "retry_at": retry_at, "stage": job.stage, "fence": job.fence, "worker": worker,
    }  # fmt: skip
    log.handle(record)
