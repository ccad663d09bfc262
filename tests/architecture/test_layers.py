"""The layer contracts of pyproject.toml ([tool.importlinter], docs/architecture.md) hold for the
tree, and they catch an upward import: the same check run on a copy of the packages with one
import added must fail, naming the contract it breaks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("gateway", "adapters", "cluster", "messaging_processor", "store", "namesrv", "remoting",
            "runtime", "analytics", "conformance")  # fmt: skip

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT), str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_tree(dest: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, dest / pkg, ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_tree_keeps_every_contract():
    r = lint(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("store/upward.py", "import gateway.server\n", "store imports no project package BROKEN"),
        (
            "messaging_processor/upward.py",
            "import cluster.remote_store\n",
            "no network code, no protocol BROKEN",
        ),
        ("adapters/mqtt/upward.py", "from store import Message\n", "know nothing of CLUSTER mode BROKEN"),
        ("adapters/mqtt/upward.py", "import adapters.amqp.broker\n", "independent of each other BROKEN"),
        ("remoting/upward.py", "import adapters.remoting\n", "remoting imports no project package BROKEN"),
    ],
)
def test_an_upward_or_sideways_import_breaks_a_contract(tmp_path, module, line, contract):
    root = copy_tree(tmp_path)
    (root / module).write_text(line)
    r = lint(root)
    assert r.returncode != 0, r.stdout
    assert contract in " ".join(r.stdout.split()), r.stdout
