"""The native JSON API under ``/v1`` (SPEC §16)."""

from __future__ import annotations

from fastapi import APIRouter

from ferryq.server.engine import Engine


def native_router(engine: Engine) -> APIRouter:
    return APIRouter(prefix="/v1")
