"""Run aio-pika's own test suite against a spawned gateway.

    .venv/bin/python -m conformance.aiopika_suite [--json] [-k EXPR] [--sdist PATH] [--no-auth] [--keep]

aio-pika 10.2.1 ships its tests in its PyPI sdist (sha256 pinned below; fetched once into
~/.cache/gateway-conformance, or given with --sdist / the AIOPIKA_SUITE_SDIST environment variable).
Upstream, tests/conftest.py starts RabbitMQ in Docker through tests/docker_client.py. A root
conftest.py written next to the unpacked tests replaces that Docker client (before tests/conftest.py
imports it) with one whose "containers" are gateways:

- the session broker (``rabbitmq_container``: ports 5672 and 5671) is the gateway this module spawned,
  with TLS on a throw-away self-signed certificate (the amqps tests do not verify it);
- any other container (test_robust_recovery's private broker) is a fresh ``gateway start`` on its own
  data dir; ``kill`` is SIGKILL, ``start`` restarts it on the same data dir; Docker's exec API
  (``rabbitmqctl stop_app``) is not available and raises.

By default the gateway runs with ``--auth`` (docs/security.md): its first admin gets a random password,
and the user ``guest``/``guest`` (role admin, like RabbitMQ's default user) is added through the admin
CLI, so the suite's URLs work unchanged and ``test_wrong_credentials`` checks that bad credentials are
refused. ``--no-auth`` runs it without authentication. pytest, aiomisc-pytest and shortuuid come from
.venv-conformance (requirements.lock).

Result: passed / failed / errors / skipped counts and the failing test ids by test function.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from conformance.gateway_proc import GATEWAY, LISTENERS, GatewayProcess
from conformance.runner import _conformance_python
from conformance.sdist import PinnedSdist

PACKAGE, VERSION = "aio-pika", "10.2.1"
SDIST = f"aio_pika-{VERSION}.tar.gz"
PIN = PinnedSdist(
    PACKAGE,
    VERSION,
    SDIST.removesuffix(".tar.gz"),
    "e4f77afd9179a3cca5a904c3b0a1190256a36d9f90650db908b1b2245eb27487",
    "5d/31/70f0d7a9fe1affc3241d86d24c24714a4a2ac648961efd3d835ef734a6a1/aio_pika-10.2.1.tar.gz",
    "AIOPIKA_SUITE_SDIST",
)

CONFTEST = '''\
"""Replaces aio-pika's Docker client (tests/docker_client.py) with gateways (conformance/aiopika_suite.py).
Loaded before tests/conftest.py, which imports the patched names."""
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests import docker_client as dc

LISTENING = re.compile(r"INFO [\\w.]+: amqp listening on (\\S+):(\\d+)")
SESSION = dc.ContainerInfo(
    id="gateway-session",
    host=os.environ["AMQP_HOST"],
    ports={"5672/tcp": int(os.environ["AMQP_PORT"]), "5671/tcp": int(os.environ["AMQPS_PORT"])},
)


class _Gateway:
    """A spawned `gateway start` standing for one container."""

    def __init__(self, n):
        self.data = Path(os.environ["AIOPIKA_SUITE_DIR"]) / f"container-{n}"
        self.proc = None
        self.port = 0

    def start(self):
        log = self.data.with_suffix(".log")
        offset = log.stat().st_size if log.exists() else 0
        argv = [a.replace("{data}", str(self.data)) for a in json.loads(os.environ["AIOPIKA_SUITE_SPAWN"])]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            text = log.read_bytes()[offset:].decode(errors="replace")
            m = LISTENING.search(text)
            if m and "gateway ready" in text:
                self.port = int(m.group(2))
                return
            time.sleep(0.1)
        raise RuntimeError(f"gateway container did not start: {log.read_text()[-2000:]}")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


class GatewayDocker(dc.DockerClient):
    """The Docker client's interface over gateway processes."""

    containers = {}

    def __init__(self, docker_host_info=None):
        self.docker_host_info = dc.DockerHostInfo(is_tcp=False, socket_path="")

    def _request(self, method, path, body=None):
        raise RuntimeError(f"no Docker API with the gateway: {method} {path}")

    def run(self, image, ports, environment=None):
        if "5671/tcp" in ports:
            return SESSION
        cid = f"gateway-{len(self.containers)}"
        gw = self.containers[cid] = _Gateway(len(self.containers))
        gw.start()
        return dc.ContainerInfo(id=cid, ports={"5672/tcp": gw.port}, host=SESSION.host)

    def start(self, container_id):
        self.containers[container_id].start()

    def kill(self, container_id):
        if container_id in self.containers:
            self.containers[container_id].kill()

    def stop(self, container_id, timeout=10):
        self.kill(container_id)

    def remove(self, container_id):
        gw = self.containers.pop(container_id, None)
        if gw:
            gw.kill()
            shutil.rmtree(gw.data, ignore_errors=True)

    def inspect(self, container_id):
        port = self.containers[container_id].port
        return {"NetworkSettings": {"Ports": {"5672/tcp": [{"HostPort": str(port)}]}}}


