"""Turns taken in order: each waits for the one taken before it to end.

A worker keeps two things in the order it asked for them, whichever answer comes
back first: its claims on PostgreSQL (two at once would skip each other's rows) and
the starts of the jobs each cycle claimed. ``take`` is synchronous, so the order is
the order of the calls, fixed before anything is awaited.
"""

from __future__ import annotations

import asyncio


class Turns:
    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None

    def take(self) -> Turn:
        turn = Turn(self._last, asyncio.get_running_loop().create_future())
        self._last = turn.mine
        return turn


class Turn:
    __slots__ = ("mine", "previous")

    def __init__(self, previous: asyncio.Future[None] | None, mine: asyncio.Future[None]):
        self.previous = previous
        self.mine = mine

    async def wait(self) -> None:
        """Until the turn before has ended (a cancel of ours does not end it)."""
        if self.previous is not None:
            await asyncio.shield(self.previous)

    def end(self) -> None:
        """Let the next turn go; ending twice is harmless."""
        if not self.mine.done():
            self.mine.set_result(None)

    def pass_on(self) -> None:
        """End once the turn before has ended, without waiting here: a turn that has
        nothing to do still keeps its place."""
        if self.previous is None or self.previous.done():
            self.end()
        else:
            self.previous.add_done_callback(lambda _: self.end())
