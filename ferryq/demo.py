"""``ferryq demo``: a short story of jobs on a fresh SQLite file, watched live.

Worker processes run :mod:`ferryq.demo_tasks`, and a ``ferryq server`` serves the
dashboard on the same database (its address and a fresh admin password are printed
first); this process enqueues the story, shows the counts by state and the busiest
lanes until every job is finished (or time runs out), then explains the job that died,
shows from the stored times that each post's comments ran in order and that a slow
tenant's backlog did not hold up another tenant, and prints commands to look further.
In a terminal the server and the workers then stay up for the dashboard until Ctrl-C;
Ctrl-C stops everything cleanly. Elsewhere (a script, CI) the demo ends by itself and
prints the command that serves the dashboard again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import secrets
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from ferryq import _render
from ferryq.app import App
from ferryq.insights import Stats
from ferryq.job import TERMINAL_STATES, Job, State
from ferryq.ops import LaneInfo

EMAILS = 200
IMAGES = 40
POSTS = 3
COMMENTS = 8  # per post
SLOW_EXPORTS = 12  # 0.4 s each, 2 at a time: about 2.4 s of backlog in one tenant lane
TENANT_LIMIT = 2
REFRESH_SECONDS = 0.25
LANES_SHOWN = 5
STOP_SECONDS = 15.0
DASHBOARD_PORT = 7777  # the server's default; any free port when it is taken
DASHBOARD_USER = "admin"
SERVER_START_SECONDS = 20.0

console = _render.console()


@dataclass(slots=True)
class Story:
    total: int
    upload_id: int
    report_id: int
    comment_ids: dict[int, list[int]]  # post -> its comments' jobs, in the order written
    slow_ids: list[int]  # the slow tenant's backlog
    quick_id: int  # the other tenant's one job, enqueued behind that backlog
    waiting_seen: str | None = None  # explain of the backlog's last job while it waited


class WorkersGone(Exception):
    """Every worker process exited while the story was still running."""


@dataclass(frozen=True, slots=True)
class Dashboard:
    url: str
    user: str
    password: str

    def sign_in(self) -> str:
        return f"{self.url}  (sign in as {self.user}, password {self.password})"


def run(seconds: float = 60.0, workers: int = 2) -> int:
    """Run the demo; the process exit code."""
    folder = Path(tempfile.mkdtemp(prefix="ferryq-demo-"))
    url = f"sqlite:///{folder}/demo.db"
    os.environ["FERRYQ_URL"] = url  # read by ferryq.demo_tasks, here and in the workers
    previous_term = signal.signal(signal.SIGTERM, _interrupt)
    previous_int = signal.getsignal(signal.SIGINT)
    procs: list[subprocess.Popen[bytes]] = []
    servers: list[subprocess.Popen[bytes]] = []
    app: App | None = None
    try:
        from ferryq import demo_tasks

        app = demo_tasks.app
        app.url = url
        console.print(f"ferryq demo: database {folder / 'demo.db'}, {workers} worker(s)")
        start_workers(url, workers, folder, procs)
        dashboard = start_server(url, folder, servers)
        if dashboard is None:
            console.print(f"[yellow]the dashboard did not start; see {folder}/server.log[/yellow]")
        else:
            console.print(Text(f"dashboard:   {dashboard.sign_in()}"))
        story = enqueue_story()
        started = time.monotonic()
        current, complete = watch(app, story, started + seconds, procs)
        summarize(app, story, current, complete, time.monotonic() - started, folder)
        if dashboard is not None and interactive():
            stay_up(dashboard, servers)
        elif dashboard is not None:
            say_how_to_serve(dashboard, url)
        return 0
    except WorkersGone:
        console.print(f"[red]the workers exited early; see {folder}/worker-*.log[/red]")
        return 1
    except KeyboardInterrupt:
        console.print("\ninterrupted: stopping the workers")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave orphans
        stop_workers(procs + servers)
        if app is not None:
            close(app)
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def close(app: App) -> None:
    """Close the app once calls cut short by Ctrl-C have finished in the background."""

    async def settle() -> None:
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        if pending:
            await asyncio.wait(pending, timeout=STOP_SECONDS)

    app.portal_call(settle())
    app.close()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def start_workers(url: str, count: int, folder: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """Start worker processes, each logging to its own file in ``folder``.

    They get a session of their own, so a Ctrl-C in the terminal reaches only the demo,
    which then stops them with a single SIGTERM (a second signal would cut them short).
    """
    command = [sys.executable, "-m", "ferryq", "--url", url, "worker", "ferryq.demo_tasks:app",
               "--concurrency", "8"]  # fmt: skip
    for number in range(1, count + 1):
        with open(folder / f"worker-{number}.log", "wb") as log:
            procs.append(subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            ))  # fmt: skip


def start_server(
    url: str, folder: Path, servers: list[subprocess.Popen[bytes]]
) -> Dashboard | None:
    """Start ``ferryq server`` with a fresh admin password; None if it did not come up.

    The credential reaches the server through its environment, not its command line,
    where other users of the machine could read it.
    """
    password = secrets.token_urlsafe(9)
    env = {**os.environ, "FERRYQ_ADMIN_CREDENTIAL": f"{DASHBOARD_USER}:{password}"}
    port = DASHBOARD_PORT if _port_free(DASHBOARD_PORT) else 0
    command = [sys.executable, "-m", "ferryq", "server", "--url", url, "--port", str(port),
               "--admin-port", "0"]  # fmt: skip
    with open(folder / "server.log", "wb") as log:
        server = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env,
            start_new_session=True,
        )  # fmt: skip
    servers.append(server)
    match = re.match(r"ferryq server listening api=(\S+) admin=", _first_line(server))
    return None if match is None else Dashboard(f"{match[1]}/", DASHBOARD_USER, password)


def _first_line(proc: subprocess.Popen[bytes]) -> str:
    """The first line the process writes, or "" if none comes in time."""
    assert proc.stdout is not None
    deadline = time.monotonic() + SERVER_START_SECONDS
    line = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n") and (left := deadline - time.monotonic()) > 0:
            if not selector.select(left):
                break
            chunk = os.read(proc.stdout.fileno(), 1)
            if not chunk:
                break
            line += chunk
    return line.decode(errors="replace").strip()


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def interactive() -> bool:
    """Whether someone at a terminal can look at the dashboard and press Ctrl-C."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def say_how_to_serve(dashboard: Dashboard, url: str) -> None:
    """Not in a terminal the demo ends, and its dashboard with it: say how to serve
    the demo's database again. The credential goes in the environment, not among the
    arguments that other users of the machine can read."""
    credential = shlex.quote(f"{dashboard.user}:{dashboard.password}")
    command = f"{ferryq_command()} server --url {shlex.quote(url)}"
    console.print(Text(
        "\nthe dashboard stopped with the demo; to serve it again (Ctrl-C stops it), run\n"
        f"  FERRYQ_ADMIN_CREDENTIAL={credential} {command}\n"
        f"then open http://127.0.0.1:7777/ and sign in as {dashboard.user}, "
        f"password {dashboard.password}"
    ))  # fmt: skip


