"""The shop's tables and its engines, on the database ferryq's jobs live in
(``FERRYQ_URL``): SQLite's file or PostgreSQL's database, reached by SQLAlchemy."""

from __future__ import annotations

import os

from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

URL = os.environ.get("FERRYQ_URL", "sqlite:///shop.db")


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str]
    quantity: Mapped[int]
    receipt_sent: Mapped[bool] = mapped_column(default=False)


def _with_driver(sqlite: str, postgres: str) -> str:
    rest = URL[URL.index(":") :]
    return (sqlite if URL.startswith("sqlite") else postgres) + rest


def async_engine() -> AsyncEngine:
    """The service's engine: aiosqlite or asyncpg."""
    return create_async_engine(_with_driver("sqlite+aiosqlite", "postgresql+asyncpg"))


def sync_engine() -> Engine:
    """The worker's engine: sqlite3 or psycopg 3."""
    return create_engine(_with_driver("sqlite", "postgresql+psycopg"))
