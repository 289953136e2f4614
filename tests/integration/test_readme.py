"""The README's tour works as written: its jobs.py, a worker, then its Python lines
typed one by one; and the HTTP API's examples enqueue the tasks that tour defines."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.processes import ROOT, WORKER_STARTED, Processes, python

#: Feeds stdin to Python's interactive console line by line, as someone typing it would.
REPL = "import code, sys\nconsole = code.InteractiveConsole()\n" \
       "for line in sys.stdin.read().splitlines():\n    console.push(line)\n"  # fmt: skip


def tour() -> tuple[str, str]:
    """The tour's two Python blocks: jobs.py, and the lines that use it."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A 30-second tour", 1)[1].split("\n## ", 1)[0]
    jobs_py, session = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    return jobs_py, session


def test_the_tour_runs_line_by_line_beside_a_worker(processes: Processes, tmp_path: Path) -> None:
    jobs_py, session = tour()
    (tmp_path / "jobs.py").write_text(jobs_py)
    env = {"FERRYQ_URL": f"sqlite:///{tmp_path}/tour.db"}
    worker = processes.start(python("ferryq", "worker", "jobs:app"), cwd=tmp_path, env=env)
    # Running before the first line is typed: the tour waits 10 s for a result.
    worker.wait_for(WORKER_STARTED)
    typed = processes.start([sys.executable, "-c", REPL], cwd=tmp_path, env=env, stdin=True)
    typed.stdin.write(session.encode())
    typed.stdin.close()
    assert typed.wait() == 0 and typed.stderr() == "", typed.describe()
    assert worker.stop() == 0, worker.describe()
    assert "{'sent': 'a@example.com'}" in typed.stdout()  # h.result(timeout=10)
    assert "job 2: scheduled until" in typed.stdout()  # h.explain()


def test_the_http_api_enqueues_the_tasks_of_the_tour() -> None:
    jobs_py, _ = tour()
    defined = {f"jobs.{name}" for name in re.findall(r"^(?:async )?def (\w+)", jobs_py, re.M)}
    http_api = (ROOT / "docs" / "http-api.md").read_text()
    named = set(re.findall(r'"task": "([^"]+)"', http_api))
    assert named and named <= defined, named - defined
