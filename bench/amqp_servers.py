"""Brokers under test for bench/amqp_bench.py (process helpers in bench/common.py).

- `gateway` (common.start_gateway(workdir, "amqp", ..., ready=amqp_ready, server_cls=AmqpServer)):
  `.venv/bin/gateway start --data-dir <tmp> --protocols amqp,http --amqp-port P --http-port Q` (or
  `python -m gateway.cli` from `--gateway-src`), ready when it logged `gateway ready`, `GET
  /healthz` answers 200 and the AMQP port sends `connection.start`. Defaults: flush `sync` (a
  confirm waits for the group commit's fdatasync).
- `rabbitmq`: Debian's rabbitmq-server (deps/debian-packages.txt), run in the foreground as the
  current user from its own sbin script (not the Debian wrapper that switches to the rabbitmq user)
  with a private environment: RABBITMQ_NODENAME `amqpbench<pid>@localhost`, RABBITMQ_NODE_PORT P on
  127.0.0.1, RABBITMQ_DIST_PORT and ERL_EPMD_PORT on free ports (its own epmd, never the system's),
  RABBITMQ_MNESIA_BASE / RABBITMQ_LOG_BASE / HOME (Erlang cookie) in the work directory, an empty
  enabled-plugins file (no management plugin), no config file (RabbitMQ's defaults: classic queues,
  fsync on confirm batches). Scheduler busy-wait is off (`+sbwt none +sbwtdcpu none +sbwtdio
  none`, RabbitMQ's own advice for shared machines), so spinning idle schedulers are not counted
  as its CPU. Ready when the AMQP port sends `connection.start`. The measured process is beam.smp
  (the script's child; epmd's CPU is negligible and reported apart in `info`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from common import Server, ServerError, cpu_s, descendants, free_port, spawn, wait_ready

from conformance.rabbitmq_procs import amqp_ready, comm, epmd_pids, rabbitmq_script


class AmqpServer(Server):
    """A Server whose measured process may be a descendant of the spawned one (beam.smp)."""

    measured_pid: int | None = None
    cleanup_pids: list[int] | None = None

    @property
    def pid(self) -> int:  # type: ignore[override]
        return self.measured_pid or self.proc.pid

    def stop(self, timeout: float = 15.0) -> None:
        if self.measured_pid and self.measured_pid != self.proc.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.measured_pid, signal.SIGTERM)
            wait_gone(self.measured_pid, timeout)
        super().stop(timeout)
        for p in [self.measured_pid, *(self.cleanup_pids or [])]:
            if p:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)


def start_rabbitmq(workdir: Path, cpu: int | None, timeout: float = 90.0) -> AmqpServer:
    script = rabbitmq_script()
    if script is None:
        raise ServerError(
            "rabbitmq-server is not installed (deps/debian-packages.txt: run deps/install-debian.sh)"
        )
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    for d in ("mnesia", "log", "home"):
        (workdir / d).mkdir(parents=True, exist_ok=True)
    plugins = workdir / "enabled_plugins"
    plugins.write_text("[].\n")
    env = dict(os.environ)
    env.update(
        {
            "HOME": str(workdir / "home"),
            "RABBITMQ_NODENAME": f"amqpbench{os.getpid()}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(workdir / "log"),
            "RABBITMQ_LOGS": "-",
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq"),  # absent: defaults
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(workdir / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(workdir / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(workdir / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "+sbwt none +sbwtdcpu none +sbwtdio none",
        }
    )
    proc, log_path = spawn("rabbitmq", [script], workdir, cpu, env, str(workdir))
    server = AmqpServer("rabbitmq", proc, port, workdir, log_path)
    server.info = {"command": script, "node_port": port, "epmd_port": epmd_port}

    def ready() -> bool:
        return amqp_ready(port)

    try:
        wait_ready(server, ready, timeout)
    finally:
        server.cleanup_pids = epmd_pids(epmd_port)
    beam = [p for p in [proc.pid, *descendants(proc.pid)] if comm(p) == "beam.smp"]
    if not beam:
        server.stop()
        raise ServerError("rabbitmq: no beam.smp process found")
    server.measured_pid = beam[0]
    server.info["beam_pid"] = beam[0]
    server.info["epmd_pids"] = server.cleanup_pids
    return server


def epmd_cpu_s(server: AmqpServer) -> float:
    total = 0.0
    for p in server.cleanup_pids or []:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += cpu_s(p)
    return total


def wait_gone(pid: int, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.05)
