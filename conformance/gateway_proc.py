"""Start and stop a local ``gateway start`` process for conformance runs (``--spawn``) and tests.

It enables the gRPC, HTTP (admin), MQTT and AMQP listeners. Ports default to 0 (ephemeral); the bound
ports are read from the gateway's ``<proto> listening on HOST:PORT`` log lines. ``kill9()`` +
``start()`` restarts on the same data dir and the same ports.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from conformance.admin import AdminClient
from conformance.runner import REPO, Target

_LISTENING = re.compile(r"\b(\w+) listening on (\S+):(\d+)")
# The listeners a spawned gateway enables (each on an ephemeral port unless given).
LISTENERS = ("grpc", "http", "mqtt", "amqp")

# Small transaction timings so the check-back scenarios finish in seconds.
TEST_ENV = {
    "GATEWAY_TRANSACTION_TIMEOUT_MS": "2000",
    "GATEWAY_TRANSACTION_CHECK_INTERVAL_MS": "1000",
}


def gateway_command() -> list[str]:
    exe = Path(sys.executable).parent / "gateway"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("gateway") or str(REPO / ".venv" / "bin" / "gateway")
    return [found]


class GatewayProcess:
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
        self.proc: subprocess.Popen | None = None
        self._log_offset = 0

    @property
    def target(self) -> Target:
        return Target(self.host, self.grpc_port, self.http_port, self.mqtt_port, self.amqp_port)

    def start(self, timeout: float = 60.0) -> Target:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            *gateway_command(),
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
            *self.extra_args,
        ]
        env = {**os.environ, **self.env}
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
        deadline = time.monotonic() + timeout
        ports: dict[str, int] = {}
        while not set(LISTENERS) <= ports.keys():
            self._check_alive()
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"gateway did not log its listeners within {timeout:.0f}s: {self.log_tail()}"
                )
            for proto, _host, port in _LISTENING.findall(self._new_log()):
                ports[proto.lower()] = int(port)
            time.sleep(0.05)
        self.grpc_port, self.http_port, self.mqtt_port = ports["grpc"], ports["http"], ports["mqtt"]
        self.amqp_port = ports["amqp"]
        admin = AdminClient(self.host, self.http_port)
        while not admin.healthy():
            self._check_alive()
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"gateway /healthz not 200 within {timeout:.0f}s: {self.log_tail()}")
            time.sleep(0.05)
        return self.target

    def _new_log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {self.proc.returncode}: {self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        lines = self._new_log().splitlines()
        return "\n".join(lines[-n:])

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