def ferryq_command() -> str:
    """How the user's shell reaches this ferryq: ``ferryq`` if that is the one on PATH,
    else the script's path (``.venv/bin/ferryq`` after ``make demo``)."""
    script = Path(sys.executable).parent / "ferryq"
    if not script.exists():
        return f"{shlex.quote(sys.executable)} -m ferryq"
    on_path = shutil.which("ferryq")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "ferryq"
    return shown(script)


def shown(path: Path) -> str:
    """A path for a command to paste: relative to the working directory if under it."""
    with contextlib.suppress(ValueError):
        return shlex.quote(str(path.relative_to(Path.cwd())))
    return shlex.quote(str(path))


def stay_up(dashboard: Dashboard, servers: list[subprocess.Popen[bytes]]) -> None:
    """Keep the dashboard and the workers running until Ctrl-C (or the server exits)."""
    console.print(Text(f"\nthe dashboard stays up until Ctrl-C: {dashboard.sign_in()}"))
    try:
        while all(server.poll() is None for server in servers):
            time.sleep(0.5)
    except KeyboardInterrupt:
        console.print("\nstopping the server and the workers")


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def enqueue_story() -> Story:
    from ferryq import demo_tasks as t

    # First the slow tenant's backlog, then another tenant's one job behind it: with
    # lanes, that job does not wait for the backlog, only for a free worker slot.
    t.app.set_lane_limit("tenant:*", TENANT_LIMIT)
    slow = t.export_rows.options(lane="tenant:slowco").enqueue_many(
        [("slowco", part) for part in range(1, SLOW_EXPORTS + 1)]
    )
    quick = t.export_rows.options(lane="tenant:quickco").enqueue("quickco", 1)
    emails = t.send_email.enqueue_many(
        [{"to": f"user{i}@example.com", "subject": "Your weekly digest"} for i in range(EMAILS)]
    )
    images = t.resize_image.enqueue_many([(f"photos/{i:03}.jpg", 640) for i in range(IMAGES)])
    upload = t.flaky_upload.enqueue("backups/2024-06.tar.gz")
    report = t.report.options(delay=3).enqueue("weekly")
    comments = {
        post: [h.id for h in t.publish_comment.options(lane=f"post:{post}").enqueue_many(
            [(post, n) for n in range(1, COMMENTS + 1)]
        )]
        for post in range(1, POSTS + 1)
    }  # fmt: skip
    total = len(slow) + 1 + len(emails) + len(images) + 2 + POSTS * COMMENTS
    return Story(total, upload.id, report.id, comments, [h.id for h in slow], quick.id)


