"""What the benchmarks share: progress logging, the servers under test as processes (`Server`, the
gateway started through conformance/gateway_proc.py), and what they read about processes and the
machine from /proc.

Servers are started pinned to one CPU (`taskset -c CPU`, or `sched_setaffinity` when taskset is
missing) with RLIMIT_NOFILE raised to its hard limit, stdout and stderr in `<workdir>/<name>.log`.
A server that cannot start raises `ServerError` with the tail of its log.

- `start_gateway`: `gateway start --data-dir <workdir>/data --protocols P[,http] --P-port N
  [--http-port M] <extra args>` on free ports (the `gateway` console script of this venv, or
  `python [-m cProfile -o FILE] -m gateway.cli` with PYTHONPATH=`src` for `--gateway-src` /
  `--gateway-profile`), ready when it logged `gateway ready` and `GET /healthz` answers 200.
- `spawn_gateway`: any `gateway` subcommand (`namesrv`, `store`, `start`), ready on its ready line
  (and /healthz, given the HTTP port).
- `self_signed_cert`: a certificate and key made by the `openssl` CLI for the TLS runs.

Process figures come from /proc: utime+stime of /proc/<pid>/stat (CPU seconds, clock-tick
resolution), VmRSS of /proc/<pid>/status, the machine's busy and steal time of /proc/stat.

Scripts run as `python bench/x.py`, so their directory is importable: `from common import ...`.
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

from conformance.gateway_proc import READY_LINES, GatewayError, GatewayProc

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    """A progress line on stderr (stdout is for the results), with the wall-clock time."""
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    print(f"{stamp} {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- servers


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
        """SIGTERM, SIGKILL after `timeout` s; then its descendants still running (the workers of
        a gateway whose supervisor was killed) are stopped the same way."""
        kids = descendants(self.proc.pid) if self.proc.poll() is None else []
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            kids = [k for k in kids if os.path.exists(f"/proc/{k}")]
            for k in kids:
                with contextlib.suppress(OSError):
                    os.kill(k, sig)
            deadline = time.monotonic() + 10
            while kids and time.monotonic() < deadline and any(os.path.exists(f"/proc/{k}") for k in kids):
                time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_preexec(cpu: int | str | None) -> Callable[[], None]:
    """What a server process runs before exec: RLIMIT_NOFILE to its hard limit, and the CPU
    affinity when there is no taskset to pin it (`cpu`: one CPU, or a list such as "0,1")."""

    def fn() -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        if cpu is not None and shutil.which("taskset") is None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, {int(c) for c in str(cpu).split(",")})

    return fn


def pin(cmd: list[str], cpu: int | str | None) -> list[str]:
    """`cmd` run through `taskset -c CPU` (when there is a CPU, or a list such as "0,1", and a taskset)."""
    taskset = shutil.which("taskset")
    return [taskset, "-c", str(cpu), *cmd] if cpu is not None and taskset else cmd


def spawn(
    name: str, cmd: list[str], workdir: Path, cpu: int | None, env: dict[str, str] | None = None, cwd=None
) -> tuple[subprocess.Popen, Path]:
    """Start a (non-gateway) server: pinned, stdout and stderr into `<workdir>/<name>.log`."""
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            pin(cmd, cpu),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=server_preexec(cpu),
            env=env,
            cwd=cwd,
        )
    return proc, log_path


def tcp_ready(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", port))
            return True
        except OSError:
            return False


def healthz_ok(port: int) -> bool:
    """`GET http://127.0.0.1:PORT/healthz` answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def wait_ready(server: Server, ready: Callable[[], bool], timeout: float) -> Server:
    """Poll `ready()` until true; ServerError if the server exits or `timeout` s pass (stopped)."""
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


