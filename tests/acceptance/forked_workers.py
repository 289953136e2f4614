"""Many worker processes of lanes_app.py, forked from one that has imported them.

python -m tests.acceptance.forked_workers N LOG_DIR [--concurrency C]

A Python process that imports ferryq, asyncpg and the app takes about 0.6 s of a core
before it opens the database; forty of them starting at once are half a minute of a
2-core machine. This one imports once, then forks N children, each an ordinary worker
(``ferryq.Worker`` with its default periods, logs as ``ferryq worker`` writes them)
with its own event loop and its own connections, its stderr in ``LOG_DIR/worker-K.stderr``.
Nothing is opened before the fork: the App opens its store on first use, in the child.

It writes ``worker K pid P`` for each child once all are forked, passes SIGTERM on to
every child, and exits once they have all exited: 0 if every one exited 0. A child gets
SIGTERM when this process dies, however it dies (the parent-death signal).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import sys
import traceback
from pathlib import Path

import ferryq
from ferryq import logs
from tests.acceptance import lanes_app

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int)
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("--concurrency", type=int, default=3)
    options = parser.parse_args()
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    children: dict[int, int] = {}
    for number in range(options.count):
        pid = os.fork()
        if pid == 0:
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            _child(options.log_dir / f"worker-{number}.stderr", options.concurrency)
        children[pid] = number
    for pid, number in children.items():
        print(f"worker {number} pid {pid}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: _pass_on(children))
    failed = 0
    while children:
        pid, status = os.wait()
        code = os.waitstatus_to_exitcode(status)
        print(f"worker {children.pop(pid)} pid {pid} exited {code}", flush=True)
        failed = failed or code != 0
    sys.exit(1 if failed else 0)


def _pass_on(children: dict[int, int]) -> None:
    for pid in list(children):
        os.kill(pid, signal.SIGTERM)


def _child(stderr: Path, concurrency: int) -> None:
    """Run a worker with stderr in its own file; never return to the parent's code."""
    fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    code = 0
    try:
        logs.configure("info", "text")
        asyncio.run(ferryq.Worker(lanes_app.app, concurrency=concurrency).run())
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        logs.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
