"""The log formats, the structured-fields convention, and the event lines that use it."""

from __future__ import annotations

import datetime
import io
import json
import logging
import math
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ferryq import logs
from ferryq.server.access import admin_path
from ferryq.store.base import Finish, FinishReport
from ferryq.worker.completer import STALE_LINES, Completer
from ferryq.worker.leadership import LeaderLoop

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class Broken:
    """An object whose every way of turning into text fails."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def record(
    msg: object = "job %d done",
    args: tuple[Any, ...] = (7,),
    *,
    level: int = logging.INFO,
    extra: dict[str, Any] | None = None,
    exc: bool = False,
) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    made = logging.LogRecord("ferryq.worker", level, __file__, 1, msg, args, exc_info)
    made.created = 1_700_000_000.25
    made.msecs = 250.0
    for key, value in (extra or {}).items():
        setattr(made, key, value)
    return made


def as_json(made: logging.LogRecord) -> dict[str, Any]:
    line = logs.JsonFormatter().format(made)
    assert "\n" not in line and line.isascii()
    parsed = json.loads(line)
    assert isinstance(parsed, dict)
    return parsed


def test_fields_is_the_extra_of_a_record_with_fields() -> None:
    assert logs.fields(job_id=7, queue="mail") == {"fields": {"job_id": 7, "queue": "mail"}}


def test_a_json_line_has_its_stable_keys_first_then_the_fields_then_the_traceback() -> None:
    extra = logs.fields(job_id=7, task="send", lane=None, attempt=2, duration=0.5)
    parsed = as_json(record(level=logging.WARNING, extra=extra, exc=True))
    assert list(parsed) == ["ts", "level", "logger", "msg", "job_id", "task", "lane", "attempt",
                            "duration", "exc"]  # fmt: skip
    assert parsed["ts"] == "2023-11-14T22:13:20.250Z"
    assert TS.match(parsed["ts"])
    assert (parsed["level"], parsed["logger"], parsed["msg"]) == (
        "WARNING", "ferryq.worker", "job 7 done",
    )  # fmt: skip
    assert (parsed["job_id"], parsed["lane"], parsed["duration"]) == (7, None, 0.5)
    assert parsed["exc"].startswith("Traceback (most recent call last):")
    assert parsed["exc"].endswith("ValueError: boom")


def test_a_record_without_fields_or_traceback_has_the_four_keys() -> None:
    assert list(as_json(record())) == ["ts", "level", "logger", "msg"]


def test_fields_never_replace_the_stable_keys() -> None:
    extra = logs.fields(ts="forged", level="forged", logger="forged", msg="forged",
                        exc="forged", job_id=1)  # fmt: skip
    parsed = as_json(record(extra=extra))
    assert parsed == {"ts": "2023-11-14T22:13:20.250Z", "level": "INFO",
                      "logger": "ferryq.worker", "msg": "job 7 done", "job_id": 1}  # fmt: skip


def test_values_json_cannot_hold_are_written_as_their_str() -> None:
    when = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
    circular: list[object] = []
    circular.append(circular)
    extra = logs.fields(when=when, nan=math.nan, ids=(1, 2), keyed={(1, 2): "x"},
                        nested={"at": when}, circular=circular, **{"odd key": {1}})  # fmt: skip
    parsed = as_json(record(extra=extra))
    assert parsed["when"] == str(when)
    assert parsed["nan"] == "nan"
    assert parsed["ids"] == [1, 2]
    assert parsed["keyed"] == "{(1, 2): 'x'}"
    assert parsed["nested"] == {"at": str(when)}
    assert parsed["circular"] == "[[...]]"
    assert parsed["odd key"] == "{1}"


def test_a_broken_field_or_message_still_gives_a_line() -> None:
    parsed = as_json(record(extra=logs.fields(bad=Broken(), nested=[Broken()], job_id=3)))
    assert parsed["bad"] == "<unprintable Broken>"
    assert parsed["nested"] == ["<unprintable Broken>"]
    assert parsed["job_id"] == 3
    # Arguments that do not fit the message, and a message that cannot be printed.
    assert as_json(record("job %d of %d", (1,)))["msg"] == "job %d of %d (1,)"
    assert as_json(record(Broken(), ()))["msg"] == "<unprintable Broken> ()"
    assert as_json(record("%s", (Broken(),)))["msg"] == "%s <unprintable tuple>"
    # Fields that are not a mapping are left out.
    assert list(as_json(record(extra={"fields": ["job_id", 1]}))) == ["ts", "level", "logger",
                                                                       "msg"]  # fmt: skip


def test_a_text_line_has_time_level_logger_and_message_but_not_the_fields() -> None:
    made = record(extra=logs.fields(job_id=7, queue="mail"))
    line = logs.TextFormatter().format(made)
    when = datetime.datetime.fromtimestamp(made.created).strftime("%Y-%m-%d %H:%M:%S")
    assert line == f"{when}.250 INFO    ferryq.worker: job 7 done"
    with_traceback = logs.TextFormatter().format(record(exc=True))
    assert with_traceback.splitlines()[0].endswith("ferryq.worker: job 7 done")
    assert with_traceback.splitlines()[-1] == "ValueError: boom"
    assert (
        logs.TextFormatter()
        .format(record("%s", (Broken(),)))
        .endswith("ferryq.worker: %s <unprintable tuple>")
    )


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        logging.captureWarnings(False)


@pytest.mark.usefixtures("root_restored")
def test_configure_sends_records_at_the_level_and_above_in_the_format() -> None:
    stream = io.StringIO()
    logs.configure("WARNING", "json", stream=stream)
    logging.getLogger("ferryq.worker").info("hidden")
    logging.getLogger("myapp").warning("shown %d", 1, extra=logs.fields(job_id=2))
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["logger"], line["msg"], line.get("job_id")) for line in lines] == [
        ("myapp", "shown 1", 2)
    ]
    with pytest.raises(ValueError, match="log level"):
        logs.configure("verbose")
    with pytest.raises(ValueError, match="log format"):
        logs.configure("info", "xml")


def test_an_admin_path_masks_the_token_it_names() -> None:
    assert admin_path("/token/orders/abcdefghijklmnopqrstuv") == "/token/orders/***"
    assert admin_path("/token/orders/abcdefghijklmnopqrstuv/limit") == "/token/orders/***/limit"
    assert admin_path("/token/orders") == "/token/orders"
    assert admin_path("/info") == "/info"


# -- event lines ---------------------------------------------------------------


def fields_of(caplog: pytest.LogCaptureFixture, logger: str) -> list[dict[str, Any]]:
    return [r.__dict__["fields"] for r in caplog.records if r.name == logger]


async def test_stale_completions_are_one_warning_each_with_job_id_and_fence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    completer = Completer(lambda batch, report: None, lambda exc: False)
    batch = [Finish("succeeded", job_id, 3, 100.0) for job_id in range(1, STALE_LINES + 6)]
    stale = [f.id for f in batch[1:]]
    caplog.set_level(logging.INFO, "ferryq")
    completer.written(batch, FinishReport([1], stale))
    lines = fields_of(caplog, "ferryq.worker")
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert lines[:STALE_LINES] == [
        {"job_id": i, "fence": 3, "outcome": "succeeded"} for i in stale[:STALE_LINES]
    ]
    assert lines[STALE_LINES:] == [{"count": 4, "job_ids": stale[STALE_LINES:]}]
    assert "stale completion of job 2 refused: fence 3" in caplog.records[0].getMessage()
    caplog.clear()
    completer.written(batch[:1], FinishReport([1], []))
    assert not caplog.records


class Leading(LeaderLoop[bool]):
    """A leadership that answers from a script of rounds."""

    def __init__(self, rounds: list[bool]) -> None:
        self.rounds = rounds
        super().__init__(self, "w1", lambda: 0.0, "maintenance")  # type: ignore[arg-type]

    async def leader_acquire(self, name: str, holder: str, ttl: float, now: float) -> bool:
        return self.rounds.pop(0)

    async def leader_release(self, name: str, holder: str) -> None:
        pass

    async def act(self, now: float) -> bool:
        return True

    def idle(self) -> bool:
        return False


async def test_leadership_is_logged_when_it_changes_not_every_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Leading([False, True, True, True, False, False, True])
    caplog.set_level(logging.INFO, "ferryq")
    for _ in range(7):
        await loop.once()
    await loop.leave()
    await loop.leave()  # no longer leading: nothing to say
    changes = fields_of(caplog, "ferryq.leadership")
    assert [(f["event"], f["leadership"], f["worker"]) for f in changes] == [
        ("acquired", "maintenance", "w1"), ("lost", "maintenance", "w1"),
        ("acquired", "maintenance", "w1"), ("released", "maintenance", "w1"),
    ]  # fmt: skip
    assert [r.getMessage() for r in caplog.records][:2] == [
        "w1 is now the maintenance leader", "w1 is no longer the maintenance leader",
    ]  # fmt: skip


def _record(level: int, text: str) -> logging.LogRecord:
    return logging.LogRecord("ferryq.attempts", level, __file__, 1, text, None, None)


def test_lines_wait_in_a_batch_until_a_warning_or_a_flush() -> None:
    stream = io.StringIO()
    handler = logs.BatchedStreamHandler(stream, every=3600)  # no timely write in this test
    handler.setFormatter(logs.TextFormatter())
    handler.handle(_record(logging.INFO, "first"))
    handler.handle(_record(logging.INFO, "second"))
    assert stream.getvalue() == ""  # waiting, not written line by line
    handler.handle(_record(logging.WARNING, "third"))  # written at once, after the others
    assert [line.split(": ", 1)[1] for line in stream.getvalue().splitlines()] == [
        "first", "second", "third"
    ]  # fmt: skip
    handler.handle(_record(logging.INFO, "fourth"))
    handler.flush()  # as logging.shutdown() does at exit
    assert stream.getvalue().splitlines()[-1].endswith("fourth")


def test_waiting_lines_are_written_within_their_period() -> None:
    written = threading.Event()

    class Stream(io.StringIO):
        def flush(self) -> None:
            if self.getvalue():
                written.set()

    stream = Stream()
    handler = logs.BatchedStreamHandler(stream, every=0.01)
    handler.setFormatter(logs.TextFormatter())
    handler.handle(_record(logging.INFO, "soon"))
    assert written.wait(60), "the waiting line was never written"
    assert stream.getvalue().endswith("soon\n")


def test_a_full_batch_is_written_at_once() -> None:
    stream = io.StringIO()
    handler = logs.BatchedStreamHandler(stream, every=3600, most=100)
    handler.setFormatter(logs.TextFormatter())
    for n in range(10):
        handler.handle(_record(logging.INFO, f"line {n}"))
    assert stream.getvalue().count("\n") >= 2
