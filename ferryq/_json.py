"""JSON encoding with ferryq's rules: strict (no NaN), compact, clear errors."""

from __future__ import annotations

import json
from typing import Any

from ferryq.errors import SerializationError

_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def dumps(value: Any, what: str = "value") -> str:
    try:
        return _encoder.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"{what} cannot be stored as JSON: {exc}") from None


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
