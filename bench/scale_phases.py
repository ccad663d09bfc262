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
    cpu_s,
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


class Window:
    """A measured window: server CPU (the process and its children), this generator's CPU, what
    everything else on the machine used (`other_util`, in CPUs) and the hypervisor's steal."""

    def __init__(self, server: Server) -> None:
        self.pid = server.pid
        self.kids = descendants(server.pid)
        self.t0 = time.monotonic()
        self.ticks = cpu_ticks()
        self.sys0 = system_busy_s()
        self.srv0 = tree_cpu_s(self.pid, self.kids)
        self.gen0 = cpu_s(os.getpid())

    def stop(self, phase: str) -> dict[str, Any]:
        """End the window: `figures` (duration, server and generator CPU s) and the load figures.
        The machine's load is measured over at least `MIN_LOAD_S` (a shorter window is below the
        clock-tick resolution of /proc/stat), so a short phase waits out the rest."""
        dur = max(time.monotonic() - self.t0, 1e-6)
        self.figures = {
            "duration_s": dur,
            "server_cpu_s": tree_cpu_s(self.pid, self.kids) - self.srv0,
            "gen_cpu_s": cpu_s(os.getpid()) - self.gen0,
        }
        if dur < MIN_LOAD_S:
            time.sleep(MIN_LOAD_S - dur)
        dur = time.monotonic() - self.t0
        srv = tree_cpu_s(self.pid, self.kids) - self.srv0
        gen = cpu_s(os.getpid()) - self.gen0
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

    def check(self) -> None:
        if not self.server.alive():
            raise ServerError(f"{self.server.name} died:\n{self.server.log_tail()}")

    def settle(self, max_wait: float = 10.0, quiet: float = 0.0) -> None:
        wait_idle(self.server.pid, max_wait=max_wait, quiet=quiet)

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
        self.settle(5)
        rss0, anon0 = proc_mem(self.server.pid)
        share = int(round(a.persistent_share * 100))
        items = [(i, f"dev-{i}", (i % 100) >= share) for i in range(a.conns)]
        w = Window(self.server)
        t = time.monotonic()
        self.fleet = await open_many(HOST, self.port, items, a.concurrency, timeout=60 + a.conns / 200)
        connect_s = time.monotonic() - t
        await subscribe_all(self.fleet, lambda c: f"dev/{c.index}/cmd", timeout=60 + a.conns / 200)
        subscribe_s = time.monotonic() - t - connect_s
        load = w.stop("idle")
        self.settle(10)
        await asyncio.sleep(0.3)
        self.check()
        rss1, anon1 = proc_mem(self.server.pid)
        n = len(self.fleet)
        log(f"  idle: {n} connected in {connect_s:.2f} s, subscribed in {subscribe_s:.2f} s")
        if not report:
            return {}
        return {
            "idle_conns": n,
            "idle_persistent": sum(c.persistent for c in self.fleet),
            "idle_conn_rss_kib": _r((rss1 - rss0) / n / KIB),
            "idle_conn_rss_anon_kib": _r((anon1 - anon0) / n / KIB),
            "idle_rss_mib": _r(rss1 / KIB / KIB, 1),
            "connects_per_s": _r(n / connect_s, 1),
            "subscribes_per_s": _r(n / max(subscribe_s, 1e-6), 1),
            **load,
        }

    # ---------------------------------------------------------------- commands
    async def commands(self, phase: str = "commands", count: int | None = None) -> dict[str, Any]:
        """QoS 1 commands to `count` (1,000) random connected devices, one each, paced."""
        a = self.args
        devices = [c for c in self.fleet if not c.closed]
        k = min(count or a.commands, len(devices))
        targets = random.Random(a.seed).sample(devices, k)
        lat: list[int] = []
        got: dict[int, int] = {}
        wrong = 0

        def sink(c: Conn, topic: bytes, payload: bytes, retain: bool, now: int) -> None:
            nonlocal wrong
            t, seq = unstamp(payload)
            if topic != f"dev/{c.index}/cmd".encode() or seq >= k or targets[seq] is not c:
                wrong += 1
                return
            got[seq] = got.get(seq, 0) + 1
            lat.append(now - t)

        for c in targets:
            c.sink = sink
        cmd = await self.helper(f"commander-{phase}")
        # idle for 1.5 s in a row: past a server's periodic housekeeping after the connect storm
        # (the gateway's collector promotes the storm's objects within a second: ~60 ms once for
        # 18,000 devices), so that the figure is that of commands to an idle fleet (0.2 s with
        # --quick: 300 devices leave no such housekeeping, and the smoke test times nothing)
        self.settle(15, quiet=0.2 if self.args.quick else 1.5)
        w = Window(self.server)
        t0 = time.monotonic()
        for i, c in enumerate(targets):
            due = t0 + i / a.command_rate
            if (d := due - time.monotonic()) > 0:
                await asyncio.sleep(d)
            cmd.write(Publisher(f"dev/{c.index}/cmd", a.payload).packet(cmd.pid(), stamp(i, a.payload)))
        await wait_for(lambda: len(got) >= k and cmd.acks >= k, 10 + k / 100)
        load = w.stop(phase)
        await asyncio.sleep(0.2)  # a duplicate shows up late
        for c in targets:
            c.sink = None
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
        w = Window(self.server)
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
        w = Window(self.server)
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
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(c.lost for c in conns)), 20)
