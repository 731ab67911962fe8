"""The house's arrows, read from the source: no import cycle among the distribution's modules
(imports inside functions count; typing-only ones under `if TYPE_CHECKING:` do not); the roles
never import each other and the vocabulary imports no role; in the hub, web/ and worker/ never
import each other, and only RQ runs the job bodies (no module imports rsnotify.hub.worker.jobs,
every job path queued by rsnotify.hub.enqueue names one of its functions)."""
from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rsnotify"
ROLES = ("rsnotify.hub", "rsnotify.publisher", "rsnotify.subscriber")
JOBS = "rsnotify.hub.worker.jobs"


def module_files() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package), through the role symlinks (rsnotify/hub -> ../hub)."""
    found = {}
    paths = [Path(folder) / file for folder, _, files in os.walk(PACKAGE, followlinks=True)
             for file in files if file.endswith(".py")]
    for path in sorted(paths):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _typing_only(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            skipped.update(id(sub) for sub in ast.walk(node))
    return skipped


def imports_of(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """The distribution's modules that `name` imports, wherever the import statement sits."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skipped = _typing_only(tree)
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:   # `from pkg import module` imports the module itself
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {target for target in out if target in known and target != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {name: imports_of(name, path, is_package, known) for name, (path, is_package) in files.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (each is an import circle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def role_of(name: str) -> str | None:
    return next((role for role in ROLES if name == role or name.startswith(role + ".")), None)


def test_the_graph_sees_every_room(graph) -> None:
    assert {"rsnotify.xml", "rsnotify.hub.store", "rsnotify.hub.web.app", "rsnotify.hub.worker.fanout",
            "rsnotify.publisher.client", "rsnotify.subscriber.client"} <= set(graph)
    assert "rsnotify.hub.store" in graph["rsnotify.hub.web.endpoint"]


def test_no_import_circle_anywhere(graph) -> None:
    assert strongly_connected(graph) == []


def test_roles_never_import_each_other_and_the_vocabulary_imports_no_role(graph) -> None:
    crossings = [f"{source} -> {target}" for source, targets in graph.items() for target in targets
                 if role_of(target) is not None and role_of(target) != role_of(source)]
    assert crossings == []


def test_the_hubs_web_and_worker_never_import_each_other(graph) -> None:
    rooms = ("rsnotify.hub.web", "rsnotify.hub.worker")
    crossings = [f"{source} -> {target}" for source, targets in graph.items() for target in targets
                 for here, there in (rooms, rooms[::-1])
                 if source.startswith(here + ".") and (target == there or target.startswith(there + "."))]
    assert crossings == []


def test_only_rq_runs_the_job_bodies(graph) -> None:
    assert [source for source, targets in graph.items() if JOBS in targets] == []
    enqueue = importlib.import_module("rsnotify.hub.enqueue")
    paths = {value for value in vars(enqueue).values() if isinstance(value, str) and value.startswith(JOBS + ".")}
    assert len(paths) >= 7
    jobs = importlib.import_module(JOBS)
    assert [path for path in sorted(paths) if not callable(getattr(jobs, path.rpartition(".")[2], None))] == []