def gateway_flag(args: list[str], name: str) -> str:
    """The value of `gateway` flag `name` in `args`, else of its GATEWAY_* variable, else the default."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    env = os.environ.get("GATEWAY_" + name.lstrip("-").replace("-", "_").upper())
    return env or "sync (default)"


def spawn_gateway(
    name: str,
    args: list[str],
    workdir: Path,
    port: int,
    *,
    cpu: int | str | None = None,
    src: Path | None = None,
    profile: Path | None = None,
    cwd: Path | None = None,
    http_port: int | None = None,
    ready_line: bool = True,
    timeout: float = 60.0,
    server_cls: type[Server] = Server,
) -> Server:
    """Start `gateway <args>` (args[0]: start, store or namesrv) as server `name` listening on `port`:
    the console script of this venv in `cwd` (None: this process's), or `python [-m cProfile -o
    profile] -m gateway.cli` with PYTHONPATH and cwd `src` (default the repository) when `src` or
    `profile` is given or there is no script. Its environment is this process's, GATEWAY_*
    variables included. Ready on its subcommand's ready line (unless not `ready_line`) and then,
    with `http_port`, when GET /healthz answers 200. `info["command"]` is the command line (unpinned)."""
    env: dict[str, str] = {}
    script = Path(sys.executable).parent / "gateway"
    if src is not None or profile is not None or not script.exists():
        env["PYTHONPATH"] = str(src or REPO)
        cwd = src or REPO
        prof = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
        cmd = [sys.executable, *prof, "-m", "gateway.cli"]
    else:
        cmd = [str(script)]
    gw = GatewayProc(
        args,
        name,
        env=env,
        keep_gateway_env=True,
        log_path=workdir / f"{name}.log",
        command=pin(cmd, cpu),
        cwd=cwd,
        preexec_fn=server_preexec(cpu),
    )
    assert gw.log_path is not None
    server = server_cls(name, gw.p, port, workdir, gw.log_path)
    server.info = {"command": " ".join([*cmd, *args])}
    try:
        gw.wait_ready(
            timeout,
            ready_line=READY_LINES[args[0]] if ready_line else None,
            healthz=f"http://127.0.0.1:{http_port}" if http_port else False,
            errors=False,
        )
    except GatewayError as e:
        raise ServerError(str(e)) from None
    return server


def start_gateway(
    workdir: Path,
    protocol: str,
    extra_args: list[str] | tuple[str, ...] = (),
    *,
    cpu: int | str | None = None,
    src: Path | None = None,
    profile: Path | None = None,
    timeout: float = 60.0,
    ready: Callable[[int], bool] | None = None,
    ready_line: bool = True,
    cwd: Path | None = None,
    server_cls: type[Server] = Server,
    info_src: bool = True,
) -> Server:
    """Our gateway serving `protocol` (mqtt, amqp or http; with http for /healthz) on free ports,
    data in `<workdir>/data`, `extra_args` appended (see `spawn_gateway` for `cpu`, `src`, `profile`,
    `cwd`, `ready_line`). `ready(port)`: a further readiness check of the protocol's port.
    `server.port` is the protocol's port; `info` has `command`, `src` (unless not `info_src`) and
    `flush`."""
    port = free_port()
    args = ["start", "--data-dir", str(workdir / "data")]
    if protocol == "http":
        http_port = port
        args += ["--protocols", "http", "--http-port", str(port)]
    else:
        http_port = free_port()
        args += ["--protocols", f"{protocol},http", f"--{protocol}-port", str(port)]
        args += ["--http-port", str(http_port)]
    args += extra_args
    server = spawn_gateway(
        "gateway",
        args,
        workdir,
        port,
        cpu=cpu,
        src=src,
        profile=profile,
        cwd=cwd,
        http_port=http_port,
        ready_line=ready_line,
        timeout=timeout,
        server_cls=server_cls,
    )
    if ready is not None:
        wait_ready(server, lambda: ready(port), timeout)
    if info_src:
        server.info["src"] = str(src or REPO)
    server.info["flush"] = gateway_flag(list(extra_args), "--flush")
    return server


def self_signed_cert(directory: Path, days: int = 2) -> tuple[Path, Path]:
    """A fresh self-signed EC P-256 certificate for `localhost` and 127.0.0.1 (`openssl req -x509`)
    written to `directory` as (cert.pem, key.pem): what the TLS runs' servers serve and their
    clients trust. Generated per run, so no key is ever committed. ServerError without openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServerError("openssl not found (Debian package openssl)")
    cert, key = directory / "cert.pem", directory / "key.pem"
    cmd = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    cmd += ["-nodes", "-days", str(days), "-subj", "/CN=localhost"]
    cmd += ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        raise ServerError(f"openssl req failed: {out.stderr.strip()[-500:]}")
    return cert, key


# ---------------------------------------------------------------------------- /proc readers


def cpu_s(pid: int) -> float:
    """utime + stime of one process (all its threads), seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def run_s(pid: int) -> float:
    """Time on CPU of one process's live threads, seconds, to the nanosecond (/proc/PID/task/*/schedstat).

    Clock ticks (`cpu_s`) count 10 ms at a time, too coarse for a quiet server over a short window
    (40 Mosquitto messages cost about 0.5 ms). Threads that exit inside the window are not counted, so
    use this over windows in which the server's threads stay put; falls back to `cpu_s` without schedstat.
    """
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return cpu_s(pid)
    return total / 1e9


def system_busy_s() -> float:
    """Busy CPU seconds of the whole machine (all CPUs) from /proc/stat: everything but idle and iowait."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def cpu_ticks() -> tuple[int, int]:
    """(steal, all) CPU ticks of the whole machine so far, from /proc/stat; (0, 0) elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return 0, 0
    return fields[7], sum(fields)


def steal_since(start: tuple[int, int]) -> float:
    """Share of all CPU time since `start` (a `cpu_ticks()`) that the hypervisor gave to other guests."""
    steal, total = cpu_ticks()
    return round((steal - start[0]) / max(total - start[1], 1), 3)


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


def wait_idle(
    pid: int,
    max_wait: float = 10.0,
    interval: float = 0.1,
    max_ticks: int = 1,
    quiet: float = 0.0,
    kids: list[int] | None = None,
) -> float:
    """Wait until the process (with `kids`, it and those descendants: `tree_cpu_s`) used at most
    `max_ticks` clock ticks in one `interval` (with `quiet`, in every interval of `quiet` seconds in
    a row: past the periodic housekeeping a server does after a burst, such as a garbage
    collection); return the seconds from the call to the start of that idle stretch (capped at
    `max_wait`)."""

    def used() -> float:
        return tree_cpu_s(pid, kids) if kids else cpu_s(pid)

    start = time.monotonic()
    prev_t, prev_c = start, used()
    idle_since: float | None = None
    while True:
        time.sleep(interval)
        t, c = time.monotonic(), used()
        if (c - prev_c) * CLK_TCK <= max_ticks + 1e-9:
            if idle_since is None:
                idle_since = prev_t
            if t - idle_since >= quiet:
                return idle_since - start
        else:
            idle_since = None
        if t - start >= max_wait:
            return t - start
        prev_t, prev_c = t, c


def fs_type(path: Path) -> str:
    """The type of the filesystem holding `path` (df), or "?"."""
    try:
        out = subprocess.run(["df", "--output=fstype", str(path)], capture_output=True, text=True, timeout=5)
        parts = out.stdout.split()
        return parts[-1] if parts else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


# ---------------------------------------------------------------------------- figures


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


# ----------------------------------------------------------------------------- auth-on runs
def policy_toml(rules: list[tuple[str, str, str, str]]) -> str:
    """ACL rules (subject, topic pattern, comma list of actions, allow|deny) as the policy file that
    `POST /admin/acl/import` takes (docs/security.md)."""
    out = []
    for subject, pattern, actions, effect in rules:
        acts = ", ".join(f'"{a}"' for a in actions.split(","))
        out.append(
            f'[[rules]]\nsubject = "{subject}"\nkind = "topic"\npattern = "{pattern}"\n'
            f'actions = [{acts}]\neffect = "{effect}"\n'
        )
    return "\n".join(out)


def admin_call(base: str, password: str, path: str, body: bytes, ctype: str, timeout: float = 60) -> Any:
    """One POST to a gateway's admin API as its bootstrap admin (HTTP Basic); the JSON answer."""
    import base64
    import json
    import urllib.request

    req = urllib.request.Request(base + path, data=body, method="POST")
    req.add_header("Content-Type", ctype)
    req.add_header("Authorization", "Basic " + base64.b64encode(f"admin:{password}".encode()).decode())
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - the bench's own gateway
        return json.loads(r.read() or b"null")
