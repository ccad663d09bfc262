"""`gateway` subprocesses (`start`, `store`, `namesrv`) for conformance runs, tests and benchmarks.

`GatewayProc` runs one `gateway <subcommand> <args>` process: without the GATEWAY_* variables of
the caller's environment unless asked (`keep_gateway_env`), its output either read from a pipe on a
thread or written to a log file (`log_path`, read only when asked: nothing runs beside a measured
process). `wait_ready()` waits for the subcommand's ready line (``gateway ready``, ``store node
ready``, ``name server ready``), collecting the ``<proto> listening on HOST:PORT`` lines into
`listeners` ({"grpc": "127.0.0.1:8081", ...}; a store node's is "store"), then, if asked, until
``GET /healthz`` answers 200. `stop()` sends SIGTERM and returns the exit code; `kill()` sends SIGKILL.

`GatewayProcess` is the conformance harness's gateway (``python -m conformance --spawn``,
tests/conformance): ``gateway start`` with the gRPC, HTTP (admin), MQTT and AMQP listeners, ports 0
(ephemeral) unless given, output appended to a log file; ``kill9()`` + ``start()`` restarts it on the
same data dir and the same ports.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from conformance.admin import AdminClient
from conformance.runner import REPO, Target
from conformance.streamlines import FileLines, StreamLines

# GATEWAY_* variables a spawned gateway keeps: storage sizing and no MQTT over WebSocket on its fixed
# ports (tests/conftest.py), and the choice of the pure-Python hot path (`GATEWAY_PURE_PYTHON=1 make
# test` tests it in every process), not settings
PASSED_THROUGH = frozenset({"GATEWAY_SEGMENT_SIZE_MIB", "GATEWAY_MQTT_WS", "GATEWAY_PURE_PYTHON"})


def gateway_command() -> list[str]:
    """The `gateway` console script next to this interpreter (else on PATH, else the repository's
    .venv), or `python -m gateway.cli`."""
    exe = Path(sys.executable).parent / "gateway"
    if exe.exists():
        return [str(exe)]
    venv = REPO / ".venv" / "bin" / "gateway"
    found = shutil.which("gateway") or (str(venv) if venv.exists() else None)
    return [found] if found else [sys.executable, "-m", "gateway.cli"]


GATEWAY = gateway_command()
# `INFO <logger>: <proto> listening on HOST:PORT`; a store node logs `store node NAME listening on ...`.
LISTENING = re.compile(r"\bINFO [\w.]+: (\w+)(?: node \S+)? listening on (\S+)")
READY_LINES = {"start": "gateway ready", "store": "store node ready", "namesrv": "name server ready"}
_DEFAULT = object()


class GatewayError(RuntimeError):
    """A gateway process that did not become ready; the message ends with its last output lines."""


def healthy(url: str, timeout: float = 2.0) -> bool:
    """`GET url/healthz` answers 200."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


