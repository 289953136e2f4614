"""What importing ferryq costs: the command line loads the HTTP server and the dashboard
only for the commands that need them, and ferryq's modules import one another without
cycles (a cycle makes the import order matter and half-initialised modules possible),
not even in their types (a circle there hides what one module uses of another: the
worker, tasks and handles are typed against Protocols of the App, not the App)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ferryq

PACKAGE = Path(ferryq.__file__).parent
#: Modules only ``ferryq server``, ``ferryq token`` and ``ferryq demo`` need.
SERVER_SIDE = ("ferryq.server", "ferryq.dashboard", "starlette", "uvicorn", "jinja2", "fastapi")


def loaded_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; the server-side modules it left loaded."""
    probe = (
        "import sys\n"
        f"{code}\n"
        "import json\n"
        f"side = {SERVER_SIDE!r}\n"
        "loaded = [m for m in sys.modules if any(m == s or m.startswith(s + '.') for s in side)]\n"
        "print('\\n' + json.dumps(sorted(loaded)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout.splitlines()[-1])
    return found


def run_cli(*args: str) -> str:
    """Code that runs ``ferryq ARGS`` through ``ferryq.cli.main`` and carries on."""
    return (
        "import ferryq.cli\n"
        f"sys.argv = ['ferryq', *{list(args)!r}]\n"
        "try:\n"
        "    ferryq.cli.main()\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
    )


def test_importing_the_cli_loads_neither_the_server_nor_the_dashboard() -> None:
    assert loaded_after("import ferryq.cli") == []


def test_the_version_loads_neither_the_server_nor_the_dashboard() -> None:
    assert loaded_after(run_cli("--version")) == []


def test_a_command_of_the_jobs_loads_neither_the_server_nor_the_dashboard(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    code = run_cli("--url", url, "migrate") + run_cli("--url", url, "jobs", "ls")
    assert loaded_after(code) == []


def test_the_command_list_loads_no_web_framework() -> None:
    loaded = loaded_after(run_cli("--help"))
    assert [m for m in loaded if not m.startswith("ferryq.server")] == []
    assert "ferryq.server.app" not in loaded


def test_the_server_commands_are_found_when_asked_for() -> None:
    """The probe above would pass if the server's commands were lost: they are not."""
    code = run_cli("token", "--help") + "assert 'ferryq.cli.tokens' in sys.modules\n"
    assert "ferryq.server" in loaded_after(code)
    code = run_cli("server", "--help") + "assert 'ferryq.cli.server' in sys.modules\n"
    assert "ferryq.server.app" not in loaded_after(code)


# -- import cycles ------------------------------------------------------------


def module_name(file: Path, root: Path) -> str:
    """The name of the module in ``file`` under the import root ``root``."""
    parts = file.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(
    tree: ast.Module, types: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: not those inside functions
    (they run when called) nor those under ``if TYPE_CHECKING:`` (they never run),
    unless ``types``: then those too, which its types depend on."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if not types and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        pending.extend(ast.iter_child_nodes(node))


def imported_modules(name: str, file: Path, known: set[str], types: bool = False) -> set[str]:
    """The ferryq modules ``file`` (module ``name``) imports when it is imported (with
    ``types``, for its types as well). ``from P import X`` imports the module P.X when
    X is one, P otherwise."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in top_level_imports(ast.parse(file.read_text(), str(file)), types):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:
            found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {module for module in found if module in known} - {name}


def import_graph(package: Path, types: bool = False) -> dict[str, set[str]]:
    """Each module of ``package`` and the modules of it that it imports when imported
    (with ``types``, for its types as well)."""
    files = {module_name(file, package.parent): file for file in sorted(package.rglob("*.py"))}
    known = set(files)
    return {name: imported_modules(name, file, known, types) for name, file in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph.get(node, ())):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done and (cycle := visit(target)):
                return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done and (cycle := visit(start)):
            return cycle
    return None


def test_ferryq_modules_import_one_another_without_cycles() -> None:
    graph = import_graph(PACKAGE)
    assert len(graph) > 40 and "ferryq.cli" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_ferryq_modules_import_one_another_without_cycles_even_for_their_types() -> None:
    graph = import_graph(PACKAGE, types=True)
    assert "ferryq.worker.app_protocol" in graph["ferryq.worker.runner"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in the types: " + " -> ".join(cycle or [])


def write(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


ONLY_WHEN_TYPE_CHECKING = (
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import b\n"
)


@pytest.mark.parametrize(
    ("files", "expected", "in_types"),
    [
        (
            {"p/a.py": "from p import b\n", "p/b.py": "import p.a\n"},
            ["p.a", "p.b", "p.a"],
            ["p.a", "p.b", "p.a"],
        ),
        (
            {"p/a.py": "from .sub import c\n", "p/sub/c.py": "from ..a import X\n"},
            ["p.a", "p.sub.c", "p.a"],
            ["p.a", "p.sub.c", "p.a"],
        ),
        (
            {
                "p/a.py": ONLY_WHEN_TYPE_CHECKING,
                "p/b.py": "def f():\n    from p import a\nclass C:\n    from p import c\n",
                "p/c.py": "try:\n    import p.b\nexcept ImportError:\n    pass\n",
            },
            ["p.b", "p.c", "p.b"],
            ["p.b", "p.c", "p.b"],
        ),
        (
            {
                "p/a.py": ONLY_WHEN_TYPE_CHECKING,
                "p/b.py": "def f():\n    from p import a\n",
            },
            None,
            None,
        ),
        (
            {"p/a.py": ONLY_WHEN_TYPE_CHECKING, "p/b.py": "from p import a\n"},
            None,
            ["p.a", "p.b", "p.a"],
        ),
    ],
)
def test_the_cycle_check_sees_what_runs_at_import_and_what_the_types_need(
    tmp_path: Path, files: dict[str, str], expected: list[str] | None, in_types: list[str] | None
) -> None:
    write(tmp_path, {"p/__init__.py": "", **files})
    assert find_cycle(import_graph(tmp_path / "p")) == expected
    assert find_cycle(import_graph(tmp_path / "p", types=True)) == in_types
