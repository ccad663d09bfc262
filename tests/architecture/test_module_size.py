"""Every product module is at most 600 lines (docs/architecture.md: small modules), with a ratchet:
the modules over it today are listed in OVERSIZED with their line count, and the check fails when a
module not listed goes over 600, when a listed one grows, and when a listed one shrinks (to 600 or
less, or below its count) without OVERSIZED being updated: the list only shrinks.

Product modules are the `.py` and `.pyx` files of the wheel's packages (pyproject.toml); generated
code is left out: protobuf modules (`*_pb2.py`, `*_pb2_grpc.py`, `adapters/grpc/generated/`) and the
C that Cython writes (.c files are not modules here)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 600

# module -> its line count, for the modules over LIMIT (issue 52 item 6). Lower a count (or drop the
# entry) when a module shrinks; never raise one: split the module instead.
OVERSIZED: dict[str, int] = {}


def is_generated(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(("_pb2.py", "_pb2_grpc.py")) or rel.startswith("adapters/grpc/generated/")


def product_modules(root: Path) -> dict[str, int]:
    """{path relative to root: line count} of the product modules under root."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    packages = config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*")):
            if path.suffix not in (".py", ".pyx") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root).as_posix()
            if not is_generated(rel):
                out[rel] = len(path.read_bytes().splitlines())
    return out


def problems(modules: dict[str, int], allowed: dict[str, int], limit: int = LIMIT) -> list[str]:
    """What breaks the ratchet: new oversized modules, listed ones grown, shrunk or gone."""
    out = []
    for rel, n in sorted(modules.items()):
        if rel not in allowed:
            if n > limit:
                out.append(f"{rel}: {n} lines > {limit} (split it along its concerns)")
        elif n > allowed[rel]:
            out.append(f"{rel}: {n} lines, grown from {allowed[rel]} (split it instead)")
        elif n <= limit:
            out.append(f"{rel}: {n} lines <= {limit}: drop it from OVERSIZED")
        elif n < allowed[rel]:
            out.append(f"{rel}: {n} lines, shrunk from {allowed[rel]}: lower its count in OVERSIZED")
    out += [f"{rel}: listed in OVERSIZED but gone" for rel in sorted(set(allowed) - set(modules))]
    return out


def test_no_product_module_grows_past_the_limit():
    assert problems(product_modules(REPO), OVERSIZED) == []


def test_the_allow_list_is_sorted_and_over_the_limit():
    assert list(OVERSIZED) == sorted(OVERSIZED)
    assert all(n > LIMIT for n in OVERSIZED.values())


def test_the_ratchet_on_a_made_up_tree(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.hatch.build.targets.wheel]\npackages = ["pkg"]\n')
    files = {
        "pkg/small.py": 600,
        "pkg/big.py": 601,
        "pkg/listed.py": 700,
        "pkg/fast.pyx": 650,
        "pkg/_speedups.c": 9000,
        "pkg/service_pb2.py": 5000,
    }
    for rel, n in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n" * n)
    modules = product_modules(tmp_path)
    assert modules == {"pkg/big.py": 601, "pkg/fast.pyx": 650, "pkg/listed.py": 700, "pkg/small.py": 600}
    exact = {"pkg/big.py": 601, "pkg/fast.pyx": 650, "pkg/listed.py": 700}
    assert problems(modules, exact) == []
    # a module not listed over the limit (.pyx count)
    assert problems(modules, {"pkg/listed.py": 700, "pkg/fast.pyx": 650}) == [
        "pkg/big.py: 601 lines > 600 (split it along its concerns)"
    ]
    assert problems(modules, {"pkg/big.py": 601, "pkg/listed.py": 700}) == [
        "pkg/fast.pyx: 650 lines > 600 (split it along its concerns)"
    ]
    # a listed one grown, shrunk below its count, shrunk under the limit, gone
    assert problems(modules, {**exact, "pkg/listed.py": 699}) == [
        "pkg/listed.py: 700 lines, grown from 699 (split it instead)"
    ]
    assert problems(modules, {**exact, "pkg/listed.py": 701}) == [
        "pkg/listed.py: 700 lines, shrunk from 701: lower its count in OVERSIZED"
    ]
    assert problems(modules, {**exact, "pkg/small.py": 640}) == [
        "pkg/small.py: 600 lines <= 600: drop it from OVERSIZED"
    ]
    assert problems(modules, {**exact, "pkg/old.py": 900}) == ["pkg/old.py: listed in OVERSIZED but gone"]
