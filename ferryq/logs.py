"""Logs: stdlib ``logging`` under the ``ferryq`` logger, readable or one JSON object a line.

The library only emits records (``ferryq.worker``, ``ferryq.maintenance``, …) and adds
no handler: an application routes them as it routes any logger. ``configure`` is what
the command line does for its own processes: one handler on stderr, text or JSON.

A record may carry structured fields, ``log.info("...", extra=fields(job_id=7))``: a
dict of JSON-ready values under the record attribute ``fields``. The JSON format puts
them at the top level of its object, after ``ts``, ``level``, ``logger`` and ``msg``
(which they never replace) and before ``exc``; the text format shows the message
alone, which names the key facts itself. A value that JSON cannot hold is written as
its ``str()``, and neither format ever raises: a broken field or message still gives
a line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, TextIO

#: The levels and formats the command line accepts (``--log-level``, ``--log-format``).
LEVELS: Final = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                 "error": logging.ERROR}  # fmt: skip
FORMATS: Final = ("text", "json")
#: The keys every JSON line starts with; a field of the same name is left out.
RESERVED: Final = frozenset({"ts", "level", "logger", "msg", "exc"})


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a record with structured fields: ``{"fields": values}``."""
    return {"fields": values}


def id_list(ids: Sequence[int], most: int = 20) -> str:
    """``1, 2, 3`` for a message: the first ``most`` ids, and how many more."""
    shown = ", ".join(str(i) for i in ids[:most])
    return f"{shown} and {len(ids) - most} more" if len(ids) > most else shown


def configure(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send every record at ``level`` or above to ``stream`` (stderr), as text or JSON.

    For the command line's processes: it replaces the root logger's handlers with one
    of its own, so the application's loggers and the libraries' (uvicorn's included,
    when it is started without a logging config of its own) come out the same way.
    Python's warnings are logged too (``py.warnings``)."""
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)} (got {level!r})")
    if fmt.lower() not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    number = LEVELS[level.lower()]
    handler = BatchedStreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt.lower() == "json" else TextFormatter())
    handler.setLevel(number)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(number)
    logging.captureWarnings(True)


def flush() -> None:
    """Write what the root logger's handlers hold (lines waiting in a batch), so that
    what is printed next comes after them."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # one that cannot flush is no reason to fail
            handler.flush()


def message(record: logging.LogRecord) -> str:
    """The record's message; when its arguments do not fit its format, the format and
    the arguments as they are, rather than an error."""
    try:
        return record.getMessage()
    except Exception:
        return f"{_text(record.msg)} {_text(record.args)}"


class TextFormatter(logging.Formatter):
    """``2024-05-01 12:34:56.789 WARNING ferryq.maintenance: message``, local time,
    then the traceback if there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s",
                         datefmt="%Y-%m-%d %H:%M:%S")  # fmt: skip

    def format(self, record: logging.LogRecord) -> str:
        record.message = message(record)
        record.asctime = _local_second(int(record.created))
        # The format above, spelled out: a third of the time of formatMessage.
        line = (f"{record.asctime}.{int(record.msecs):03d} {record.levelname:<7} "
                f"{record.name}: {record.message}")  # fmt: skip
        extra = _exception(self, record)
        return f"{line}\n{extra}" if extra else line


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (ASCII only): ``ts`` (UTC, ISO 8601 with
    milliseconds), ``level``, ``logger``, ``msg``, the record's fields, then ``exc``
    (the formatted traceback) when the record has one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": message(record),
        }
        values = getattr(record, "fields", None)
        if isinstance(values, Mapping):
            try:
                items = list(values.items())
            except Exception:  # a mapping that fails to list itself: its fields are lost
                items = []
            for key, value in items:
                name = key if isinstance(key, str) else _text(key)
                if name not in RESERVED:
                    line[name] = value
        if extra := _exception(self, record):
            line["exc"] = extra
        try:  # at once, the common case; value by value when one of them fails
            return _ENCODER.encode(line)
        except Exception:
            return "{" + ",".join(f"{_dumps(k)}:{_dumps(v)}" for k, v in line.items()) + "}"


def _timestamp(record: logging.LogRecord) -> str:
    """``2024-05-01T10:00:03.456Z``: the record's time in UTC, to the millisecond."""
    return f"{_utc_second(int(record.created))}.{int(record.msecs):03d}Z"


@functools.lru_cache(maxsize=4)
def _utc_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


@functools.lru_cache(maxsize=4)
def _local_second(second: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))


class BatchedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes lines in batches rather than one write a line: a
    worker logs a line per attempt, and a write per line costs the event loop a
    system call and a hand-over of the interpreter to another thread each time.

    Lines wait at most ``every`` seconds (a thread of its own writes them); a record
    at WARNING or above is written at once, with every line before it, and so is a
    batch past ``most`` characters. ``flush()`` (``logging.shutdown()`` at exit)
    writes what waits. A process killed outright (SIGKILL) loses the lines of its
    last ``every`` seconds at most."""

    def __init__(self, stream: TextIO, every: float = 0.2, most: int = 1 << 16) -> None:
        super().__init__(stream)
        self.every, self.most = every, most
        self._waiting: list[str] = []
        self._size = 0
        self._due = threading.Event()
        threading.Thread(target=self._write_late, name="ferryq-log", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        with self.lock:  # type: ignore[union-attr]
            self._waiting.append(line)
            self._size += len(line)
            now = record.levelno >= logging.WARNING or self._size >= self.most
            first = len(self._waiting) == 1
        if now:
            self.flush()
        elif first:
            self._due.set()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            text, self._waiting, self._size = "".join(self._waiting), [], 0
            try:
                if text:
                    self.stream.write(text)
                self.stream.flush()
            except Exception:  # as StreamHandler: a closed or broken stream is no crash
                pass

    def _write_late(self) -> None:
        while True:
            self._due.wait()
            time.sleep(self.every)
            self._due.clear()
            self.flush()


def _exception(formatter: logging.Formatter, record: logging.LogRecord) -> str:
    """The traceback and stack of ``record``, formatted; never raises."""
    text = ""
    try:
        if record.exc_info:
            text = formatter.formatException(record.exc_info)
        elif record.exc_text:
            text = record.exc_text
        if record.stack_info:
            text = f"{text}\n{formatter.formatStack(record.stack_info)}".lstrip("\n")
    except Exception as exc:
        text = f"(the traceback could not be formatted: {_text(exc)})"
    return text


def _dumps(value: Any) -> str:
    """``value`` as JSON; what JSON cannot hold (an object, a NaN, a dict keyed by
    tuples) as its ``str()``, and what cannot even be printed as its type's name."""
    try:
        return _ENCODER.encode(value)
    except Exception:
        return _ENCODER.encode(_text(value))


def _text(value: object) -> str:
    """``str(value)``, or ``<unprintable TYPE>`` when that fails."""
    try:
        return str(value)
    except Exception:
        try:
            name = type(value).__name__
        except Exception:
            name = "object"
        return f"<unprintable {name}>"


#: Objects JSON cannot hold go in as their ``str()``; NaN and infinities are refused
#: (they are not JSON), so that the value is written as its text instead.
_ENCODER: Final = json.JSONEncoder(default=_text, allow_nan=False, separators=(",", ":"))