class GatewayProc:
    """A running `gateway <args>` process (`args[0]` is the subcommand).

    - `env`: variables set on top of this process's environment, from which the GATEWAY_* ones
      are dropped unless `keep_gateway_env` (but for PASSED_THROUGH: the test run's segment size);
    - `log_path`: stdout and stderr appended to that file; without it, stderr is read from a pipe
      on a thread (stdout discarded);
    - `command`: what runs `gateway` (default `GATEWAY`; e.g. with a `taskset -c N` prefix or
      `python -m cProfile -o F -m gateway.cli`); `cwd` (default the repository; None: this
      process's); `new_session`, `preexec_fn` as for subprocess.Popen.
    """

    def __init__(
        self,
        args: Sequence[str],
        name: str = "gateway",
        *,
        env: Mapping[str, str] | None = None,
        keep_gateway_env: bool = False,
        log_path: str | Path | None = None,
        command: Sequence[str] | None = None,
        cwd: str | Path | None = REPO,
        new_session: bool = False,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.args = list(args)
        self.subcommand = self.args[0] if self.args else ""
        self.argv = [*(command or GATEWAY), *self.args]
        self.listeners: dict[str, str] = {}
        self.log_path = Path(log_path) if log_path is not None else None
        full_env = {
            k: v
            for k, v in os.environ.items()
            if keep_gateway_env or not k.startswith("GATEWAY_") or k in PASSED_THROUGH
        }
        full_env.update(env or {})
        popen = dict(
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=full_env,
            start_new_session=new_session,
            preexec_fn=preexec_fn,
        )
        self._out: StreamLines | FileLines
        if self.log_path is None:
            self.p = subprocess.Popen(
                self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen
            )
            assert self.p.stderr is not None
            self._out = StreamLines(self.p.stderr)
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            with open(self.log_path, "ab") as log:
                self.p = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, **popen)
            self._out = FileLines(self.log_path, offset, lambda: self.p.poll() is not None)
        self.lines = self._out.lines

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    # -- output

    def wait_line(self, pattern: str, timeout: float = 30) -> re.Match | None:
        """The first new line matching `pattern`, or None if the process ended or time ran out."""
        return self._out.wait_line(pattern, timeout)

    def drain(self) -> str:
        """Everything it wrote, waiting up to 5 s for each further line (for a process ending)."""
        self._out.collect(5)
        return "\n".join(self.lines)

    def output(self, n: int = 60) -> str:
        """The last `n` lines written so far (no waiting)."""
        self._out.collect(None)
        return "\n".join(self.lines[-n:])

    # -- readiness

    def wait_ready(
        self,
        timeout: float = 60.0,
        *,
        ready_line: str | None | object = _DEFAULT,
        healthz: str | bool = False,
        errors: bool = True,
    ) -> dict[str, str]:
        """Wait until the process logged `ready_line` (default: its subcommand's, see READY_LINES;
        None: do not wait for a line), taking the listening lines before it into `listeners`; then,
        with `healthz` (a base URL, or True for its `http` listener), until GET /healthz answers 200.
        Returns `listeners`. If the process exits, time runs out or (with `errors`) it logs an ERROR
        line first, it is stopped and GatewayError raised with its last output lines."""
        deadline = time.monotonic() + timeout
        line = READY_LINES.get(self.subcommand) if ready_line is _DEFAULT else ready_line
        while isinstance(line, str):
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(f"{self.name} not ready after {timeout:.0f} s")
            try:
                text = self._out.next_line(left)
            except TimeoutError:
                continue
            if text is None:
                self._exited()
            elif m := LISTENING.search(text):
                self.listeners[m.group(1)] = m.group(2)
            elif line in text:
                break
            elif errors and "ERROR" in text:
                self._fail(f"{self.name} logged an error before it was ready")
        if healthz:
            if isinstance(healthz, str):
                url = healthz
            elif "http" in self.listeners:
                url = f"http://{self.listeners['http']}"
            else:
                self._fail(f"{self.name} logged no http listener for /healthz")
            self.wait_healthy(url, deadline - time.monotonic(), timeout)
        return self.listeners

    def wait_healthy(self, url: str, timeout: float, reported: float | None = None) -> None:
        """Wait until GET `url`/healthz answers 200; GatewayError (the process stopped) if it exits
        or `timeout` s pass (`reported` in the message instead, if given)."""
        deadline = time.monotonic() + timeout
        while not healthy(url):
            if not self.alive():
                self._exited()
            if time.monotonic() > deadline:
                self._fail(f"{self.name} /healthz not 200 after {reported or timeout:.0f} s")
            time.sleep(0.05)

    def _exited(self) -> NoReturn:
        try:
            rc = self.p.wait(5)
        except subprocess.TimeoutExpired:
            self._fail(f"{self.name} closed its output")
        self._fail(f"{self.name} exited with status {rc}")

    def _fail(self, reason: str) -> NoReturn:
        self.stop(10)
        self._out.collect(1)
        raise GatewayError(f"{reason}:\n{self.output()}")

    # -- ending

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM, then SIGKILL if it has not exited within `timeout` s; the exit code."""
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        return self.p.returncode

    def kill(self) -> None:
        """SIGKILL (if still running) and wait for it."""
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


# --------------------------------------------------------------------------- conformance's gateway

# The listeners a spawned gateway enables (each on an ephemeral port unless given).
LISTENERS = ("grpc", "http", "mqtt", "amqp")

# Small transaction timings so the check-back scenarios finish in seconds.
TEST_ENV = {
    "GATEWAY_TRANSACTION_TIMEOUT_MS": "2000",
    "GATEWAY_TRANSACTION_CHECK_INTERVAL_MS": "1000",
}


WORKERS_ENV = "CONFORMANCE_WORKERS"  # e.g. 2: every run's gateway is `gateway start --workers 2`


def workers_args() -> list[str]:
    """`--workers N` when CONFORMANCE_WORKERS=N is set (`make test-workers`: the conformance runs,
    real clients of every protocol, against a gateway of N worker processes), else nothing."""
    n = os.environ.get(WORKERS_ENV, "").strip()
    return ["--workers", n] if n else []


class GatewayProcess:
    """`gateway start` for conformance runs: `start()` (again after `kill9()`/`stop()`: same data
    dir, same ports), `target`, `listeners`, `log_tail()`. Its environment is this process's without
    GATEWAY_* variables, plus TEST_ENV and `env`."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        grpc_port: int = 0,
        http_port: int = 0,
        mqtt_port: int = 0,
        amqp_port: int = 0,
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.mqtt_port = mqtt_port
        self.amqp_port = amqp_port
        self.env = {**TEST_ENV, **(env or {})}
        self.log_path = (
            Path(log_path) if log_path else self.data_dir.parent / f"{self.data_dir.name}-gateway.log"
        )
        self.extra_args = extra_args or []
        self.gateway: GatewayProc | None = None

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.gateway.p if self.gateway else None

    @property
    def listeners(self) -> dict[str, str]:
        """{protocol: "host:port"} of the running (or last) process, extra listeners (amqps...) too."""
        return self.gateway.listeners if self.gateway else {}

    @property
    def target(self) -> Target:
        return Target(self.host, self.grpc_port, self.http_port, self.mqtt_port, self.amqp_port)

    def start(self, timeout: float = 60.0) -> Target:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "start",
            "--data-dir",
            str(self.data_dir),
            "--host",
            self.host,
            "--grpc-port",
            str(self.grpc_port),
            "--http-port",
            str(self.http_port),
            "--mqtt-port",
            str(self.mqtt_port),
            "--amqp-port",
            str(self.amqp_port),
            "--protocols",
            ",".join(LISTENERS),  # only what the scenarios use: other default ports may be taken
            *workers_args(),
            *self.extra_args,
        ]
        deadline = time.monotonic() + timeout
        self.gateway = gw = GatewayProc(args, env=self.env, log_path=self.log_path)
        try:
            listeners = gw.wait_ready(timeout)
            missing = [p for p in LISTENERS if p not in listeners]
            if missing:
                gw.stop()
                raise RuntimeError(f"gateway logged no {', '.join(missing)} listener: {self.log_tail()}")
            ports = {p: int(listeners[p].rsplit(":", 1)[1]) for p in LISTENERS}
            self.grpc_port, self.http_port, self.mqtt_port = ports["grpc"], ports["http"], ports["mqtt"]
            self.amqp_port = ports["amqp"]
            gw.wait_healthy(AdminClient(self.host, self.http_port).base, deadline - time.monotonic(), timeout)
        except GatewayError as e:
            raise RuntimeError(f"gateway did not start: {e}") from e
        return self.target

    def log_tail(self, n: int = 20) -> str:
        """The last `n` lines the current (or last) process wrote."""
        return self.gateway.output(n) if self.gateway else ""

    def kill9(self) -> None:
        if self.gateway:
            self.gateway.kill()

    def stop(self, timeout: float = 15.0) -> None:
        if self.gateway:
            self.gateway.stop(timeout)
