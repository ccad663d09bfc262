"""The product wheel carries the product packages and not the conformance harness (`conformance/`:
test clients, scenarios, the gateway-subprocess helper), which stays in the checkout for the tests
and benches (`python -m conformance`). The wheel is built by hatchling, as `uv build` does, without
the build hook (HATCH_BUILD_NO_HOOKS: the hook only adds the compiled hot path's .so files)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UV = REPO / ".uv-tool" / "bin" / "uv"  # the Makefile's uv
uv = str(UV) if UV.exists() else shutil.which("uv")

pytestmark = pytest.mark.skipif(uv is None, reason="uv is not installed (make install)")


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    env = {**os.environ, "HATCH_BUILD_NO_HOOKS": "true", "UV_PYTHON_DOWNLOADS": "never"}
    r = subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(out), "--python", sys.executable, str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_the_wheel_has_no_conformance_harness(wheel_files):
    assert not [f for f in wheel_files if f.startswith("conformance/")]
    assert not [f for f in wheel_files if "gateway_proc" in f or "/clients/" in f]


def test_the_wheel_has_every_product_package(wheel_files):
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert "conformance" not in packages
    tops = {
        f.split("/", 1)[0] for f in wheel_files if "/" in f and not f.split("/", 1)[0].endswith(".dist-info")
    }
    assert tops == set(packages)
    for module in (
        "gateway/cli/__init__.py",
        "adapters/mqtt/session.py",
        "store/appending.py",
        "runtime/__init__.py",
    ):
        assert module in wheel_files


def test_python_m_conformance_runs_from_the_checkout():
    r = subprocess.run(
        [sys.executable, "-m", "conformance", "--list"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "mqtt" in r.stdout
