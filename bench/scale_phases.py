"""The MQTT phases of bench/scale_bench.py against one server (see its docstring for what each
measures). `Run` holds the server, the options and the fleet of device connections; each phase
is an async method returning flat figures (`<phase>_host_steal` and `<phase>_other_util`
included, from `Window`). Every wait is bounded; a loss, a duplicate or a refused connection is
counted, never hidden."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import time
from typing import Any

from common import (
    Server,
    ServerError,
    cpu_ticks,
    descendants,
    log,
    pct_ms,
    steal_since,
    system_busy_s,
    tree_cpu_s,
    wait_idle,
)
from scale_client import Conn, Publisher, open_conn, open_many, stamp, subscribe_all, unstamp, wait_for
from scale_gen import GenPool

HOST = "127.0.0.1"
KIB = 1024
MIN_LOAD_S = 0.5


def proc_mem(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) of a process in bytes."""
    vals = {"VmRSS:": 0, "RssAnon:": 0}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0] + ":"
            if key in vals:
                vals[key] = int(line.split()[1]) * KIB
    return vals["VmRSS:"], vals["RssAnon:"]


def fd_count(pid: int) -> int:
    """Open descriptors of a process (0 once it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def tree_mem(pid: int, kids: list[int]) -> tuple[int, int, dict[int, tuple[int, int]]]:
    """(VmRSS, RssAnon) summed over `pid` and its descendants `kids` (the gateway's supervisor,
    workers and helpers), and per process (VmRSS, descriptors)."""
    rss = anon = 0
    each: dict[int, tuple[int, int]] = {}
    for p in [pid, *kids]:
        try:
            r, a = proc_mem(p)
        except OSError:
            continue
        rss, anon = rss + r, anon + a
        each[p] = (r, fd_count(p))
    return rss, anon, each


class Window:
    """A measured window: server CPU (the process and its children), this generator's CPU, what
    everything else on the machine used (`other_util`, in CPUs) and the hypervisor's steal."""

    def __init__(self, server: Server, gens: list[int] | None = None) -> None:
        self.pid = server.pid
        self.kids = descendants(server.pid)
        self.gens = gens or []  # generator child processes (--gen-procs)
        self.t0 = time.monotonic()
        self.ticks = cpu_ticks()
        self.sys0 = system_busy_s()
        self.srv0 = tree_cpu_s(self.pid, self.kids)
        self.gen0 = self.gen_cpu()

    def gen_cpu(self) -> float:
        return tree_cpu_s(os.getpid(), self.gens)

    def stop(self, phase: str) -> dict[str, Any]:
        """End the window: `figures` (duration, server and generator CPU s) and the load figures.
        The machine's load is measured over at least `MIN_LOAD_S` (a shorter window is below the
        clock-tick resolution of /proc/stat), so a short phase waits out the rest."""
        dur = max(time.monotonic() - self.t0, 1e-6)
        self.figures = {
            "duration_s": dur,
            "server_cpu_s": tree_cpu_s(self.pid, self.kids) - self.srv0,
            "gen_cpu_s": self.gen_cpu() - self.gen0,
        }
        if dur < MIN_LOAD_S:
            time.sleep(MIN_LOAD_S - dur)
        dur = time.monotonic() - self.t0
        srv = tree_cpu_s(self.pid, self.kids) - self.srv0
        gen = self.gen_cpu() - self.gen0
        other = max(0.0, system_busy_s() - self.sys0 - srv - gen) / dur
        return {f"{phase}_other_util": round(other, 3), f"{phase}_host_steal": steal_since(self.ticks)}


def _r(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)


