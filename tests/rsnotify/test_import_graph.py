"""The hub's and the roles' arrows, on the import graph test_house.py reads from the source
(imports inside functions and typing-only ones under `if TYPE_CHECKING:` count; that file
checks there is no circle): the roles never import each other and the vocabulary imports no
role; in the hub, web/ and worker/ never import each other, and only RQ runs the job bodies (no
module imports rsnotify.hub.worker.jobs; every job path rsnotify.hub.enqueue queues names one of
its functions)."""
from __future__ import annotations

import importlib

import pytest

from tests.rsnotify.test_house import ROOT, imported_modules, project_modules

ROLES = ("rsnotify.hub", "rsnotify.publisher", "rsnotify.subscriber")
JOBS = "rsnotify.hub.worker.jobs"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules(ROOT / "rsnotify")
    known = set(modules)
    return {name: imported_modules(name, path, is_package, known) for name, (path, is_package) in modules.items()}


def role_of(name: str) -> str | None:
    return next((role for role in ROLES if name == role or name.startswith(role + ".")), None)


def test_the_graph_sees_every_room(graph) -> None:
    assert {"rsnotify.xml", "rsnotify.hub.store", "rsnotify.hub.web.app", "rsnotify.hub.worker.fanout",
            "rsnotify.publisher.client", "rsnotify.subscriber.client"} <= set(graph)
    assert "rsnotify.hub.store" in graph["rsnotify.hub.web.endpoint"]


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
