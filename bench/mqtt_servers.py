"""Brokers under test for bench/mqtt_bench.py, and what the bench reads about their processes.

Each `start_*` function writes what the broker needs into a fresh work directory, starts it pinned
to one CPU (`taskset -c CPU`, or `sched_setaffinity` when taskset is missing) with RLIMIT_NOFILE
raised to its hard limit, waits until it accepts MQTT connections and returns a `Server`. A broker
that cannot start raises `ServerError` with the tail of its log.

- `gateway`: `.venv/bin/gateway start --data-dir <tmp> --protocols mqtt,http --mqtt-port P
  --http-port Q` (or `python -m gateway.cli` from `--gateway-src`), ready when it logged
  `gateway ready` and `GET /healthz` answers 200. Default settings: flush policy `sync`.
- `mosquitto`: /usr/sbin/mosquitto with a config that never drops QoS 1 messages for slow
  subscribers (`max_queued_messages 0`, `max_queued_bytes 0`, `max_inflight_messages 0`), anonymous,
  no persistence, TCP_NODELAY on, only errors and warnings logged.
- `amqtt`: the `amqtt` console script next to this interpreter with a YAML config (amqtt 0.12
  `BrokerConfig`: a `default` tcp listener on 127.0.0.1:P, unlimited connections, only
  `AnonymousAuthPlugin` with `allow_anonymous: true`, so no $SYS publishing or packet logging).

Process figures come from /proc: utime+stime of /proc/<pid>/stat (CPU seconds, clock-tick
resolution), VmRSS of /proc/<pid>/status.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MOSQUITTO = "/usr/sbin/mosquitto"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class ServerError(RuntimeError):
    pass


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    port: int
    workdir: Path
    log_path: Path
    info: dict[str, object] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# ---------------------------------------------------------------------------- /proc readers


def cpu_s(pid: int) -> float:
    """utime + stime of one process (all its threads), seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def system_busy_s() -> float:
    """Busy CPU seconds of the whole machine (all CPUs) from /proc/stat: everything but idle and iowait."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def wait_quiet(max_wait: float, max_cpus: float = 0.3, interval: float = 0.3) -> float:
    """Wait (at most `max_wait` s) until the whole machine used less than `max_cpus` CPUs over one
    `interval` (other jobs on a shared machine disturb the figures); return the seconds waited."""
    start = time.monotonic()
    while True:
        b0 = system_busy_s()
        time.sleep(interval)
        if (system_busy_s() - b0) / interval < max_cpus:
            return time.monotonic() - start - interval
        if time.monotonic() - start >= max_wait:
            return time.monotonic() - start


def descendants(pid: int) -> list[int]:
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                parent[int(d)] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out.extend(kids)
        todo.extend(kids)
    return out


def tree_cpu_s(pid: int, kids: list[int]) -> float:
    """CPU seconds of `pid` plus the live descendants `kids` (e.g. the gateway's fsync helper)."""
    total = cpu_s(pid)
    for k in kids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += cpu_s(k)
    return total


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise ServerError(f"no VmRSS for pid {pid}")


def wait_idle(pid: int, max_wait: float = 10.0, interval: float = 0.1, max_ticks: int = 1) -> float:
    """Wait until the process used at most `max_ticks` clock ticks in one `interval`; return the
    seconds from the call to the start of that idle interval (capped at `max_wait`)."""
    start = time.monotonic()
    prev_t, prev_c = start, cpu_s(pid)
    while True:
        time.sleep(interval)
        t, c = time.monotonic(), cpu_s(pid)
        if (c - prev_c) * CLK_TCK <= max_ticks + 1e-9:
            return prev_t - start
        if t - start >= max_wait:
            return t - start
        prev_t, prev_c = t, c


# ---------------------------------------------------------------------------- starting brokers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _preexec(cpu: int | None) -> Callable[[], None]:
    def fn() -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        if cpu is not None and shutil.which("taskset") is None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, {cpu})

    return fn


def _pin(cmd: list[str], cpu: int | None) -> list[str]:
    taskset = shutil.which("taskset")
    return [taskset, "-c", str(cpu), *cmd] if cpu is not None and taskset else cmd


def _spawn(
    name: str, cmd: list[str], workdir: Path, cpu: int | None, env: dict[str, str] | None = None, cwd=None
) -> tuple[subprocess.Popen, Path]:
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            _pin(cmd, cpu),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_preexec(cpu),
            env=env,
            cwd=cwd,
        )
    return proc, log_path