class Run:
    """One server under test and the device connections the phases share."""

    def __init__(self, server: Server, args: argparse.Namespace) -> None:
        self.server = server
        self.args = args
        self.port = server.port
        self.fleet: list[Conn] = []
        self.helpers: list[Conn] = []
        self.out: dict[str, Any] = {}
        self.pool: GenPool | None = None  # the idle fleet in generator processes (--gen-procs > 1)
        self.pool_conns = 0
        self.mid_mem = (0, 0)  # (tree VmRSS, server process VmRSS) connected, before subscribing

    def check(self) -> None:
        if not self.server.alive():
            raise ServerError(f"{self.server.name} died:\n{self.server.log_tail()}")

    def settle(self, max_wait: float = 10.0, quiet: float = 0.0) -> None:
        """Wait until the server's whole process tree is idle (one tick per 0.1 s, and one more
        for every two descendants: the workers' own timers)."""
        kids = descendants(self.server.pid)
        wait_idle(self.server.pid, max_wait=max_wait, quiet=quiet, max_ticks=1 + len(kids) // 2, kids=kids)

    def window(self) -> Window:
        return Window(self.server, self.pool.pids if self.pool else None)

    async def helper(self, name: str) -> Conn:
        c = await open_conn(HOST, self.port, name, clean=True, index=-1)
        self.helpers.append(c)
        return c

    # ---------------------------------------------------------------- idle
    async def idle(self, report: bool) -> dict[str, Any]:
        """N devices connect (persistent and clean sessions mixed) and subscribe to dev/<i>/cmd."""
        a = self.args
        for i in range(4):  # warm-up: what the first connections allocate is not per device
            c = await self.helper(f"warm-{i}")
            await c.subscribe(f"warm/{i}/cmd")
        if a.gen_procs > 1:
            self.pool = GenPool(HOST, self.port, a.gen_procs, a.conns, a.persistent_share, a.concurrency)
            await self.pool.start()
        self.settle(5)
        kids = descendants(self.server.pid)
        rss0, anon0 = proc_mem(self.server.pid)
        trss0, tanon0, each0 = tree_mem(self.server.pid, kids)
        log(
            f"  idle: before, server tree VmRSS {trss0 / KIB / KIB:.1f} MiB,"
            f" its own process {rss0 / KIB / KIB:.1f} MiB"
        )
        w = self.window()
        if self.pool is None:
            connect_s, subscribe_s, persistent = await self.idle_here()
        else:
            connect_s, subscribe_s, persistent = await self.idle_pool()
        load = w.stop("idle")
        self.settle(10, quiet=0.5)
        await asyncio.sleep(0.3)
        self.check()
        rss1, anon1 = proc_mem(self.server.pid)
        trss1, tanon1, each1 = tree_mem(self.server.pid, kids)
        n = self.pool_conns or len(self.fleet)
        log(f"  idle: {n} connected in {connect_s:.2f} s, subscribed in {subscribe_s:.2f} s")
        if not report:
            return {}
        # each descendant's descriptor growth: a gateway worker's connections
        workers = [each1[p][1] - each0[p][1] for p in kids if p in each0 and p in each1]
        return {
            "idle_conns": n,
            "idle_persistent": persistent,
            "idle_conn_rss_kib": _r((rss1 - rss0) / n / KIB),
            "idle_conn_rss_anon_kib": _r((anon1 - anon0) / n / KIB),
            "idle_rss_mib": _r(rss1 / KIB / KIB, 1),
            "idle_tree_rss_kib": _r((trss1 - trss0) / n / KIB),
            "idle_tree_rss_anon_kib": _r((tanon1 - tanon0) / n / KIB),
            "idle_tree_rss_mib": _r(trss1 / KIB / KIB, 1),
            "idle_tree_procs": len(each1),
            "idle_connected_tree_rss_kib": _r((self.mid_mem[0] - trss0) / n / KIB),
            "idle_connected_store_rss_mib": _r(self.mid_mem[1] / KIB / KIB, 1),
            "idle_store_rss_mib_before": _r(rss0 / KIB / KIB, 1),
            "idle_store_rss_mib_after": _r(rss1 / KIB / KIB, 1),
            "idle_worker_conns": workers,
            "idle_worker_rss_mib": [_r(each1[p][0] / KIB / KIB, 1) for p in kids if p in each1],
            "idle_gen_procs": a.gen_procs,
            "connects_per_s": _r(n / connect_s, 1),
            "subscribes_per_s": _r(n / max(subscribe_s, 1e-6), 1),
            **load,
        }

    async def idle_here(self) -> tuple[float, float, int]:
        """The idle fleet in this process: (connect s, subscribe s, persistent sessions)."""
        a = self.args
        share = int(round(a.persistent_share * 100))
        items = [(i, f"dev-{i}", (i % 100) >= share) for i in range(a.conns)]
        t = time.monotonic()
        self.fleet = await open_many(HOST, self.port, items, a.concurrency, timeout=60 + a.conns / 200)
        connect_s = time.monotonic() - t
        self.connected_mem()
        t = time.monotonic()
        await subscribe_all(self.fleet, lambda c: f"dev/{c.index}/cmd", timeout=120 + a.conns / 20)
        subscribe_s = time.monotonic() - t
        return connect_s, subscribe_s, sum(c.persistent for c in self.fleet)

    def connected_mem(self) -> None:
        """Once connected, before subscribing: the server's idle tree VmRSS and its own."""
        self.settle(5)
        pid = self.server.pid
        self.mid_mem = (tree_mem(pid, descendants(pid))[0], proc_mem(pid)[0])
        log(
            f"  idle: connected; server tree VmRSS {self.mid_mem[0] / KIB / KIB:.1f} MiB, its own process"
            f" {self.mid_mem[1] / KIB / KIB:.1f} MiB"
        )

    async def idle_pool(self) -> tuple[float, float, int]:
        """The idle fleet in the generator processes (bench/scale_gen.py): all connect, then all
        subscribe; each span from the first start to the last end over the processes."""
        assert self.pool is not None
        con = await self.pool.call("connect")
        self.connected_mem()
        sub = await self.pool.call("subscribe")
        self.pool_conns = sum(r["conns"] for r in con)
        log(f"  idle: per generator process {[r['conns'] for r in con]}")

        def span(rs: list[dict[str, Any]]) -> float:
            return max(r["t1"] for r in rs) - min(r["t0"] for r in rs)

        return span(con), span(sub), sum(r["persistent"] for r in con)

    # ---------------------------------------------------------------- commands
    async def commands(self, phase: str = "commands", count: int | None = None) -> dict[str, Any]:
        """QoS 1 commands to `count` (1,000) random connected devices, one each, paced."""
        a = self.args
        pool = self.pool
        devices = list(range(self.pool_conns)) if pool else [c.index for c in self.fleet if not c.closed]
        by_index = {c.index: c for c in self.fleet}
        k = min(count or a.commands, len(devices))
        targets = random.Random(a.seed).sample(devices, k)  # device indices
        lat: list[int] = []
        got: dict[int, int] = {}
        wrong = 0

        def record(index: int, topic: str, seq: int, lat_ns: int) -> None:
            nonlocal wrong
            if topic != f"dev/{index}/cmd" or seq >= k or targets[seq] != index:
                wrong += 1
                return
            got[seq] = got.get(seq, 0) + 1
            lat.append(lat_ns)

        def sink(c: Conn, topic: bytes, payload: bytes, retain: bool, now: int) -> None:
            t, seq = unstamp(payload)
            record(c.index, topic.decode(), seq, now - t)

        async def collect() -> None:  # the deliveries the generator processes saw so far
            if pool is not None:
                for r in await pool.call("deliveries", 60):
                    for rec in r["records"]:
                        record(*rec)

        async def delivered() -> bool:
            end = time.monotonic() + 10 + k / 100
            while True:
                await collect()
                if len(got) >= k and cmd.acks >= k:
                    return True
                if time.monotonic() >= end:
                    return False
                await asyncio.sleep(0.1 if pool else 0.005)

        if pool is None:
            for i in targets:
                by_index[i].sink = sink
        cmd = await self.helper(f"commander-{phase}")
        # idle for 1.5 s in a row: past a server's periodic housekeeping after the connect storm
        # (the gateway's collector promotes the storm's objects within a second: ~60 ms once for
        # 18,000 devices), so that the figure is that of commands to an idle fleet (0.2 s with
        # --quick: 300 devices leave no such housekeeping, and the smoke test times nothing)
        self.settle(15, quiet=0.2 if self.args.quick else 1.5)
        w = self.window()
        t0 = time.monotonic()
        for i, c in enumerate(targets):
            due = t0 + i / a.command_rate
            if (d := due - time.monotonic()) > 0:
                await asyncio.sleep(d)
            cmd.write(Publisher(f"dev/{c}/cmd", a.payload).packet(cmd.pid(), stamp(i, a.payload)))
        await delivered()
        load = w.stop(phase)
        await asyncio.sleep(0.2)  # a duplicate shows up late
        await collect()
        for i in targets:
            if i in by_index:
                by_index[i].sink = None
        lat.sort()
        dups = sum(v - 1 for v in got.values())
        log(f"  {phase}: {len(got)}/{k} delivered, {dups} duplicates, {wrong} misrouted")
        return {
            f"{phase}_sent": k,
            f"{phase}_delivered": len(got),
            f"{phase}_duplicates": dups,
            f"{phase}_misrouted": wrong,
            f"{phase}_p50_ms": _r(pct_ms(lat, 50)),
            f"{phase}_p99_ms": _r(pct_ms(lat, 99)),
            **load,
        }

    # ---------------------------------------------------------------- telemetry
    async def telemetry(self, phase: str, pubs: list[Conn], rate: float) -> dict[str, Any]:
        """`pubs` publish QoS 1 to dev/<j>/telemetry at `rate` msg/s in all; one `dev/+/telemetry`
        subscriber measures publish-to-delivery latency; CPU and acks over the measured window."""
        a = self.args
        sub = await self.helper(f"{phase}-sub")
        await asyncio.wait_for(sub.subscribe("dev/+/telemetry"), 30)
        seen: set[int] = set()
        dups = 0
        lat: list[int] = []
        lo, hi = -1, -1

        def sink(c: Conn, topic: bytes, payload: bytes, retain: bool, now: int) -> None:
            nonlocal dups
            t, seq = unstamp(payload)
            if seq in seen:
                dups += 1
                return
            seen.add(seq)
            if lo <= seq < hi:
                lat.append(now - t)

        sub.sink = sink
        encs = [Publisher(f"dev/{c.index}/telemetry", a.payload) for c in pubs]
        np = len(pubs)
        acked = [0]

        def on_ack(c: Conn, pid: int) -> None:
            acked[0] += 1

        for c in pubs:
            c.on_ack = on_ack
        cap = max(int(rate * a.max_behind_s), 10)  # unacked messages the generator lets pile up
        self.settle(3)
        t_start = time.monotonic()
        t0, t1 = t_start + a.warmup, t_start + a.warmup + a.duration
        sent = skipped = acks0 = 0
        w: Window | None = None
        while True:
            now = time.monotonic()
            if w is None and now >= t0:
                w, lo, hi, acks0 = Window(self.server), sent, 1 << 62, acked[0]
            if now >= t1:
                break
            due = int((now - t_start) * rate) - skipped
            while sent < due:
                if sent - acked[0] >= cap:  # the server is behind: hold back, count it
                    skipped += due - sent
                    break
                j = (sent + skipped) % np
                c = pubs[j]
                c.write(encs[j].packet(c.pid(), stamp(sent, a.payload)))
                sent += 1
            await asyncio.sleep(0.001)
        hi = sent
        acks1 = acked[0]
        assert w is not None
        load = w.stop(phase)
        figs = w.figures
        taken = acks1 - acks0
        ok = await wait_for(lambda: len(seen) >= sent and acked[0] >= sent, a.drain_max, 0.02)
        sub.sink = None
        for c in pubs:
            c.on_ack = None
        lat.sort()
        undelivered = sent - len(seen)
        unacked = sent - acked[0]
        log(
            f"  {phase}: {sent} sent, {skipped} held back, {undelivered} undelivered, {dups} duplicates,"
            f" {unacked} unacked (drained in {a.drain_max:.0f} s: {ok})"
        )
        return {
            f"{phase}_publishers": np,
            f"{phase}_rate": rate,
            f"{phase}_sent": sent,
            f"{phase}_held_back": skipped,
            f"{phase}_drained": ok,
            f"{phase}_undelivered": undelivered,
            f"{phase}_duplicates": dups,
            f"{phase}_unacked": unacked,
            # server CPU over the window per message it acknowledged in it
            f"{phase}_cpu_us_per_msg": _r(figs["server_cpu_s"] / taken * 1e6, 1) if taken else None,
            f"{phase}_acks_per_s": _r((acks1 - acks0) / figs["duration_s"], 1),
            f"{phase}_p50_ms": _r(pct_ms(lat, 50)),
            f"{phase}_p99_ms": _r(pct_ms(lat, 99)),
            **load,
        }

    # ---------------------------------------------------------------- retained
    async def retained(self) -> dict[str, Any]:
        """R retained QoS 1 messages to dev/<i>/state, then a new `dev/+/state` subscriber."""
        a = self.args
        r = a.retained
        pub = await self.helper("retained-pub")
        t = time.monotonic()
        budget = t + a.retained_max_s  # a server this slow stores fewer; the replay is of those
        for i in range(a.retained):
            if i - pub.acks >= 500:
                await wait_for(lambda i=i: i - pub.acks < 250, 60, 0.001)
            if time.monotonic() > budget:
                r = i
                log(f"  retained: {r} stored in --retained-max-s {a.retained_max_s:.0f} s; stopped there")
                break
            pub.write(
                Publisher(f"dev/{i}/state", a.payload, retain=True).packet(pub.pid(), stamp(i, a.payload))
            )
        if not await wait_for(lambda: pub.acks >= r, 60, 0.005):
            raise ServerError(f"retained: {pub.acks}/{r} PUBACKs")
        store_s = time.monotonic() - t
        self.settle(5)
        seen: set[int] = set()
        flagged = 0

        def sink(c: Conn, topic: bytes, payload: bytes, retain: bool, now: int) -> None:
            nonlocal flagged
            seen.add(unstamp(payload)[1])
            flagged += retain

        sub = await self.helper("retained-sub")
        sub.sink = sink
        w = self.window()
        t = time.monotonic()
        sub.subscribe("dev/+/state")
        await wait_for(lambda: len(seen) >= r, 30 + r / 1000, 0.0005)
        replay_s = time.monotonic() - t
        load = w.stop("retained")
        await asyncio.sleep(0.2)
        log(f"  retained: {len(seen)}/{r} replayed in {replay_s:.3f} s ({sub.received} deliveries)")
        return {
            "retained_messages": r,
            "retained_store_s": _r(store_s),
            "retained_replayed": len(seen),
            "retained_flagged": flagged,
            "retained_duplicates": sub.received - len(seen),
            "retained_replay_s": _r(replay_s, 4),
            **load,
        }

    # ---------------------------------------------------------------- reconnect
    async def reconnect(self) -> dict[str, Any]:
        """All persistent-session devices disconnect, then reconnect (clean session 0) at once."""
        a = self.args
        olds = [c for c in self.fleet if c.persistent and not c.closed]
        for c in olds:
            c.disconnect()
        await asyncio.wait_for(asyncio.gather(*(c.lost for c in olds)), 60)
        self.settle(10)
        w = self.window()
        t = time.monotonic()
        items = [(c.index, f"dev-{c.index}", False) for c in olds]
        news = await open_many(HOST, self.port, items, a.concurrency, timeout=60 + len(olds) / 200)
        reconnect_s = time.monotonic() - t
        load = w.stop("reconnect")
        by_index = {c.index: c for c in news}
        self.fleet = [by_index.get(c.index, c) for c in self.fleet]
        present = sum(c.session_present for c in news)
        log(f"  reconnect: {len(news)} in {reconnect_s:.2f} s, {present} with session present")
        out = {
            "reconnects": len(news),
            "reconnect_session_present": present,
            "reconnects_per_s": _r(len(news) / reconnect_s, 1),
            **load,
        }
        # the resumed sessions kept their subscriptions: commands to some of them arrive
        resumed = [c for c in self.fleet if c.persistent]
        if resumed:
            saved = self.fleet
            self.fleet = resumed
            try:
                out.update(await self.commands("resumed_commands", min(100, len(resumed))))
            finally:
                self.fleet = saved
        return out

    # ---------------------------------------------------------------- persistent
    async def persistent(self) -> dict[str, Any]:
        """S persistent sessions, each subscribed to its own dev/<i>/cmd, connected; 100 other
        devices publish telemetry at 500 msg/s in all."""
        a = self.args
        for i in range(4):
            await self.helper(f"pwarm-{i}")
        self.settle(5)
        rss0, anon0 = proc_mem(self.server.pid)
        s = a.sessions
        t = time.monotonic()
        self.fleet = await open_many(
            HOST, self.port, [(i, f"ps-{i}", False) for i in range(s)], a.concurrency, 60 + s / 200
        )
        await subscribe_all(self.fleet, lambda c: f"dev/{c.index}/cmd", 60 + s / 200)
        setup_s = time.monotonic() - t
        self.settle(10)
        rss1, anon1 = proc_mem(self.server.pid)
        pubs = await open_many(
            HOST,
            self.port,
            [(s + j, f"pp-{j}", True) for j in range(a.persistent_publishers)],
            a.concurrency,
        )
        self.helpers += pubs
        log(f"  persistent: {s} sessions set up in {setup_s:.2f} s")
        out = await self.telemetry("persistent", pubs, a.persistent_rate)
        rss2, anon2 = proc_mem(self.server.pid)
        out.update(
            {
                "persistent_rss_mib_after": _r(rss2 / KIB / KIB, 1),  # the server's, after the telemetry
                "persistent_rss_anon_mib_after": _r(anon2 / KIB / KIB, 1),
                "persistent_sessions": s,
                "persistent_session_rss_kib": _r((rss1 - rss0) / s / KIB),
                "persistent_session_rss_anon_kib": _r((anon1 - anon0) / s / KIB),
            }
        )
        return out

    async def close(self) -> None:
        conns = [c for c in [*self.fleet, *self.helpers] if not c.closed]
        for c in conns:
            c.disconnect()
        if self.pool is not None:
            await self.pool.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(c.lost for c in conns)), 20)
