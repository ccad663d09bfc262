"""Module-level import cycles inside the product packages, with a shrinking allow-list.

An import is module-level when it is in the module's body, not inside a function: a top-level
`import` or `from ... import ...`, also under a top-level `if`/`try`/`with` and in a class body.
Imports under `if TYPE_CHECKING:` count too (a module that names another's class in its annotations
depends on it as much as one that calls it: the cycles issue 52 lists are of that kind); with
`--runtime-only` they do not, which leaves the imports that run at import time. Imports inside
functions never count (they run at call time). `from a import b` is an import of the module `a.b`
when that module exists, else of `a`; `import a.b` is an import of `a.b`; relative imports are
resolved against the importer's package. Only imports between modules of ROOT's packages count.
A cycle is a strongly connected component of that graph (two or more modules that reach each
other), reported with one shortest loop through it.

The check is a ratchet: it fails on any cycle that is not in ALLOWED (a new one, or an allowed one
grown by a module), and on any entry of ALLOWED that no longer matches a cycle exactly (broken or
shrunk: the list is updated to what remains, so it only shrinks).

    .venv/bin/python tests/architecture/import_cycles.py [--root DIR] [--no-allow-list] [--runtime-only]
        [PACKAGE ...]

Exit status 0 when the graph matches the allow-list, 1 otherwise (the differences are printed).
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The packages checked: import-linter's root_packages in ROOT's pyproject.toml, else these.
PACKAGES = ("gateway", "adapters", "cluster", "messaging_processor", "store", "namesrv", "remoting",
            "runtime", "analytics", "conformance")  # fmt: skip


def _cycle(package: str, modules: str) -> frozenset[str]:
    return frozenset(f"{package}.{m}" for m in modules.split())


# The cycles allowed, each the full set of modules of one strongly connected component, written
# with _cycle("package", "module module ..."). None is left since issue 52 broke the AMQP and MQTT
# ones; the list only shrinks: a new cycle is broken, never added here.
ALLOWED: tuple[frozenset[str], ...] = ()


def root_packages(root: Path) -> list[str]:
    """import-linter's root_packages of root/pyproject.toml ([tool.importlinter]), else PACKAGES."""
    try:
        config = tomllib.loads((root / "pyproject.toml").read_text())
        return list(config["tool"]["importlinter"]["root_packages"])
    except (OSError, KeyError):
        return list(PACKAGES)


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of the packages under root: dotted name -> file (a package is its __init__)."""
    found: dict[str, Path] = {}
    for pkg in packages:
        base = root / pkg
        if not (base / "__init__.py").exists():
            continue
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts
            if any(p in ("node_modules", "__pycache__") or not p.isidentifier() for p in parts[:-1]):
                continue
            if not all((root.joinpath(*parts[:i]) / "__init__.py").exists() for i in range(1, len(parts))):
                continue  # a directory that is not a package (data, scripts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(body: list[ast.stmt], typing: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of the module body (not in functions); `if TYPE_CHECKING:` ones if typing."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if typing or not _is_type_checking(node.test):
                yield from _module_level_imports(node.body, typing)
            yield from _module_level_imports(node.orelse, typing)
        elif isinstance(node, ast.Try | ast.TryStar):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _module_level_imports(block, typing)
        elif isinstance(node, ast.With | ast.AsyncWith | ast.ClassDef):
            yield from _module_level_imports(node.body, typing)
        elif isinstance(node, ast.Match):
            for case in node.cases:
                yield from _module_level_imports(case.body, typing)


def imports_of(name: str, path: Path, modules: dict[str, Path], typing: bool = True) -> set[str]:
    """The project modules `name` imports at module level (with its typing-only imports if typing)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _module_level_imports(tree.body, typing):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            # `import a.b.c` where c is an attribute-free module path: the deepest existing module
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph(root: Path, packages: Iterable[str], typing: bool = True) -> dict[str, set[str]]:
    modules = module_files(root, packages)
    return {name: imports_of(name, path, modules, typing) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return sorted(found, key=lambda c: sorted(c))


def shortest_loop(graph: dict[str, set[str]], component: frozenset[str]) -> list[str]:
    """One shortest loop inside a component, from its first module (by name) back to it."""
    start = min(component)
    parents: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & component):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return [*reversed(path), start]
            if child not in parents:
                parents[child] = node
                queue.append(child)
    return [start]


def check(graph: dict[str, set[str]], allowed: Iterable[frozenset[str]]) -> list[str]:
    """The differences between the graph's cycles and the allow-list (empty: it matches)."""
    found = set(cycles(graph))
    tops = {m.partition(".")[0] for m in graph}
    allowed = {entry for entry in allowed if any(m.partition(".")[0] in tops for m in entry)}
    problems = []
    grown: set[frozenset[str]] = set()
    for component in sorted(found - allowed, key=sorted):
        if any(component < a for a in allowed):
            continue  # what is left of an allowed cycle: reported below as its entry shrinking
        loop = " -> ".join(shortest_loop(graph, component))
        inside = {a for a in allowed if a < component}
        grown |= inside
        why = (
            "an allowed cycle grew (break the new import: the list only shrinks)" if inside else "a new cycle"
        )
        problems.append(
            f"{why} ({len(component)} modules): {loop}\n    modules: {', '.join(sorted(component))}"
        )
    for entry in sorted(allowed - found - grown, key=sorted):
        left = [c for c in found if c < entry]
        if left:
            now = "; ".join(", ".join(sorted(c)) for c in left)
            problems.append(
                f"an allowed cycle shrank: replace its entry in ALLOWED ({len(entry)} modules) with: {now}"
            )
        else:
            problems.append(
                f"an allowed cycle is gone: delete its entry in ALLOWED: {', '.join(sorted(entry))}"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    """Check ROOT's packages against ALLOWED (or against none); print the differences; exit 1 on any."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("packages", nargs="*", help="default: root_packages of ROOT/pyproject.toml")
    ap.add_argument("--root", type=Path, default=REPO)
    ap.add_argument("--no-allow-list", action="store_true", help="report every cycle as a failure")
    ap.add_argument(
        "--runtime-only",
        action="store_true",
        help="leave out `if TYPE_CHECKING:` imports (and the allow-list, which is for all imports)",
    )
    args = ap.parse_args(argv)
    graph = import_graph(args.root, args.packages or root_packages(args.root), typing=not args.runtime_only)
    allowed = () if args.no_allow_list or args.runtime_only else ALLOWED
    problems = check(graph, allowed)
    for problem in problems:
        print(f"import cycle check: {problem}")
    status = "BROKEN" if problems else "kept"
    n = len(cycles(graph))
    print(f"module-level import cycles: {n} in {len(graph)} modules, {len(allowed)} allowed: {status}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
