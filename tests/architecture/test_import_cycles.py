"""The module-level import cycle check of `make lint` (tests/architecture/import_cycles.py): the
tree matches its allow-list, an injected cycle fails it (in a tiny package and in a copy of the
product), and the allow-list is a ratchet (a cycle that grows, shrinks or goes fails it too)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "architecture" / "import_cycles.py"
sys.path.insert(0, str(SCRIPT.parent))
import import_cycles as ic  # noqa: E402


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def package(root: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under root with the given modules (path inside pkg -> source)."""
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name != "__init__.py" and not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
        path.write_text(text)
    return root


def test_the_tree_matches_the_allow_list():
    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BROKEN" not in r.stdout


def test_an_injected_cycle_fails_the_check(tmp_path):
    root = package(tmp_path, {"a.py": "from pkg import b\n", "b.py": "import pkg.c\n", "c.py": "x = 1\n"})
    assert run("--root", str(root), "pkg").returncode == 0  # a -> b -> c: no cycle
    (root / "pkg" / "c.py").write_text("from . import a\n")
    r = run("--root", str(root), "pkg")
    assert r.returncode == 1, r.stdout
    assert "a new cycle (3 modules): pkg.a -> pkg.b -> pkg.c -> pkg.a" in r.stdout


def test_typing_imports_count_and_function_imports_do_not(tmp_path):
    root = package(
        tmp_path,
        {
            "service.py": "from pkg.handlers import route\n",
            "handlers/route.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from ..service import Service\n"
                "def f():\n"
                "    from pkg import service\n"
            ),
        },
    )
    graph = ic.import_graph(root, ["pkg"])
    assert ic.cycles(graph) == [frozenset({"pkg.service", "pkg.handlers.route"})]
    assert ic.cycles(ic.import_graph(root, ["pkg"], typing=False)) == []
    (root / "pkg" / "handlers" / "route.py").write_text("def f():\n    from pkg import service\n")
    assert ic.cycles(ic.import_graph(root, ["pkg"])) == []


def test_the_allow_list_only_shrinks(tmp_path):
    root = package(
        tmp_path, {"a.py": "import pkg.b\n", "b.py": "import pkg.c\n", "c.py": "import pkg.a\nimport pkg.d\n"}
    )
    abc = frozenset({"pkg.a", "pkg.b", "pkg.c"})
    graph = ic.import_graph(root, ["pkg"])
    assert ic.check(graph, [abc]) == []
    # grown: d joins the cycle
    (root / "pkg" / "d.py").write_text("import pkg.a\n")
    (problem,) = ic.check(ic.import_graph(root, ["pkg"]), [abc])
    assert problem.startswith(
        "an allowed cycle grew (break the new import: the list only shrinks) (4 modules)"
    )
    # shrunk: a -> b -> a is what is left
    (root / "pkg" / "d.py").write_text("")
    (root / "pkg" / "b.py").write_text("import pkg.a\n")
    (problem,) = ic.check(ic.import_graph(root, ["pkg"]), [abc])
    assert problem == "an allowed cycle shrank: replace its entry in ALLOWED (3 modules) with: pkg.a, pkg.b"
    # gone
    (root / "pkg" / "b.py").write_text("")
    (problem,) = ic.check(ic.import_graph(root, ["pkg"]), [abc])
    assert problem == "an allowed cycle is gone: delete its entry in ALLOWED: pkg.a, pkg.b, pkg.c"


def test_a_cycle_injected_into_the_product_fails_the_check(tmp_path):
    for path in ic.module_files(REPO, ic.root_packages(REPO)).values():  # the Python files only
        dest = tmp_path / path.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    before = run("--root", str(tmp_path))
    assert "adapters.remoting" not in before.stdout, before.stdout
    route = tmp_path / "adapters" / "remoting" / "handlers" / "route.py"
    route.write_text(route.read_text() + "\nfrom adapters.remoting.service import RemotingService\n")
    r = run("--root", str(tmp_path))
    assert r.returncode == 1, r.stdout
    assert (
        "a new cycle (3 modules): adapters.remoting.handlers -> adapters.remoting.handlers.route" in r.stdout
    )


@pytest.mark.parametrize("source", ["from . import b\n", "from .b import x\n", "from pkg.b import x\n"])
def test_import_forms_resolve_to_modules(tmp_path, source):
    root = package(tmp_path, {"a.py": source, "b.py": "x = 1\n"})
    assert ic.import_graph(root, ["pkg"])["pkg.a"] == {"pkg.b"}
