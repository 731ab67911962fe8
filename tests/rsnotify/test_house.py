"""The house: the built wheel installs one top-level package, `rsnotify`, whose four commands run
from a fresh virtualenv; and no import cycle exists among the project's modules, counting
imports made inside functions and typing-only imports under `if TYPE_CHECKING:` (a circle that
exists only for the type checker is still a circle a reader walks)."""
from __future__ import annotations

import ast
import importlib.metadata
import os
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# what the wheel is built from: pyproject's package finder follows rsnotify/{hub,publisher,subscriber}
SOURCES = ("pyproject.toml", "README.md", "rsnotify", "hub", "publisher", "subscriber")
COMMANDS = ("hub", "worker", "publish", "subscribe")


# --- the wheel in a fresh virtualenv -----------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel --no-deps` of a copy of the sources (the build never writes into the checkout)."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("dist")
    # an isolated build installs pyproject's setuptools first; one at hand already saves that step
    isolation = ["--no-build-isolation"] if _build_requirements_at_hand() else []
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(out),
                           str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [built] = out.glob("rsnotify-*.whl")
    return built


def _build_requirements_at_hand() -> bool:
    """Does this environment already hold what pyproject's [build-system] requires?"""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for requirement in map(Requirement, requires):
        try:
            if not requirement.specifier.contains(importlib.metadata.version(requirement.name), prereleases=True):
                return False
        except importlib.metadata.PackageNotFoundError:
            return False
    return True


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel installed. Its dependencies are borrowed from the
    environment running the tests (a path line in a .pth file, whose own .pth files, such as the
    editable install's finder, Python then leaves alone), so the test needs no network and stays
    quick; what it checks is the wheel's own contents."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                           "-q", str(wheel)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (site_packages(python) / "zz_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return root


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip())


def clean_env() -> dict[str, str]:
    """No PYTHONPATH (the checkout must not stand in for the wheel), no RSNOTIFY_* settings."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("RSNOTIFY_")}


def test_the_wheel_holds_one_top_level_package_with_the_hubs_files(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"rsnotify"}
    for room in ("hub", "publisher", "subscriber"):
        assert f"rsnotify/{room}/__init__.py" in names, room
    assert any(name.startswith("rsnotify/hub/static/") for name in names)     # package data came along


def test_the_installed_wheel_is_the_only_top_level_package_and_every_command_runs(venv: Path) -> None:
    python = venv / "bin" / "python"
    installed = {p.name for p in site_packages(python).iterdir()
                 if p.name != "__pycache__" and not p.name.endswith((".dist-info", ".pth"))}
    assert installed == {"rsnotify"}
    where = subprocess.run([str(python), "-c", "import rsnotify, rsnotify.hub.cli as c; print(rsnotify.__file__, c.__file__)"],
                           capture_output=True, text=True, timeout=60, env=clean_env(), cwd=venv, check=False)
    assert where.returncode == 0, where.stderr
    assert all(Path(f).is_relative_to(venv) for f in where.stdout.split()), where.stdout
    for command in COMMANDS:
        done = subprocess.run([str(venv / "bin" / "rsnotify"), command, "--help"], capture_output=True, text=True,
                              timeout=60, env=clean_env(), cwd=venv, check=False)
        assert done.returncode == 0, f"rsnotify {command} --help: {done.stdout}{done.stderr}"
        assert f"Usage: rsnotify {command}" in done.stdout


# --- import cycles -------------------------------------------------------------------------------


def project_modules(package_dir: Path) -> dict[str, tuple[Path, bool]]:
    """Every module under `package_dir`, as the installed package names it (symlinked rooms
    followed): dotted name -> (file, is a package's __init__)."""
    modules: dict[str, tuple[Path, bool]] = {}
    for folder, dirs, files in os.walk(package_dir, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        relative = Path(folder).relative_to(package_dir.parent)
        for file in files:
            if file.endswith(".py"):
                parts = [*relative.parts] + ([] if file == "__init__.py" else [file[:-3]])
                modules[".".join(parts)] = (Path(folder) / file, file == "__init__.py")
    return modules


class _Imports(ast.NodeVisitor):
    """Every import statement of a module, at any depth, `if TYPE_CHECKING:` bodies included."""

    def __init__(self) -> None:
        self.found: list[ast.Import | ast.ImportFrom] = []

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append(node)


def imported_modules(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """The project modules `name` imports anywhere in its file (module level or in a function)."""
    imports = _Imports()
    imports.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in imports.found:
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = {f"{module}.{alias.name}" for alias in node.names} & known
            targets.update(submodules)
            if len(submodules) < len(node.names):    # some names are attributes of `module` itself
                targets.add(module)
    edges = set()
    for target in targets:
        while target and target not in known:          # `import a.b.c` of a non-module: its package
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    if is_package:      # a package importing its own submodules (re-exports) is not a loop of design
        edges = {t for t in edges if not t.startswith(name + ".")}
    return edges


def import_cycles(package_dir: Path) -> list[list[str]]:
    """Each set of modules that import each other in a circle (strongly connected, > 1 module)."""
    modules = project_modules(package_dir)
    known = set(modules)
    graph = {name: imported_modules(name, path, is_package, known) for name, (path, is_package) in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(start: str) -> None:      # Tarjan's algorithm, iterative: module graphs can be deep
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    circle = []
                    while True:
                        member = stack.pop()
                        circle.append(member)
                        if member == node:
                            break
                    if len(circle) > 1:
                        circles.append(sorted(circle))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(circles)


def test_no_import_cycle_among_the_projects_modules() -> None:
    circles = import_cycles(ROOT / "rsnotify")
    assert circles == [], "import circles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(circle) for circle in circles)


def test_the_cycle_check_sees_deferred_and_typing_only_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "room").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import A\n",
        "a.py": "from . import b\nA = 1\n",
        "b.py": "def later():\n    from .a import A\n    return A\n",                 # a -> b -> a, deferred
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\nelse:\n    D = None\n",
        "d.py": "from .c import D\n",                                            # c <-> d, c's only for typing
        "room/__init__.py": "",
        "room/e.py": "import pkg.room.f\n",
        "room/f.py": "from ..room import e\n",                                   # e <-> f, absolute and relative
    }
    for name, text in files.items():
        (package / name).write_text(text)
    assert import_cycles(package) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"], ["pkg.room.e", "pkg.room.f"]]
