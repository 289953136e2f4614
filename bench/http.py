"""The HTTP API: lmstfy publish -> consume -> ack round trips against the server's floor.

    python -m bench.http [--backend sqlite|postgres|both] [--clients N] [--seconds S]
                         [--rounds N]

One ``ferryq server`` process on loopback, a fresh database per round. ``--clients``
concurrent keep-alive connections (default 32), each from a small raw-socket HTTP/1.1
client in this process, so that the client's own cost stays low and alike for both
measurements:

- floor: ``GET /healthz`` as fast as the server answers: what one request costs here;
- round trips: each client publishes a job (``PUT /api/ns/q``), consumes one
  (``GET /api/ns/q?timeout=1``) and acks what it got (``DELETE .../job/ID``).

Printed: round trips/s, their requests/s (three each), the floor's requests/s, and the
ratio of the two request rates (target: at least 0.5, i.e. the database work of a
publish, a consume and an ack costs at most as much again as the HTTP floor). Every
figure is the median of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from urllib.parse import urlsplit

from bench.ferryq_runs import median
from bench.pg_cluster import cluster
from tests.pg import fresh_database

NAMESPACE = "bench"
QUEUE = "q"


class Connection:
    """One keep-alive HTTP/1.1 connection: send a request, read the whole response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, base: str) -> Connection:
        parts = urlsplit(base)
        assert parts.hostname is not None and parts.port is not None
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(reader, writer, parts.netloc)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        payload = await self.reader.readexactly(length) if length else b""
        return int(status_line.split()[1]), payload

    def close(self) -> None:
        self.writer.close()


@contextlib.contextmanager
def server(url: str) -> Iterator[tuple[str, str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ferryq", "server", "--url", url, "--port", "0",
         "--admin-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if "listening" not in line:
            raise SystemExit(f"the server did not start: {line!r}")
        fields = dict(part.split("=", 1) for part in line.split()[3:])
        yield fields["api"], fields["admin"]
    finally:
        proc.terminate()
        proc.wait(30)


def make_token(admin: str) -> str:
    request = urllib.request.Request(f"{admin}/token/{NAMESPACE}?description=bench", method="POST")
    with urllib.request.urlopen(request) as response:
        return str(json.load(response)["token"])


async def run_clients(
    api: str, clients: int, seconds: float, loop_body: Callable[[Connection], Awaitable[int]]
) -> float:
    """Operations per second of ``clients`` connections each running ``loop_body``."""
    connections = [await Connection.open(api) for _ in range(clients)]
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(conn: Connection) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            # Not ``done += await ...``: that reads ``done`` before awaiting, and every
            # other client's count in the meantime would be lost.
            finished = await loop_body(conn)
            done += finished

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in connections))
    elapsed = time.perf_counter() - started
    for conn in connections:
        conn.close()
    return done / elapsed


async def floor(api: str, clients: int, seconds: float) -> float:
    async def health(conn: Connection) -> int:
        status, _ = await conn.request("GET", "/healthz")
        assert status == 200
        return 1

    return await run_clients(api, clients, seconds, health)


async def round_trips(api: str, token: str, clients: int, seconds: float) -> float:
    base = f"/api/{NAMESPACE}/{QUEUE}"

    async def round_trip(conn: Connection) -> int:
        status, _ = await conn.request("PUT", f"{base}?token={token}", b"hello")
        assert status == 201, status
        status, body = await conn.request("GET", f"{base}?token={token}&timeout=1&ttr=30")
        if status != 200:
            return 0
        job_id = json.loads(body)["job_id"]
        status, _ = await conn.request("DELETE", f"{base}/job/{job_id}?token={token}")
        assert status == 204
        return 1

    return await run_clients(api, clients, seconds, round_trip)


def measure(url: str, options: argparse.Namespace) -> tuple[float, float]:
    with server(url) as (api, admin):
        token = make_token(admin)
        asyncio.run(floor(api, options.clients, 1.0))  # warm up
        floor_rate = asyncio.run(floor(api, options.clients, options.seconds))
        trips = asyncio.run(round_trips(api, token, options.clients, options.seconds))
    return floor_rate, trips


Database = Callable[[], contextlib.AbstractContextManager[str]]


def backends(backend: str, workdir: pathlib.Path) -> Iterator[tuple[str, Database]]:
    """(name, a fresh database per call) of each backend to measure."""
    if backend in ("sqlite", "both"):
        counter = iter(range(1_000_000))
        yield "SQLite", lambda: contextlib.nullcontext(f"sqlite:///{workdir}/{next(counter)}.db")
    if backend in ("postgres", "both"):
        with cluster() as pg:
            yield "PostgreSQL", lambda: fresh_database(pg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferryq-bench-http-") as tmp:
        for name, database in backends(options.backend, pathlib.Path(tmp)):
            floors, trips = [], []
            for _ in range(options.rounds):
                with database() as url:
                    f, t = measure(url, options)
                floors.append(f)
                trips.append(t)
                print(f"  {name} round: floor {f:,.0f} req/s, {t:,.0f} round trips/s", flush=True)
            f, t = median(floors), median(trips)
            print(f"{name}, {options.clients} clients, medians of {options.rounds}:")
            print(f"  floor (GET /healthz)        {f:>10,.0f} requests/s")
            print(f"  publish+consume+ack         {t:>10,.0f} round trips/s = "
                  f"{3 * t:,.0f} requests/s")  # fmt: skip
            print(f"  ratio of request rates      {3 * t / f:>10.2f}x the floor (target >= 0.5)")


if __name__ == "__main__":
    main()
