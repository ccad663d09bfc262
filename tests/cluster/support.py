"""CLUSTER topology as real processes: `gateway namesrv`, `gateway store` nodes and `gateway start
--mode cluster` proxies on ephemeral ports, with short leases, each killed after the test."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.gateway_proc import GatewayError
from conformance.gateway_proc import GatewayProc as Proc

LEASE = ["--lease-period-s", "0.5", "--lease-expiry-s", "2"]


def _ready(proc: Proc, timeout: float = 60) -> dict[str, str]:
    """Wait for the process's ready line; its listeners ({"namesrv"|"store"|protocol: address})."""
    try:
        return proc.wait_ready(timeout)
    except GatewayError as e:
        raise AssertionError(f"{proc.name} did not start: {e}") from None


@dataclass
class Cluster:
    """Name server + store nodes + proxies; `close()` kills whatever is left."""

    root: Path
    procs: list[Proc] = field(default_factory=list)
    namesrv: str = ""
    stores: dict[str, tuple[Proc, str]] = field(default_factory=dict)  # name -> (process, address)
    proxies: list[tuple[Proc, dict[str, str]]] = field(default_factory=list)  # (process, listeners)

    namesrvs: list[tuple[Proc, str]] = field(default_factory=list)  # (process, address)

    def start_namesrv(self) -> str:
        p = Proc(["namesrv", "--port", "0", *LEASE, "--scan-interval-s", "0.2"], "namesrv")
        self.procs.append(p)
        self.namesrv = _ready(p)["namesrv"]
        self.namesrvs.append((p, self.namesrv))
        return self.namesrv

    def start_namesrvs(self, n: int) -> str:
        """`n` name servers; `namesrv` becomes their list ("a;b"), as every process is given it."""
        addrs = [self.start_namesrv() for _ in range(n)]
        self.namesrv = ";".join(addrs)
        return self.namesrv

    def kill_namesrvs(self) -> None:
        """`kill -9` of every name server."""
        for p, _ in self.namesrvs:
            p.kill()

    def restart_namesrvs(self) -> None:
        """Every name server started again, empty, on its own port."""
        procs = []
        for i, (_, addr) in enumerate(self.namesrvs):
            port = addr.rsplit(":", 1)[1]
            p = Proc(["namesrv", "--port", port, *LEASE, "--scan-interval-s", "0.2"], f"namesrv{i}")
            self.procs.append(p)
            procs.append((p, addr))
        for p, _ in procs:
            _ready(p)
        self.namesrvs = procs

    def start_stores(self, *names: str, extra: tuple[str, ...] = (), **proc: Any) -> list[str]:
        """Start store nodes (concurrently); their addresses. `proc`: GatewayProc keywords (`command`,
        `cwd`, `env`: another checkout's store node, say)."""
        procs = []
        for name in names:
            args = ["store", "--data-dir", str(self.root / name), "--port", "0", "--name", name]
            p = Proc([*args, "--namesrv", self.namesrv, *LEASE, "--flush", "async", *extra], name, **proc)
            self.procs.append(p)
            procs.append(p)
        out = []
        for name, p in zip(names, procs, strict=True):
            addr = _ready(p)["store"]
            self.stores[name] = (p, addr)
            out.append(addr)
        return out

    def start_proxies(
        self,
        n: int,
        protocols: str = "grpc,mqtt,remoting,amqp,http",
        *,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        **proc: Any,
    ) -> list[dict[str, str]]:
        """Start `n` proxies (concurrently) with `extra` flags and `env` variables; their listeners.
        `proc`: other GatewayProc keywords (`command`, `cwd`)."""
        procs = [self._spawn_proxy(protocols, extra, env, i, **proc) for i in range(n)]
        return [self._proxy_ready(p) for p in procs]

    def _spawn_proxy(
        self,
        protocols: str,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        i: int = 0,
        **proc: Any,
    ) -> Proc:
        args = ["start", "--mode", "cluster", "--namesrv", self.namesrv, "--protocols", protocols, *LEASE]
        args += ["--route-refresh-s", "0.3", "--auto-create-topics", "--drain-timeout-s", "1"]
        args += ["--data-dir", str(self.root / "proxy-data")]  # must stay unused: proxies hold no data
        for proto in protocols.split(","):
            args += [f"--{proto}-port", "0"]
        p = Proc([*args, *extra], f"proxy{len(self.proxies) + i}", env=env, **proc)
        self.procs.append(p)
        return p

    def _proxy_ready(self, p: Proc) -> dict[str, str]:
        listeners = _ready(p)
        self.proxies.append((p, listeners))
        return listeners

    def output(self) -> str:
        return "\n".join(f"--- {p.name} (exit {p.p.poll()})\n{p.output()}" for p in self.procs)

    def close(self) -> None:
        for p in reversed(self.procs):
            p.kill()


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, what: str = "") -> Any:
    """Poll a cross-process condition until it is truthy (its value) or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or cond}")
        time.sleep(interval)
