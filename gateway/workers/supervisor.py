"""`gateway start --workers N`: one store process, N proxy processes on the same ports.

This process (the supervisor) opens the store under `data_dir` and serves it as a CLUSTER mode store
node on a Unix socket in a private directory (mode 0700, so only this user can connect), keeps the
claims of unique sessions (claims.py), and starts N workers: `gateway start` with the same
arguments plus `--worker-of DIR --worker-index I` and every port made explicit. Each worker is a
proxy over that store node (cluster/proxy.py `open_worker_store`) whose listeners set SO_REUSEPORT,
so the kernel spreads new connections over the workers.

Ports are checked here first, without SO_REUSEPORT, so a port held by another program is refused at
start (exit 1) rather than shared; a port given as 0 is chosen here once for all workers. A worker
that exits while the gateway runs is started again (after a second if it lived less than five):
its clients reconnect to the others meanwhile, and nothing a worker acknowledged is lost, since the
store (which acknowledged it) lives here. SIGTERM/SIGINT stop the workers (each drains), then the
store node and the store; SIGHUP is passed on (TLS reload)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.config import Settings

from .claims import ClaimsBroker

log = logging.getLogger("gateway.workers")

DIR_PREFIX = "gateway-workers-"
PID_FILE = "supervisor.pid"  # in the socket directory: whose it is (stale ones are removed)
STORE_SOCKET = "store.sock"
CLAIMS_SOCKET = "claims.sock"
READY_TIMEOUT_S = 60.0
QUICK_EXIT_S = 5.0  # a worker that exits sooner after its start is restarted after RESTART_DELAY_S
RESTART_DELAY_S = 1.0
PORT_WAIT_S = 5.0  # a taken port is checked again for this long before the gateway gives up


@dataclass(frozen=True)
class WorkerLink:
    """What a worker is told by its supervisor (`--worker-of DIR --worker-index I`)."""

    dir: str
    index: int

    @property
    def store_socket(self) -> str:
        return os.path.join(self.dir, STORE_SOCKET)

    @property
    def claims_socket(self) -> str:
        return os.path.join(self.dir, CLAIMS_SOCKET)


def used_ports(s: Settings) -> dict[str, int]:
    """The port settings the enabled listeners bind ({field: port})."""
    ports = {f"{p}_port": s.port(p) for p in s.protocols}
    if s.tls_cert is not None:
        tls = {"mqtt": "mqtt_tls_port", "amqp": "amqp_tls_port", "http": "https_port"}
        ports.update({tls[p]: getattr(s, tls[p]) for p in s.protocols if p in tls})
    return ports


def resolve_ports(s: Settings, wait_s: float = PORT_WAIT_S) -> dict[str, int]:
    """Every used port, those given as 0 chosen now; OSError (naming the setting) when a port is
    still taken after `wait_s`: checked without SO_REUSEPORT, so a port another program listens
    on is not shared (the wait lets the workers of a gateway just killed exit)."""
    out = {}
    family = socket.AF_INET6 if ":" in s.host else socket.AF_INET
    for field, port in used_ports(s).items():
        deadline = time.monotonic() + wait_s
        while True:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((s.host, port))
                except OSError as e:
                    if e.errno == errno.EADDRINUSE and time.monotonic() < deadline:
                        time.sleep(0.1)
                        continue
                    name = field.removesuffix("_port")
                    raise OSError(f"{name} cannot listen on {s.host}:{port}: {e.strerror}") from e
                out[field] = sock.getsockname()[1]
                break
    return out


def remove_stale_dirs(tmp: str | None = None) -> list[Path]:
    """Remove the socket directories of supervisors that are gone without cleaning up (kill -9):
    this user's `gateway-workers-*` whose pid file names a process that no longer exists (one
    without a pid file may be a starting supervisor's: kept). Returns those removed."""
    removed = []
    for d in Path(tmp or tempfile.gettempdir()).glob(DIR_PREFIX + "*"):
        try:
            if d.stat().st_uid != os.getuid():
                continue
            pid = int((d / PID_FILE).read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        except OSError:
            continue
    return removed


class Supervisor:
    """The store, its node on a Unix socket, the claims broker and the worker processes."""

    def __init__(self, settings: Settings, argv: Sequence[str]) -> None:
        self.settings = settings
        self.argv = list(argv)  # the `gateway start ...` arguments the workers get too
        self.count = settings.workers
        for d in remove_stale_dirs():
            log.info("removed %s, left by a supervisor that is gone", d)
        self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))  # 0700
        (self.dir / PID_FILE).write_text(str(os.getpid()))
        self.store = None
        self.node = None
        self.claims = ClaimsBroker(on_ready=self._on_ready)
        self.ports: dict[str, int] = {}
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.started_at: dict[int, float] = {}
        self.restarts = 0
        self.stopping = False
        self._ready: set[int] = set()
        self._all_ready = asyncio.Event()
        self._watchers: set[asyncio.Task] = set()

    def _on_ready(self, index: int) -> None:
        self._ready.add(index)
        if len(self._ready) >= self.count:
            self._all_ready.set()

    async def start(self) -> None:
        """Open the store and serve it (LOCAL mode), start the workers and wait until every one is
        ready; StartupError (one line) when something cannot start."""
        from gateway.server import StartupError

        try:
            await self._start()
        except (OSError, RuntimeError) as e:
            raise StartupError(str(e)) from e

    async def _start(self) -> None:
        s = self.settings
        self.ports = resolve_ports(s)
        await self.claims.start(str(self.dir / CLAIMS_SOCKET))
        if s.mode == "local":
            await self._open_store()
        for i in range(1, self.count + 1):
            await self._spawn(i)
        await self._wait_ready()

    async def _open_store(self) -> None:
        """The store under `data_dir`, served on the Unix socket STORE_SOCKET."""
        from cluster.proxy import WORKER_NODE
        from cluster.store_node import StoreNode, StoreNodeConfig
        from gateway.part_configs import store_config
        from gateway.server import shutdown_signals_blocked
        from store import Store, StoreError

        s = self.settings
        t0 = time.monotonic()
        try:
            with shutdown_signals_blocked():
                self.store = await Store.open(store_config(s))
        except (StoreError, OSError) as e:
            raise RuntimeError(f"cannot open the store at {s.data_dir}: {e}") from e
        log.info("store opened at %s (flush=%s) in %.2f s", s.data_dir, s.flush, time.monotonic() - t0)
        self.store.preallocate()
        config = StoreNodeConfig(
            name=WORKER_NODE, max_body_size=s.largest_body_size, unix_path=str(self.dir / STORE_SOCKET)
        )
        self.node = StoreNode(config, self.store)
        await self.node.start()

    async def _wait_ready(self) -> None:
        waiting = asyncio.ensure_future(self._all_ready.wait())
        exits = [asyncio.ensure_future(p.wait()) for p in self.procs.values()]
        done, _ = await asyncio.wait(
            [waiting, *exits], timeout=READY_TIMEOUT_S, return_when="FIRST_COMPLETED"
        )
        for f in (waiting, *exits):
            f.cancel()
        if not self._all_ready.is_set():
            failed = [i for i, p in self.procs.items() if p.returncode is not None]
            why = f"worker {failed[0]} exited" if failed else f"not ready after {READY_TIMEOUT_S:.0f} s"
            raise RuntimeError(f"the workers did not start: {why}")
        for i in self.procs:
            self._watch(i)

    def _command(self, index: int) -> list[str]:
        flags = [f"--{f.replace('_', '-')}={p}" for f, p in self.ports.items()]
        return [
            sys.executable,
            "-m",
            "gateway.cli",
            *self.argv,
            *flags,
            "--workers=1",
            f"--worker-of={self.dir}",
            f"--worker-index={index}",
        ]

    async def _spawn(self, index: int) -> None:
        proc = await asyncio.create_subprocess_exec(*self._command(index))
        self.procs[index] = proc
        self.started_at[index] = time.monotonic()
        log.info("worker %d started (pid %d)", index, proc.pid)

    def _watch(self, index: int) -> None:
        t = asyncio.ensure_future(self._keep_running(index))
        self._watchers.add(t)
        t.add_done_callback(self._watchers.discard)

    async def _keep_running(self, index: int) -> None:
        """Start worker `index` again whenever it exits while the gateway runs."""
        while not self.stopping:
            proc = self.procs[index]
            code = await proc.wait()
            if self.stopping:
                return
            lived = time.monotonic() - self.started_at[index]
            log.warning("worker %d (pid %d) exited with code %s: starting another", index, proc.pid, code)
            self._ready.discard(index)
            if lived < QUICK_EXIT_S:
                await asyncio.sleep(RESTART_DELAY_S)
            if self.stopping:
                return
            self.restarts += 1
            await self._spawn(index)

    def signal_workers(self, sig: signal.Signals) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    async def stop(self) -> None:
        """Stop the workers (SIGTERM, each drains; SIGKILL after drain_timeout_s + 5 s), then the
        store node and the store."""
        self.stopping = True
        for t in list(self._watchers):
            t.cancel()
        self.signal_workers(signal.SIGTERM)
        waits = [p.wait() for p in self.procs.values() if p.returncode is None]
        if waits:
            try:
                await asyncio.wait_for(asyncio.gather(*waits), self.settings.drain_timeout_s + 5.0)
            except TimeoutError:
                log.warning("workers still running after the drain timeout: killed")
                self.signal_workers(signal.SIGKILL)
                await asyncio.gather(*(p.wait() for p in self.procs.values()))
        await self.claims.close()
        if self.node is not None:
            await self.node.stop(self.settings.drain_timeout_s)
        if self.store is not None:
            store, self.store = self.store, None
            await store.close()
            log.info("store closed")
        shutil.rmtree(self.dir, ignore_errors=True)


async def supervise(settings: Settings, argv: Sequence[str]) -> int:
    """Run the store and `settings.workers` workers until SIGTERM/SIGINT; the exit code (0 after a
    clean stop, 1 when the gateway could not start)."""
    from gateway.server import serve_until_signal

    sup = Supervisor(settings, argv)

    def ready() -> None:
        pids = ", ".join(str(p.pid) for p in sup.procs.values())
        log.info("gateway ready: %d workers (pids %s)", sup.count, pids)

    return await serve_until_signal(sup, ready=ready, on_hup=lambda: sup.signal_workers(signal.SIGHUP))


__all__ = ["Supervisor", "supervise"]
