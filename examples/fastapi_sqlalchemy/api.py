"""The shop's HTTP service: ``uvicorn examples.fastapi_sqlalchemy.api:api``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from examples.fastapi_sqlalchemy.db import Base, Order, async_engine
from examples.fastapi_sqlalchemy.jobs import queue, send_receipt


class NewOrder(BaseModel):
    item: str
    quantity: int


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    engine = async_engine()
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    await queue.store()  # ferryq's tables, before the first enqueue on a session
    api.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    yield
    await queue.aclose()
    await engine.dispose()


api = FastAPI(lifespan=lifespan)


@api.post("/orders", status_code=201)
async def place_order(new: NewOrder) -> dict[str, int]:
    sessions: async_sessionmaker[AsyncSession] = api.state.sessions
    async with sessions() as session, session.begin():
        order = Order(item=new.item, quantity=new.quantity)
        session.add(order)
        await session.flush()  # the order's id
        job = await send_receipt.using(session).enqueue_async(order.id)
        if new.quantity < 1:  # refused after the enqueue: the rollback takes the job too
            raise HTTPException(422, "quantity must be at least 1")
    return {"order": order.id, "job": job.id}


@api.get("/orders/{order_id}")
async def get_order(order_id: int) -> dict[str, object]:
    sessions: async_sessionmaker[AsyncSession] = api.state.sessions
    async with sessions() as session:
        order = await session.get(Order, order_id)
        if order is None:
            raise HTTPException(404, "no such order")
        return {"item": order.item, "quantity": order.quantity, "receipt_sent": order.receipt_sent}