def _tcp_ready(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _wait(server: Server, ready: Callable[[], bool], timeout: float) -> Server:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.alive():
            raise ServerError(
                f"{server.name} exited with status {server.proc.returncode}:\n{server.log_tail()}"
            )
        if ready():
            return server
        time.sleep(0.05)
    server.stop()
    raise ServerError(f"{server.name} not ready after {timeout:.0f} s:\n{server.log_tail()}")


def start_gateway(
    workdir: Path,
    cpu: int | None,
    extra_args: list[str],
    src: Path | None = None,
    profile: Path | None = None,
    timeout: float = 60.0,
) -> Server:
    """Start `gateway start` (the console script of this venv, or `python -m gateway.cli` with
    PYTHONPATH=`src`); with `profile`, under `python -m cProfile -o profile` (written when the
    gateway exits on SIGTERM)."""
    port, http_port = free_port(), free_port()
    args = [
        "start",
        "--data-dir",
        str(workdir / "data"),
        "--protocols",
        "mqtt,http",
        "--mqtt-port",
        str(port),
        "--http-port",
        str(http_port),
        *extra_args,
    ]
    env = dict(os.environ)
    cwd = None
    script = Path(sys.executable).parent / "gateway"
    if src is not None or profile is not None or not script.exists():
        env["PYTHONPATH"] = str(src or REPO)
        cwd = str(src or REPO)
        prof = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
        cmd = [sys.executable, *prof, "-m", "gateway.cli", *args]
    else:
        cmd = [str(script), *args]
    proc, log_path = _spawn("gateway", cmd, workdir, cpu, env, cwd)
    server = Server("gateway", proc, port, workdir, log_path)
    server.info = {"command": " ".join(cmd), "src": str(src or REPO), "flush": _flag(extra_args, "--flush")}

    def ready() -> bool:
        if b"gateway ready" not in log_path.read_bytes():
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    return _wait(server, ready, timeout)


def _flag(args: list[str], name: str) -> str:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    env = os.environ.get("GATEWAY_" + name.lstrip("-").replace("-", "_").upper())
    return env or "sync (default)"


MOSQUITTO_CONF = """\
listener {port} 127.0.0.1
allow_anonymous true
persistence false
# never drop QoS 1 messages for slow subscribers; no in-flight cap per client
max_queued_messages 0
max_queued_bytes 0
max_inflight_messages 0
max_inflight_bytes 0
set_tcp_nodelay true
connection_messages false
log_dest stderr
log_type error
log_type warning
"""


def start_mosquitto(workdir: Path, cpu: int | None, timeout: float = 20.0) -> Server:
    if not os.access(MOSQUITTO, os.X_OK):
        raise ServerError(f"{MOSQUITTO} not found (make install-system installs Debian mosquitto)")
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(MOSQUITTO_CONF.format(port=port))
    proc, log_path = _spawn("mosquitto", [MOSQUITTO, "-c", str(conf)], workdir, cpu)
    server = Server("mosquitto", proc, port, workdir, log_path)
    try:
        out = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True, timeout=5).stdout
        server.info["version"] = out.splitlines()[0] if out else "?"
    except (OSError, subprocess.SubprocessError):
        server.info["version"] = "?"
    server.info["config"] = str(conf)
    return _wait(server, lambda: _tcp_ready(port), timeout)


AMQTT_CONF = """\
listeners:
  default:
    type: tcp
    bind: 127.0.0.1:{port}
    max_connections: 0
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: true
"""


def start_amqtt(workdir: Path, cpu: int | None, timeout: float = 30.0) -> Server:
    script = Path(sys.executable).parent / "amqtt"
    if not script.exists():
        raise ServerError(f"{script} not found (amqtt is a dev dependency: make install)")
    port = free_port()
    conf = workdir / "amqtt.yaml"
    conf.write_text(AMQTT_CONF.format(port=port))
    proc, log_path = _spawn("amqtt", [str(script), "-c", str(conf)], workdir, cpu)
    server = Server("amqtt", proc, port, workdir, log_path)
    try:
        from importlib.metadata import version

        server.info["version"] = f"amqtt {version('amqtt')}"
    except Exception:  # noqa: BLE001
        server.info["version"] = "amqtt ?"
    server.info["config"] = str(conf)
    return _wait(server, lambda: _tcp_ready(port), timeout)


# ---------------------------------------------------------------------------- shared by the benches
def sleep_until(t: float) -> None:
    """Sleep until monotonic time `t` (no-op if it has passed)."""
    d = t - time.monotonic()
    if d > 0:
        time.sleep(d)


def pct_ms(sorted_ns: list[int], p: float) -> float | None:
    """The p-th percentile (nearest rank) of sorted nanosecond samples, in ms; None if empty."""
    if not sorted_ns:
        return None
    i = min(len(sorted_ns) - 1, max(0, math.ceil(p / 100 * len(sorted_ns)) - 1))
    return sorted_ns[i] / 1e6


def fmt(v: Any) -> str:
    """A figure for the benches' tables: thousands separators for big numbers, 2-3 digits else."""
    if v is None:
        return "-"
    if isinstance(v, float):
        if v >= 100_000:
            return f"{v:,.0f}"
        if v >= 100:
            return f"{v:.0f}"
        if v >= 10:
            return f"{v:.1f}"
        if v >= 1 or v == 0:
            return f"{v:.2f}"
        return f"{v:.2g}"
    return str(v)
