"""A/B: the working tree against a git ref, alternated in one run.

    python -m bench.ab REF [--rounds N] [--jobs N] [--enqueues N] [--pin] [--core N]
                           [--settings pg,normal,full] [--measures drain,enqueue]
                           [--log-level warning] [--worker-args "..."]
    make ab REF=main [AB_ARGS="--pin --rounds 7"]

REF is checked out into a temporary worktree (``git worktree add --detach``, removed
at the end). Round after round, on each setting (PostgreSQL durable, SQLite NORMAL,
SQLite FULL) and each measure, the two sides run one after the other, REF first in
odd rounds and the working tree first in even ones. The measures:

- drain: one ``ferryq worker`` process (500 slots) drains a queue filled beforehand
  with ``--jobs`` no-op jobs; the rate is ``(n - 1) / (last start - first start)``
  from the tasks' own start times, as bench/ferryq_runs.py measures. Beside it, the
  worker's CPU seconds per job: its rusage at exit less its CPU when the first job
  started (start-up left out), less disturbed than the wall clock on a shared
  machine, and the part of it spent in the kernel (system calls, I/O); on the
  throwaway PostgreSQL, the server's CPU per job too (its processes', from /proc),
  where a drain whose worker is no busier can still be slower.
- enqueue: ``--enqueues`` calls of ``task.enqueue()``, one job each, from one sync
  process, as web apps enqueue; beside it, that process's CPU per call.

Each side runs its own code: its processes start in that side's tree with PYTHONPATH
at it (PYTHONPATH wins over the editable install, and each process checks that it
did), and use the public API alone (bench/ab_side.py), so that old refs work too.
Every measurement gets a fresh database, left empty for the side's own code to
migrate (schemas differ between refs). PostgreSQL is the benchmarks' durable
throwaway cluster (bench/pg_cluster.py), or FERRYQ_BENCH_PG_URL.

The workers log as ``ferryq worker`` does by default (INFO, a line per attempt);
``--log-level`` sets FERRYQ_LOG_LEVEL for both sides (a ref whose command line does not
read it logs at its own default).

``--pin`` puts the measured process (the worker, or the enqueuing process) and the
database (the PostgreSQL postmaster and its processes, ``taskset -a -cp``; backends
started later inherit it) on one core: a slow small machine, simulated on a fast one.

It prints each round's figures, then per measure the medians of each side and the
ratio working/REF: above 1 is better for a rate, below 1 for CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import pathlib
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from bench import ab_side
from bench import ferryq_runs as runs
from bench.lanes import Databases, sqlite_databases
from bench.pg_cluster import cluster
from tests.pg import LocalCluster, PgCluster, fresh_database

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = {"pg": "PostgreSQL durable", "normal": "SQLite NORMAL", "full": "SQLite FULL"}
MEASURES = ("drain", "enqueue")
#: How each measure's figures read, with their unit and the scale shown: the rate, the
#: CPU (user and system) and the part of it in the kernel (system calls, I/O), and the
#: database server's CPU (PostgreSQL's processes: not there for SQLite).
LABELS = {
    "drain": (("drain", "jobs/s", 1.0), ("worker CPU per job", "µs", 1e6),
              ("  of which in the kernel", "µs", 1e6), ("PostgreSQL's CPU per job", "µs", 1e6)),
    "enqueue": (("single enqueue", "calls/s", 1.0), ("CPU per enqueue", "µs", 1e6),
                ("  of which in the kernel", "µs", 1e6), ("", "", 1.0)),
}  # fmt: skip
#: A measurement: the rate, then CPU seconds per job (or call), of which in the kernel,
#: and the database server's per job (NaN when not measured).
Figure = tuple[float, float, float, float]
#: The CPU seconds a database server has used so far, when it can be read.
ServerCpu = Callable[[], float] | None
STOP_WITHIN = 30.0


@dataclass(frozen=True)
class Side:
    """A tree of ferryq's code to measure: REF's worktree or the working tree."""

    name: str
    tree: pathlib.Path


@dataclass(frozen=True)
class Run:
    """What every measurement of a run shares."""

    workdir: pathlib.Path  # temporary files; ab_side.py is copied here
    jobs: int
    enqueues: int
    worker_args: list[str]
    log_level: str | None  # FERRYQ_LOG_LEVEL of the workers, if given
    core: int | None  # --pin: the core of the measured process and the database

    def pinned(self) -> Callable[[], None] | None:
        """Run in a child before it starts: puts it on the core, with --pin."""
        core = self.core
        if core is None:
            return None
        return lambda: os.sched_setaffinity(0, {core})

    def env(self, side: Side, url: str) -> dict[str, str]:
        found = {**os.environ, "FERRYQ_URL": url, ab_side.TREE_ENV: str(side.tree)}
        found["PYTHONPATH"] = os.pathsep.join((str(side.tree), str(self.workdir)))
        return found


# -- the measures --------------------------------------------------------------


def drain(run: Run, side: Side, url: str, server: ServerCpu) -> Figure:
    """Jobs/s, and the worker's CPU seconds per job (and the server's), of one worker
    draining ``run.jobs``."""
    _side_command(run, side, url, "fill", run.jobs, pinned=False)
    ticks = runs.ticks_file(run.workdir)
    log = ticks.with_name("worker.log")
    env = {**run.env(side, url), ab_side.TICKS_ENV: str(ticks)}
    if run.log_level is not None:
        env["FERRYQ_LOG_LEVEL"] = run.log_level
    command = [sys.executable, "-m", "ferryq", "worker", "ab_side:app", "--concurrency",
               str(runs.CONCURRENCY), "--queues", "default", *run.worker_args]  # fmt: skip
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(command, cwd=side.tree, env=env, stdout=subprocess.DEVNULL,
                                stderr=stderr, preexec_fn=run.pinned())  # fmt: skip
    try:
        runs.wait_ticks(ticks, 1, proc)
        user_at_first, system_at_first = runs.cpu_seconds(proc.pid)
        server_at_first = server() if server is not None else math.nan
        runs.wait_ticks(ticks, run.jobs, proc)
        served = (server() if server is not None else math.nan) - server_at_first
    except BaseException:
        _stop(proc)
        sys.stderr.write(log.read_text(errors="replace")[-3000:])
        raise
    user, system = _stop(proc)
    user, system = user - user_at_first, system - system_at_first
    stamps = runs.read_ticks(ticks)
    shutil.rmtree(ticks.parent, ignore_errors=True)
    rate = (run.jobs - 1) / (max(stamps) - min(stamps))
    return rate, (user + system) / run.jobs, system / run.jobs, served / run.jobs


def enqueue(run: Run, side: Side, url: str, server: ServerCpu) -> Figure:
    """Calls/s, and CPU seconds per call, of ``run.enqueues`` single enqueues."""
    said = _side_command(run, side, url, "enqueue", run.enqueues, pinned=True)
    rate, cpu, system = said.split()
    return float(rate), float(cpu), float(system), math.nan


def _side_command(run: Run, side: Side, url: str, command: str, count: int, *, pinned: bool) -> str:
    """Run ab_side.py's ``command`` with ``side``'s code; what it printed."""
    done = subprocess.run(
        [sys.executable, str(run.workdir / "ab_side.py"), command, str(count)],
        cwd=side.tree, env=run.env(side, url), capture_output=True, text=True,
        preexec_fn=run.pinned() if pinned else None, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{side.name}: ab_side {command} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def _stop(proc: subprocess.Popen[bytes]) -> tuple[float, float]:
    """SIGTERM, wait for the exit (SIGKILL after STOP_WITHIN s); the CPU seconds the
    process used, user and system, from its rusage (none if it had already ended
    and been waited for)."""
    if proc.returncode is not None:
        return 0.0, 0.0
    os.kill(proc.pid, signal.SIGTERM)
    kill_at = time.monotonic() + STOP_WITHIN
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime, usage.ru_stime
        if time.monotonic() > kill_at:
            os.kill(proc.pid, signal.SIGKILL)
            kill_at = float("inf")
        time.sleep(0.01)


MEASURE_FUNCTIONS = {"drain": drain, "enqueue": enqueue}


# -- the trees, the databases, the pin ----------------------------------------


@contextlib.contextmanager
def checkout(ref: str, workdir: pathlib.Path) -> Iterator[pathlib.Path]:
    """``ref`` in a temporary worktree of this repository, its modules compiled."""
    tree = workdir / "ref"
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), ref],
                   cwd=ROOT, check=True)  # fmt: skip
    try:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "ferryq")],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def describe(ref: str) -> str:
    """``ref``'s short commit, and the working tree's with a mark for uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    dirty = " with uncommitted changes" if git("status", "--porcelain", "--", "ferryq") else ""
    return (f"REF {ref} = {git('rev-parse', '--short', ref)}; working tree at "
            f"{git('rev-parse', '--short', 'HEAD')}{dirty}")  # fmt: skip