def finished(current: Stats) -> int:
    return sum(
        n for by_state in current.counts.values()
        for state, n in by_state.items() if state in TERMINAL_STATES
    )  # fmt: skip


def watch(
    app: App, story: Story, deadline: float, procs: list[subprocess.Popen[bytes]]
) -> tuple[Stats, bool]:
    """Refresh the counts until every job is finished or ``deadline`` (monotonic) passes."""
    started = time.monotonic()
    with Live(console=console, auto_refresh=False) as live:
        while True:
            current = app.stats()
            done = finished(current)
            busiest = app.lanes(limit=LANES_SHOWN)
            note_waiting(app, story)
            live.update(
                view(current, busiest, done, story, time.monotonic() - started), refresh=True
            )
            if done >= story.total:
                return current, True
            if time.monotonic() >= deadline:
                return current, False
            if all(proc.poll() is not None for proc in procs):
                raise WorkersGone
            time.sleep(REFRESH_SECONDS)


def note_waiting(app: App, story: Story) -> None:
    """Keep what explain said of the backlog's last job while it was waiting."""
    if story.waiting_seen is None:
        explained = app.explain(story.slow_ids[-1])
        if explained.state == State.WAITING:
            story.waiting_seen = explained.message


def view(current: Stats, busiest: list[LaneInfo], done: int, story: Story, elapsed: float) -> Group:
    header = Text.assemble(
        ("ferryq demo", "bold"),
        f"  {elapsed:5.1f} s  {done}/{story.total} jobs finished  ",
        (f"{len(current.workers)} live worker(s)", "green" if current.workers else "yellow"),
    )
    parts: list[RenderableType] = [header, _render.counts_table(current.counts)]
    if busiest:
        parts += [Text("busiest lanes", style="bold"), _render.lanes_table(busiest)]
    return Group(*parts)


def summarize(
    app: App, story: Story, current: Stats, complete: bool, elapsed: float, folder: Path
) -> None:
    if complete:
        console.print(f"\nall {story.total} jobs finished in {elapsed:.1f} s")
    else:
        left = story.total - finished(current)
        console.print(f"\nstopped after {elapsed:.1f} s with {left} job(s) not finished")
    console.print(Text("the flaky upload:  ") + Text(app.explain(story.upload_id).message))
    console.print(Text("the delayed report: ") + Text(app.explain(story.report_id).message))
    summarize_lanes(app, story)
    ferryq = ferryq_command()
    base = f"{ferryq} --url {shlex.quote(app.url)}"
    console.print(f"\ndatabase:    {folder / 'demo.db'}")
    console.print(f"worker logs: {folder}/worker-*.log")
    console.print("\ntry next:")
    for command in ("jobs ls", f"jobs show {story.upload_id}",
                    f"jobs explain {story.upload_id}", "dead ls", "stats", "lanes ls",
                    "lanes limit", f"jobs explain {story.slow_ids[-1]}"):  # fmt: skip
        console.print(Text(f"  {base} {command}"))
    activate = Path(sys.executable).parent / "activate"
    if ferryq != "ferryq" and activate.exists():
        console.print(Text(f"  (or first . {shown(activate)}, then plain ferryq)"))


def summarize_lanes(app: App, story: Story) -> None:
    """Show from the stored times that lanes kept order and one tenant did not stall another."""
    in_order = all(
        started_in_order([app.get_job(i) for i in ids]) for ids in story.comment_ids.values()
    )
    verdict = "one at a time, in the order written" if in_order else "OUT OF ORDER"
    console.print(f"the comments:       {POSTS} posts x {COMMENTS} in lanes post:N, {verdict}")
    quick, last = app.get_job(story.quick_id), app.get_job(story.slow_ids[-1])
    console.print(
        f"the tenants:        slowco's {SLOW_EXPORTS} slow exports ran {TENANT_LIMIT} at a time "
        f"(rule tenant:*); the last started {wait_text(last)}, while quickco's one export, "
        f"enqueued behind them, started {wait_text(quick)}"
    )
    if story.waiting_seen:
        console.print(Text("  while it waited:  ") + Text(story.waiting_seen))


def wait_text(job: Job) -> str:
    if job.started_at is None:
        return f"never ({job.state})"
    return f"{_render.seconds(job.started_at - job.created_at)} after it was enqueued"


def started_in_order(jobs: list[Job]) -> bool:
    """Each job started only after the one before it in the lane had finished."""
    return all(
        a.finished_at is not None and b.started_at is not None and b.started_at >= a.finished_at
        for a, b in itertools.pairwise(jobs)
    )
