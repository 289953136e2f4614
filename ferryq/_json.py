"""JSON encoding with ferryq's rules: strict (no NaN), compact, clear errors."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from json import encoder as _std
from typing import Any

from ferryq.errors import SerializationError

#: Python strings may hold halves of surrogate pairs; no database can store them.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def _make_fast() -> Callable[[Any], str] | None:
    """The C encoder built once, as ``JSONEncoder.encode`` builds it on every call.

    Enqueueing a batch encodes one value per job, and building the encoder is most of
    the cost of encoding a small value. Cycles are not tracked (they end in a
    RecursionError, reported like any other unencodable value). None where the C
    accelerator is missing: then every value goes through the standard encoder.
    """
    make = getattr(_std, "c_make_encoder", None)
    quote = getattr(_std, "c_encode_basestring", None)
    if make is None or quote is None:
        return None
    try:
        iterencode = make(None, _encoder.default, quote, None, ":", ",", False, False, False)
    except TypeError:  # another interpreter's signature
        return None
    return lambda value: "".join(iterencode(value, 0))


_fast = _make_fast()


def dumps(value: Any, what: str = "value") -> str:
    try:
        text = _encoder.encode(value) if _fast is None else _fast(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"{what} cannot be stored as JSON: {exc}") from None
    if LONE_SURROGATE.search(text):
        raise SerializationError(f"{what} cannot be stored: a string holds a lone surrogate")
    return text


#: A NUL character, as JSON escapes it: PostgreSQL's jsonb cannot store one.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def dumps_document(value: Any, what: str = "value") -> str:
    """``dumps`` for a value stored as a JSON document (``meta``), which every backend
    must be able to store: no string in it may hold a NUL character."""
    text = dumps(value, what)
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise SerializationError(f"{what} cannot be stored: a string holds a NUL character")
    return text


def printable(text: str) -> str:
    """``text`` with what no database stores (NUL, lone surrogates) written as escapes:
    for text ferryq writes itself, such as an exception's message."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if LONE_SURROGATE.search(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def dumps_many(values: Iterable[Any], what: str = "value") -> list[str]:
    """``dumps`` of each value, a tuple becoming a list (as positional arguments)."""
    return [dumps(list(v) if isinstance(v, tuple) else v, what) for v in values]


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