def postmaster(pg: PgCluster) -> int | None:
    """The process id of the throwaway cluster's postmaster; None for a server of yours."""
    if not isinstance(pg, LocalCluster):
        return None
    return int((pg.data / "postmaster.pid").read_text().split()[0])


def pin_server(pid: int | None, core: int) -> None:
    """The postmaster ``pid`` and every process it has started, on ``core``; the
    backends it starts later inherit that."""
    if pid is None:
        raise SystemExit("--pin needs the throwaway cluster: unset FERRYQ_BENCH_PG_URL")
    for process in (pid, *(child for child, _ in _children(pid))):
        subprocess.run(["taskset", "-a", "-cp", str(core), str(process)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip


def server_cpu(pid: int) -> float:
    """The CPU seconds the postmaster ``pid`` and its processes have used: its own, its
    children's that have ended (waited for), and those of the ones still running."""
    fields = _stat(pathlib.Path(f"/proc/{pid}"))
    own = sum(int(value) for value in fields[11:15]) if fields else 0
    return (own + sum(ticks for _, ticks in _children(pid))) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[tuple[int, int]]:
    """The processes ``pid`` started that still run, with their CPU ticks."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(entry)) and fields[1] == str(pid):
            found.append((int(entry.name), int(fields[11]) + int(fields[12])))
    return found


def _stat(process: pathlib.Path) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (state first); none if
    the process is gone."""
    try:
        return (process / "stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


@contextlib.contextmanager
def databases(
    settings: list[str], workdir: pathlib.Path, core: int | None
) -> Iterator[dict[str, tuple[Databases, ServerCpu]]]:
    """For each setting, a maker of fresh, empty databases, and the CPU its server has
    used so far, if it can be read."""
    found: dict[str, tuple[Databases, ServerCpu]] = {}
    with contextlib.ExitStack() as stack:
        for setting in settings:
            if setting == "pg":
                pg = stack.enter_context(cluster())
                pid = postmaster(pg)
                if core is not None:
                    pin_server(pid, core)
                server = None if pid is None else functools.partial(server_cpu, pid)
                found[setting] = functools.partial(fresh_database, pg, migrated=False), server
            else:
                query = "?synchronous=full" if setting == "full" else ""
                found[setting] = sqlite_databases(workdir, query), None
        yield found


# -- the run ------------------------------------------------------------------

Figures = dict[tuple[str, str], dict[str, list[Figure]]]


def measure(run: Run, sides: list[Side], settings: list[str], measures: list[str],
            rounds: int) -> Figures:  # fmt: skip
    """Every measure on every setting, the sides alternated, ``rounds`` times."""
    figures: Figures = defaultdict(lambda: defaultdict(list))
    with databases(settings, run.workdir, run.core) as fresh:
        for round_no in range(1, rounds + 1):
            order = sides if round_no % 2 else sides[::-1]
            said: list[str] = []
            for setting in settings:
                for name in measures:
                    new_database, server = fresh[setting]
                    for side in order:
                        with new_database() as url:
                            value = MEASURE_FUNCTIONS[name](run, side, url, server)
                        figures[setting, name][side.name].append(value)
                    ref, working = (figures[setting, name][s.name][-1][0] for s in sides)
                    said.append(f"{SETTINGS[setting]} {name} {working / ref:.2f}x "
                                f"({ref:,.0f} / {working:,.0f})")  # fmt: skip
            print(f"round {round_no}: " + " | ".join(said), flush=True)
    return figures


def report(figures: Figures, sides: list[Side], heading: str) -> None:
    ref, working = sides
    print(f"\n{heading}")
    print(f"{'':34}{ref.name:>16}{working.name:>16}{'working/REF':>13}")
    shown = None
    for (setting, name), by_side in figures.items():
        if setting != shown:
            print(SETTINGS[setting])
            shown = setting
        for index, (label, unit, scale) in enumerate(LABELS[name]):
            a, b = (statistics.median(v[index] for v in by_side[s.name]) * scale for s in sides)
            if math.isnan(a) or math.isnan(b):
                continue
            ratio = f"{b / a:>12.3f}x" if a else f"{'-':>13}"  # e.g. no kernel time at all
            print(f"  {label + ', ' + unit:32}{a:>16,.1f}{b:>16,.1f}{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="the git ref to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs a drain")
    parser.add_argument("--enqueues", type=int, default=2_000, help="calls an enqueue measure")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--measures", default=",".join(MEASURES))
    parser.add_argument("--log-level", help="the workers' FERRYQ_LOG_LEVEL (default: theirs)")
    parser.add_argument("--worker-args", default="", help="more options for ferryq worker")
    parser.add_argument("--pin", action="store_true", help="the measured process and the "
                        "database on one core")  # fmt: skip
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
    options = parser.parse_args()
    settings = [s for s in options.settings.split(",") if s]
    measures = [m for m in options.measures.split(",") if m]
    unknown = set(settings) - set(SETTINGS) | set(measures) - set(MEASURE_FUNCTIONS)
    if unknown:
        parser.error(f"unknown settings or measures: {', '.join(sorted(unknown))}")
    heading = describe(options.ref)
    print(heading, flush=True)
    with tempfile.TemporaryDirectory(prefix="ferryq-ab-") as tmp:
        workdir = pathlib.Path(tmp)
        shutil.copy(pathlib.Path(ab_side.__file__), workdir / "ab_side.py")
        with checkout(options.ref, workdir) as ref_tree:
            sides = [Side(f"REF {options.ref}", ref_tree), Side("working", ROOT)]
            core = options.core if options.pin else None
            run = Run(workdir, options.jobs, options.enqueues, shlex.split(options.worker_args),
                      options.log_level, core)  # fmt: skip
            figures = measure(run, sides, settings, measures, options.rounds)
    pinned = f"pinned to core {options.core}" if options.pin else "not pinned"
    if options.log_level:
        pinned += f", workers at FERRYQ_LOG_LEVEL={options.log_level}"
    report(figures, sides, f"medians of {options.rounds} rounds, {options.jobs:,} jobs a "
           f"drain, {options.enqueues:,} single enqueues a measure, {pinned}; "
           f"{heading}")  # fmt: skip


if __name__ == "__main__":
    main()