dc.DockerClient = GatewayDocker
dc.check_docker_available = lambda: dc.DockerHostInfo(is_tcp=False, socket_path="")
'''


def fetch_sdist(explicit: str | None = None) -> Path:
    """The pinned sdist: `explicit`, $AIOPIKA_SUITE_SDIST, the cache, else PyPI (sha256 checked)."""
    return PIN.fetch(explicit)


def unpack_tests(sdist: Path, dest: Path) -> Path:
    """Only tests/ (the installed aio-pika from .venv-conformance is the one under test), with the
    Docker fixtures replaced (CONFTEST)."""
    root = PIN.unpack_tests(sdist, dest)
    (root / "conftest.py").write_text(CONFTEST)
    return root


def _self_signed(work: Path) -> tuple[Path, Path]:
    cert, key = work / "server.pem", work / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


def _spawn_argv() -> list[str]:
    """`gateway start` for the suite's extra "containers" ({data}: their data dir), without auth."""
    ports = [a for p in LISTENERS for a in (f"--{p}-port", "0")]
    return [
        *GATEWAY,
        "start",
        "--data-dir",
        "{data}",
        "--host",
        "127.0.0.1",
        *ports,
        "--protocols",
        ",".join(LISTENERS),
    ]


def _add_guest(gw: GatewayProcess, admin_password: str) -> None:
    """The user guest/guest, role admin (RabbitMQ's default user), through the admin CLI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(
        GATEWAY_URL=f"http://{gw.host}:{gw.http_port}", GATEWAY_USER="admin", GATEWAY_PASSWORD=admin_password
    )
    subprocess.run(
        [*GATEWAY, "user", "add", "guest", "--role", "admin", "--password-stdin"],
        input="guest\n",
        env=env,
        text=True,
        check=True,
        capture_output=True,
        timeout=60,
    )


def run_suite(
    work: Path,
    *,
    sdist: str | None = None,
    select: str | None = None,
    paths: list[str] | None = None,
    auth: bool = True,
    timeout: float = 1800,
) -> dict:
    """Unpack the tests into `work`, spawn the gateway and run pytest on `paths` (default: tests/;
    node ids relative to the sdist's root) with `-k select`; counts from its junit report."""
    root = unpack_tests(fetch_sdist(sdist), work)
    cert, key = _self_signed(work)
    tls = ["--tls-cert", str(cert), "--tls-key", str(key), "--amqp-tls-port", "0", "--mqtt-tls-port", "0"]
    tls += ["--https-port", "0"]
    admin_password = secrets.token_urlsafe(16)
    gw = GatewayProcess(
        work / "data",
        extra_args=[*tls, "--auth"] if auth else tls,
        env={"GATEWAY_ADMIN_PASSWORD": admin_password} if auth else None,
    )
    gw.start()
    spawn_dir = work / "containers"
    spawn_dir.mkdir(exist_ok=True)
    try:
        amqps = gw.listeners.get("amqps")
        if not amqps:
            raise RuntimeError(f"no amqps listener in the gateway log: {gw.log_tail()}")
        if auth:
            _add_guest(gw, admin_password)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env.update(
            AMQP_HOST=gw.host,
            AMQP_PORT=str(gw.amqp_port),
            AMQPS_PORT=amqps.rsplit(":", 1)[1],
            AIOPIKA_SUITE_SPAWN=json.dumps(_spawn_argv()),
            AIOPIKA_SUITE_DIR=str(spawn_dir),
        )
        env.pop("PYTHONPATH", None)
        junit = work / "junit.xml"
        cmd = [_conformance_python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:asyncio"]
        cmd += ["-o", "addopts=", "--junitxml", str(junit), *(paths or ["tests"])]
        if select:
            cmd += ["-k", select]
        t = time.monotonic()
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        elapsed = time.monotonic() - t
        (work / "pytest.out").write_text(proc.stdout + proc.stderr)
    finally:
        gw.stop()
    if not junit.exists():
        raise RuntimeError(
            f"pytest wrote no report (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-3000:]}"
        )
    return {
        **parse_junit(junit),
        "elapsed_s": round(elapsed, 1),
        "suite": f"{PACKAGE} {VERSION} sdist tests" + (" (gateway with --auth)" if auth else ""),
        "exit_code": proc.returncode,
        "log": str(work / "pytest.out"),
        "gateway_log": str(gw.log_path),
    }


def parse_junit(path: Path) -> dict:
    """Counts per test (a test that fails and then errors in teardown is reported twice by pytest's
    junit writer: counted once, as failed) and the failing ids grouped by test function."""
    rank = {"failure": 3, "error": 2, "skipped": 1}
    worst: dict[tuple[str, str], int] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        worst[key] = max([worst.get(key, 0), *(rank.get(child.tag, 0) for child in case)])
    names = {0: "passed", 1: "skipped", 2: "errors", 3: "failed"}
    counts = dict.fromkeys(("passed", "failed", "errors", "skipped"), 0)
    failing: dict[str, list[str]] = {}
    for (cls, name), r in sorted(worst.items()):
        counts[names[r]] += 1
        if r >= 2:
            base = name.split("[", 1)[0]
            failing.setdefault(f"{cls.removeprefix('tests.')}::{base}", []).append(name[len(base) :] or "-")
    counts["total"] = len(worst)
    return {**counts, "failing": failing}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m conformance.aiopika_suite", description=__doc__.split("\n")[0]
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("-k", dest="select", default=None, help="pytest -k expression (default: every test)")
    p.add_argument(
        "--sdist", default=None, help=f"a local {SDIST} (default: fetched from PyPI, sha256 checked)"
    )
    p.add_argument("--no-auth", action="store_true", help="run the gateway without --auth")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, junit.xml)")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="aiopika-suite-"))
    try:
        res = run_suite(work, sdist=a.sdist, select=a.select, auth=not a.no_auth)
    finally:
        if not a.keep:
            shutil.rmtree(work / "data", ignore_errors=True)
            shutil.rmtree(work / "containers", ignore_errors=True)
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
