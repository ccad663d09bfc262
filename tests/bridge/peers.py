"""Real peer brokers for the bridge tests and bench/bridge_soak.py: Mosquitto and RabbitMQ as
plain child processes on free ports, with their data in a given directory (never services).

`Mosquitto(workdir)`: /usr/sbin/mosquitto with a config file of its own: a plain listener, an
optional TLS listener (`tls=(ca, cert, key)`, client certificates required), password file
optional, persistence on (`persistence_location` in workdir), no queue limit for offline
persistent sessions (`max_queued_messages 0`: Mosquitto's default of 1000 drops the rest), 20
messages in flight per client (its default), and an autosave after every `autosave_changes`
changes (1: the closest Mosquitto has to durable; it still saves after, not before, the PUBACK).
`stop()` (SIGTERM) saves the database; `kill9()` / `start()` again: the same ports and database.

`RabbitMQ(workdir)`: Debian's rabbitmq-server run in the foreground from its own sbin script
(as bench/amqp_servers.py does): a node name of its own (`bridgetest<pid>x<n>@localhost`: each
pytest-xdist worker and each instance differ), AMQP, distribution and epmd ports free ones (its own
epmd, never the system's), mnesia, logs and the Erlang cookie (HOME) in workdir, no plugins.
`tls=(ca, cert, key)` adds a TLS listener (`tls_port`, client certificates required, in a
rabbitmq.conf of its own). `kill9()` kills beam.smp; `start()` again reuses node name, ports and
mnesia directory (durable queues and persistent messages survive). `stop()` ends the node and its
epmd."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

from conformance.rabbitmq_procs import amqp_ready, comm, epmd_pids, rabbitmq_script

MOSQUITTO = "/usr/sbin/mosquitto"
_seq = itertools.count()


def free_port() -> int:
    """A port free on every address, below the kernel's ephemeral range (32768-60999 on Linux):
    a broker restarted after `kill -9` gets it back, since no outgoing connection can have taken it
    meanwhile (this machine has thousands of them); epmd binds 0.0.0.0, so 0.0.0.0 is checked."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def _wait(
    cond, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    raise RuntimeError(f"{what} not ready in {timeout} s\n{tail}")


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _gone(pid: int, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return
        except (OSError, IndexError):
            return
        time.sleep(0.02)


class Mosquitto:
    def __init__(
        self,
        workdir: Path,
        *,
        tls: tuple[str, str, str] | None = None,
        passwords: dict[str, str] | None = None,
        autosave_changes: int = 1,
    ) -> None:
        self.dir = Path(workdir)
        (self.dir / "db").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls_port = free_port() if tls else None
        self.log = self.dir / "mosquitto.log"
        lines = [
            "per_listener_settings false",
            "persistence true",
            f"persistence_location {self.dir / 'db'}/",
            "autosave_on_changes true",
            f"autosave_interval {autosave_changes}",
            "max_queued_messages 0",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
        ]
        if os.geteuid() == 0:  # mosquitto run as root switches to user mosquitto: keep root (its files)
            lines.append("user root")
        if passwords:
            pw = self.dir / "passwd"
            pw.write_text("".join(f"{u}:{p}\n" for u, p in passwords.items()))
            subprocess.run(["mosquitto_passwd", "-U", str(pw)], check=True, capture_output=True)
            pw.chmod(0o600)
            lines += ["allow_anonymous false", f"password_file {pw}"]
        else:
            lines.append("allow_anonymous true")
        lines += [f"listener {self.port} 127.0.0.1"]
        if tls:
            ca, cert, key = tls
            lines += [
                f"listener {self.tls_port} 127.0.0.1",
                f"cafile {ca}",
                f"certfile {cert}",
                f"keyfile {key}",
                "require_certificate true",
            ]
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen | None = None

    def start(self) -> Mosquitto:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=log, stderr=log)
        _wait(lambda: _connects(self.port), 15, "mosquitto", self.proc, self.log)
        if self.tls_port:
            _wait(lambda: _connects(self.tls_port), 15, "mosquitto TLS", self.proc, self.log)
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{d}/stat") as f:
                if int(f.read().split(") ", 1)[1].split()[1]) == pid:
                    out.append(int(d))
    return out


class RabbitMQ:
    def __init__(self, workdir: Path, *, tls: tuple[str, str, str] | None = None) -> None:
        script = rabbitmq_script()
        if script is None:
            raise RuntimeError(
                "rabbitmq-server is not installed (deps/debian-packages.txt: make install-system)"
            )
        self.script = script
        self.dir = Path(workdir)
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        self.node = f"bridgetest{os.getpid()}x{next(_seq)}@localhost"
        for d in ("mnesia", "log", "home"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        (self.dir / "enabled_plugins").write_text("[].\n")
        self.tls_port = free_port() if tls else None
        if tls:  # a TLS listener beside the plain one, client certificates required
            ca, cert, key = tls
            (self.dir / "rabbitmq.conf").write_text(
                f"listeners.ssl.default = 127.0.0.1:{self.tls_port}\n"
                f"ssl_options.cacertfile = {ca}\nssl_options.certfile = {cert}\nssl_options.keyfile = {key}\n"
                "ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n"
            )
        self.log = self.dir / "rabbitmq.out"
        self.proc: subprocess.Popen | None = None
        self.beam: int | None = None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        w = self.dir
        env.update(
            {
                "HOME": str(w / "home"),
                "RABBITMQ_NODENAME": self.node,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(self.dist_port),
                "ERL_EPMD_PORT": str(self.epmd_port),
                "ERL_EPMD_ADDRESS": "127.0.0.1",
                "RABBITMQ_MNESIA_BASE": str(w / "mnesia"),
                "RABBITMQ_LOG_BASE": str(w / "log"),
                "RABBITMQ_LOGS": "-",
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(w / "enabled_plugins"),
                "RABBITMQ_CONFIG_FILE": str(w / "rabbitmq"),  # rabbitmq.conf: absent (defaults) unless TLS
                "RABBITMQ_ADVANCED_CONFIG_FILE": str(w / "advanced.config"),
                "RABBITMQ_CONF_ENV_FILE": str(w / "rabbitmq-env.conf"),
                "RABBITMQ_PID_FILE": str(w / "rabbitmq.pid"),
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "+sbwt none +sbwtdcpu none +sbwtdio none",
            }
        )
        return env

    def start(self, timeout: float = 90.0) -> RabbitMQ:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.script], stdout=log, stderr=log, env=self._env(), cwd=self.dir, start_new_session=True
            )
        _wait(lambda: amqp_ready(self.port), timeout, "rabbitmq", self.proc, self.log)
        if self.tls_port:
            _wait(lambda: _connects(self.tls_port), timeout, "rabbitmq TLS", self.proc, self.log)
        beams = [p for p in [self.proc.pid, *_children(self.proc.pid)] if comm(p) == "beam.smp"]
        self.beam = beams[0] if beams else self.proc.pid
        return self

    def kill9(self) -> None:
        """SIGKILL to the broker (beam.smp) and what its script left; epmd keeps running."""
        assert self.proc is not None
        for pid in {self.beam, self.proc.pid}:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
        self.proc.wait()
        if self.beam:
            _gone(self.beam)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # erl_child_setup and friends (not epmd: own session)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.beam or self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL) if self.proc else None
        for pid in epmd_pids(self.epmd_port):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
