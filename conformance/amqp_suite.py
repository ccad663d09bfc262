"""Run aiormq's own broker-facing test suite against a spawned gateway.

    .venv/bin/python -m conformance.amqp_suite [--json] [-k EXPR] [--sdist PATH] [--keep]

aiormq (the AMQP 0-9-1 client under aio-pika) ships its tests in its PyPI sdist (aiormq 7.2.4,
sha256 pinned below; fetched once into ~/.cache/gateway-conformance, or given with --sdist / the
AMQP_SUITE_SDIST environment variable). Upstream they run against a RabbitMQ Docker container through
two fixtures that the sdist does not contain (they live in aiormq's repository): ``amqp_direct_url``
and ``rabbitmq_container``. This module supplies them: a conftest.py next to the unpacked tests
points ``amqp_direct_url`` at the gateway's AMQP port and ``rabbitmq_container.ports["5671/tcp"]``
at its amqps port. The gateway is started by conformance.gateway_proc with TLS on, using the
suite's own certificates (tests/certs/server.pem / server.key), so the ``amqps`` and
``amqps-client`` parametrisations run too. No test needs RabbitMQ's management HTTP API, so none is
excluded. pytest and aiomisc-pytest come from .venv-conformance (requirements.lock).

Result: passed / failed / errors / skipped counts, and the failing test ids grouped by test
function, as a table or (``--json``) one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from conformance.gateway_proc import GatewayProcess
from conformance.runner import _conformance_python
from conformance.sdist import PinnedSdist

PACKAGE, VERSION = "aiormq", "7.2.4"
SDIST = f"{PACKAGE}-{VERSION}.tar.gz"
PIN = PinnedSdist(
    PACKAGE,
    VERSION,
    SDIST.removesuffix(".tar.gz"),
    "5fd20bb9583d73de85572198496b65cf028f27527c1733c9840d458e0b40e8fa",
    "71/11/8b93eac7630c5087c34df3d34ce0bdf50d6ea2fb83061f17e8c73877141d/aiormq-7.2.4.tar.gz",
    "AMQP_SUITE_SDIST",
)

CONFTEST = '''\
"""Fixtures the aiormq sdist's tests expect from aiormq's repository (a RabbitMQ container there):
here they point at the gateway under test (conformance/amqp_suite.py)."""
import os

import pytest
from yarl import URL


class _Container:
    ports = {"5671/tcp": int(os.environ["AMQPS_PORT"])}


@pytest.fixture(scope="session")
def amqp_direct_url():
    return URL(os.environ["AMQP_URL"])


@pytest.fixture(scope="session")
def rabbitmq_container():
    return _Container()
'''


def fetch_sdist(explicit: str | None = None) -> Path:
    """The pinned sdist: `explicit`, $AMQP_SUITE_SDIST, the cache, else PyPI (sha256 checked)."""
    return PIN.fetch(explicit)


def unpack_tests(sdist: Path, dest: Path) -> Path:
    """Only tests/ of the sdist, with the fixtures it lacks (CONFTEST)."""
    root = PIN.unpack_tests(sdist, dest)
    (root / "conftest.py").write_text(CONFTEST)
    return root


def run_suite(
    work: Path, *, sdist: str | None = None, select: str | None = None, timeout: float = 900
) -> dict:
    root = unpack_tests(fetch_sdist(sdist), work)
    certs = root / "tests" / "certs"
    gw = GatewayProcess(
        work / "data",
        extra_args=[
            "--tls-cert",
            str(certs / "server.pem"),
            "--tls-key",
            str(certs / "server.key"),
            "--amqp-tls-port",
            "0",
            "--mqtt-tls-port",
            "0",
            "--https-port",
            "0",
        ],
    )
    gw.start()
    try:
        amqps = gw.listeners.get("amqps")
        if not amqps:
            raise RuntimeError(f"no amqps listener in the gateway log: {gw.log_tail()}")
        env = {
            **os.environ,
            "AMQP_URL": f"amqp://guest:guest@{gw.host}:{gw.amqp_port}/",
            "AMQPS_PORT": amqps.rsplit(":", 1)[1],
        }
        env.pop("PYTHONPATH", None)
        junit = work / "junit.xml"
        cmd = [
            _conformance_python(),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--junitxml",
            str(junit),
            "tests",
        ]
        if select:
            cmd += ["-k", select]
        t = time.monotonic()
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        elapsed = time.monotonic() - t
        (work / "pytest.out").write_text(proc.stdout + proc.stderr)
    finally:
        gw.stop()
    return {
        **parse_junit(junit),
        "elapsed_s": round(elapsed, 1),
        "suite": f"{PACKAGE} {VERSION} sdist tests",
        "exit_code": proc.returncode,
        "log": str(work / "pytest.out"),
        "gateway_log": str(gw.log_path),
    }


def parse_junit(path: Path) -> dict:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failing: dict[str, list[str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        name = case.get("name", "")
        func = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{name.split('[', 1)[0]}"
        if "failure" in kinds:
            counts["failed"] += 1
        elif "error" in kinds:
            counts["errors"] += 1
        elif "skipped" in kinds:
            counts["skipped"] += 1
            continue
        else:
            counts["passed"] += 1
            continue
        failing.setdefault(func, []).append(name[len(name.split("[", 1)[0]) :])
    counts["total"] = sum(counts.values())
    return {**counts, "failing": failing}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.amqp_suite", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("-k", dest="select", default=None, help="pytest -k expression (default: every test)")
    p.add_argument(
        "--sdist", default=None, help=f"a local {SDIST} (default: fetched from PyPI, sha256 checked)"
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, junit.xml)")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="amqp-suite-"))
    try:
        res = run_suite(work, sdist=a.sdist, select=a.select)
    finally:
        if not a.keep:
            shutil.rmtree(work / "data", ignore_errors=True)
    if a.json:
        print(json.dumps(res))
    else:
        print(
            f"{res['suite']}: {res['passed']} passed, {res['failed']} failed, {res['errors']} errors, "
            f"{res['skipped']} skipped of {res['total']} in {res['elapsed_s']} s (log {res['log']})"
        )
        for func, ids in sorted(res["failing"].items()):
            print(f"  FAIL {func} x{len(ids)}: {' '.join(ids)[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
