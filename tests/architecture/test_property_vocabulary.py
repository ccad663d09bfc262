"""One message vocabulary (issue 52 item 2): a protocol's property names are spelled only in its
own adapter and in the vocabulary module, messaging_processor/properties.py.

The check reads every product module (the wheel's packages, pyproject.toml) and fails on a string
constant that is a name of a protocol's prefix (`mqtt.topic`, `amqp.rk`, `ce.id`, ...) outside the
homes of that prefix: `.py` modules through `ast` (docstrings and comments are prose, not names:
a constant counts only when it is a whole dotted name), `.pyx` modules through their quoted
literals. Two names are spelled twice on purpose, each checked to equal the vocabulary's:

- store/message.py `PATH_PROPERTY`: the record property of a message's path is part of the store's
  record format (records on disk carry it) and the store may import nothing above it;
- analytics/compaction.py: Spark executors import no project package (pyproject.toml's contract:
  not the store, hence not messaging_processor, which imports it).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from messaging_processor import properties

REPO = Path(__file__).resolve().parents[2]
VOCABULARY = "messaging_processor/properties.py"

# prefix -> the packages where its names are at home (the protocol's own adapter)
HOMES: dict[str, tuple[str, ...]] = {
    "mqtt": ("adapters/mqtt/",),
    "amqp": ("adapters/amqp/",),
    "ce": ("adapters/cloudevents/",),
    "cloudevents": ("adapters/cloudevents/",),
    "grpc": ("adapters/grpc/",),
    "rocketmq": ("adapters/remoting/", "adapters/grpc/", "remoting/"),
    "remoting": ("adapters/remoting/", "remoting/"),
}
NAME = re.compile(r"({})\.[A-Za-z0-9_.]*".format("|".join(HOMES)))
PYX_LITERAL = re.compile(r"""(["'])((?:{})\.[A-Za-z0-9_.]*)\1""".format("|".join(HOMES)))

# (module, name): spelled outside its homes on purpose (the module docstring says why)
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("store/message.py", "mqtt.topic"): properties.P_PATH,
    ("analytics/compaction.py", "mqtt.topic"): properties.P_PATH,
    ("analytics/compaction.py", "ce.partitionkey"): properties.P_CE_PARTITION_KEY,
}


def product_modules(root: Path) -> list[Path]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    out: list[Path] = []
    for pkg in packages:  # (a package missing under root has no modules)
        for path in sorted((root / pkg).rglob("*")):
            if path.suffix in (".py", ".pyx") and "__pycache__" not in path.parts:
                out.append(path)
    return out


def names_in(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every protocol-prefixed name the module spells as a string constant."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".pyx":
        return [
            (text.count("\n", 0, m.start()) + 1, m.group(2))
            for m in PYX_LITERAL.finditer(text)
            if not text[text.rfind("\n", 0, m.start()) + 1 : m.start()].lstrip().startswith("#")
        ]
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(text, str(path)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value)
    ]


def violations(root: Path) -> list[str]:
    out = []
    for path in product_modules(root):
        rel = path.relative_to(root).as_posix()
        if rel == VOCABULARY:
            continue
        for line, name in names_in(path):
            prefix = name.split(".", 1)[0]
            if rel.startswith(HOMES[prefix]) or (rel, name) in EXCEPTIONS:
                continue
            out.append(f"{rel}:{line}: {name!r} (a name of {prefix}: its adapter or {VOCABULARY})")
    return out


def test_no_protocol_property_outside_its_adapter_and_the_vocabulary() -> None:
    assert violations(REPO) == []


def test_the_exceptions_are_the_vocabulary_names() -> None:
    for (rel, name), value in EXCEPTIONS.items():
        assert name == value, (rel, name)
        assert name in {n for _, n in names_in(REPO / rel)}, (
            f"{rel} no longer spells {name!r}: drop the entry"
        )


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A tree of product packages holding only `files` (the real tree passes: see above)."""
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("rel", "text", "found"),
    [
        ("store/injected.py", 'KEY = "mqtt.topic"\n', "store/injected.py:1: 'mqtt.topic'"),
        (
            "messaging_processor/injected.py",
            'def f(p):\n    return p.get("ce.id")\n',
            "injected.py:2: 'ce.id'",
        ),
        ("adapters/mqtt/injected.py", 'RK = "amqp.rk"\n', "adapters/mqtt/injected.py:1: 'amqp.rk'"),
        ("cluster/injected.py", 'P = f"mqtt.s.{1}"\n', "cluster/injected.py:1: 'mqtt.s.'"),
        ("store/_injected.pyx", 'cdef str _P = "mqtt.topic"\n', "store/_injected.pyx:1: 'mqtt.topic'"),
    ],
)
def test_an_injected_literal_fails_it(tmp_path: Path, rel: str, text: str, found: str) -> None:
    root = _tree(tmp_path, {rel: text})
    got = violations(root)
    assert len(got) == 1 and found in got[0], got


def test_prose_and_homes_pass(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "store/prose.py": (
                '"""The path travels in `mqtt.topic` (a docstring)."""\n# "mqtt.topic" in a comment\n'
            ),
            "adapters/amqp/own.py": 'P = "amqp.rk"\n',
            "store/_prose.pyx": '# cdef str _P = "mqtt.topic"\n',
        },
    )
    assert violations(root) == []
