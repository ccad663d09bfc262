"""Generator processes for bench/scale_bench.py `--gen-procs N`: the idle fleet spread over N
child processes, so that it is not bounded by one process's descriptor limit.

Child k of N (this file run as a script, its settings one JSON argument) holds the devices
`i ≡ k (mod N)` of the fleet, `dev-<i>` as in the single-process idle phase, bound to its own
loopback source addresses (`sources(k)`: 127.0.0.(2+8k) ... 127.0.0.(9+8k)). It answers one JSON
line on stdout for each command line on stdin:

- `connect`: open its share (at most `concurrency` handshakes at once): `t0`/`t1` (monotonic
  seconds, one clock for all processes), `conns`, `persistent`.
- `subscribe`: each device subscribes (QoS 1) to `dev/<i>/cmd`: `t0`/`t1` (meanwhile a progress
  line on stderr every 30 s: how many have their SUBACK).
- `deliveries`: the PUBLISHes its devices received since the last call, `[index, topic, seq,
  latency ns]` each (from the stamped payload, bench/scale_client.py `stamp`).
- `close`: DISCONNECT every device, wait until their sockets are closed, exit.

A failure answers `{"error": ...}` and exits 1. `GenPool` is the parent's side: it starts the
children, sends each command to all of them and collects their answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MAX_PROCS = 30  # 8 source addresses each within 127.0.0.2 ... 127.0.0.241


def sources(k: int) -> list[str]:
    """The loopback source addresses of child `k`."""
    return [f"127.0.0.{2 + 8 * k + j}" for j in range(8)]


def share_items(k: int, n: int, conns: int, persistent_share: float) -> list[tuple[int, str, bool]]:
    """(index, client id, clean) of child `k`'s devices, as the single-process idle phase has them."""
    pct = int(round(persistent_share * 100))
    return [(i, f"dev-{i}", (i % 100) >= pct) for i in range(k, conns, n)]


async def report_subacks(k: int, fleet: list[Any], every: float = 30.0) -> None:
    """A progress line on stderr every `every` s: how many of the fleet have their SUBACK."""
    t0 = time.monotonic()
    while True:
        await asyncio.sleep(every)
        done = sum(c.suback.done() for c in fleet)
        stamp = time.strftime("%H:%M:%S")
        print(
            f"{stamp}   generator {k}: {done}/{len(fleet)} subscribed after {time.monotonic() - t0:.0f} s",
            file=sys.stderr,
            flush=True,
        )


async def child(cfg: dict[str, Any]) -> int:
    """Serve the commands of the module docstring on stdin/stdout for one share of the fleet."""
    from scale_client import Conn, open_many, subscribe_all, unstamp

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    fleet: list[Conn] = []
    records: list[list[Any]] = []

    def sink(c: Conn, topic: bytes, payload: bytes, retain: bool, now: int) -> None:
        t, seq = unstamp(payload)
        records.append([c.index, topic.decode(), seq, now - t])

    def answer(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    answer({"pid": os.getpid()})
    timeout = cfg["timeout"]
    while line := await reader.readline():
        op = json.loads(line)["op"]
        try:
            t0 = time.monotonic()
            if op == "connect":
                items = share_items(cfg["k"], cfg["n"], cfg["conns"], cfg["persistent_share"])
                fleet = await open_many(
                    cfg["host"], cfg["port"], items, cfg["concurrency"], timeout, sources(cfg["k"])
                )
                for c in fleet:
                    c.sink = sink
                p = sum(c.persistent for c in fleet)
                answer({"t0": t0, "t1": time.monotonic(), "conns": len(fleet), "persistent": p})
            elif op == "subscribe":
                progress = asyncio.ensure_future(report_subacks(cfg["k"], fleet))
                try:  # through --workers 4, 72,000 devices subscribe at a few dozen per second
                    await subscribe_all(fleet, lambda c: f"dev/{c.index}/cmd", 120 + len(fleet) / 5)
                finally:
                    progress.cancel()
                answer({"t0": t0, "t1": time.monotonic()})
            elif op == "deliveries":
                answer({"records": records})
                records = []
            elif op == "close":
                open_ = [c for c in fleet if not c.closed]
                for c in open_:
                    c.disconnect()
                await asyncio.wait_for(asyncio.gather(*(c.lost for c in open_)), 30)
                answer({"closed": len(open_)})
                return 0
        except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the run
            answer({"error": f"{op}: {type(e).__name__}: {e}"})
            return 1
    return 0


class GenPool:
    """The parent's side: `n` children of this script over one server's port."""

    def __init__(self, host: str, port: int, n: int, conns: int, persistent_share: float, concurrency: int):
        self.cfgs = [
            {
                "host": host,
                "port": port,
                "k": k,
                "n": n,
                "conns": conns,
                "persistent_share": persistent_share,
                "concurrency": max(1, concurrency // n),
                "timeout": 60 + conns / n / 200,
            }
            for k in range(n)
        ]
        self.procs: list[asyncio.subprocess.Process] = []
        self.pids: list[int] = []
        self.broken = False  # a call failed

    async def start(self) -> None:
        """Start the children (they inherit this process's CPU affinity and descriptor limit)."""
        here = Path(__file__).resolve()
        for cfg in self.cfgs:
            p = await asyncio.create_subprocess_exec(
                sys.executable,
                str(here),
                json.dumps(cfg),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=1 << 26,
                cwd=str(here.parent),
            )
            self.procs.append(p)
        hello = await asyncio.gather(*(self._read(p, 60) for p in self.procs))
        self.pids = [h["pid"] for h in hello]

    async def _read(self, p: asyncio.subprocess.Process, timeout: float) -> dict[str, Any]:
        assert p.stdout is not None
        line = await asyncio.wait_for(p.stdout.readline(), timeout)
        if not line:
            raise ConnectionError(f"generator {p.pid} exited (status {await p.wait()})")
        out = json.loads(line)
        if "error" in out:
            raise ConnectionError(f"generator {p.pid}: {out['error']}")
        return out

    async def call(self, op: str, timeout: float = 1200.0, procs: list | None = None) -> list[dict[str, Any]]:
        """Send `op` to every child (or those of `procs`); their answers, in order."""
        procs = self.procs if procs is None else procs
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps({"op": op}).encode() + b"\n")
        reads = [asyncio.ensure_future(self._read(p, timeout)) for p in procs]
        try:
            return list(await asyncio.gather(*reads))
        except BaseException:
            self.broken = True  # answers may be pending: the children are killed at close
            for r in reads:
                r.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
            raise

    async def close(self) -> None:
        """`close` to the children, then wait for them (killed when they do not exit, or at once
        after a failed call)."""
        live = [p for p in self.procs if p.returncode is None]
        if not live:
            return
        if self.broken:
            for p in live:
                p.kill()
        else:
            with contextlib.suppress(ConnectionError, TimeoutError, OSError):
                await self.call("close", 60, live)
        for p in live:
            try:
                await asyncio.wait_for(p.wait(), 10)
            except TimeoutError:
                p.kill()
                await p.wait()


if __name__ == "__main__":
    import uvloop

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(uvloop.run(child(json.loads(sys.argv[1]))))
