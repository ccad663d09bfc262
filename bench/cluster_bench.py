"""Benchmark of CLUSTER mode: gRPC send and receive+ack throughput through 1 proxy vs 2 proxies
(each its own process) over 2 store nodes, the latency a separate proxy adds (LOCAL vs CLUSTER),
and every server process's CPU time per message.

Processes: `gateway namesrv`, two `gateway store` nodes, `gateway start --mode cluster` proxies
(gRPC + HTTP only) and, for the latency comparison, one LOCAL `gateway start`. Load generators are
those of bench/grpc_bench.py (bench/grpc_loadgen.py: separate processes, grpc.aio stubs,
`--producers` tasks per proxy, 1 message per SendMessage; consumers loop ReceiveMessage(32) +
AckMessage).

Phases:
1. latency: one producer, one message per SendMessage, sequential: p50/p99 against the LOCAL
   gateway and against one CLUSTER proxy (`cluster_vs_local_p50_latency_ratio`);
2. 1 proxy: sends for `--seconds`, then receive+ack of that backlog;
3. 2 proxies: the same load generators against each of the two proxies at once.
`send_scaling_2_vs_1` / `pop_scaling_2_vs_1` are the throughput ratios of phase 3 to phase 2.
4. replication (`--replication-rounds N`, default 3; 0: skip; needs etcd, deps/debian-packages.txt):
   a real etcd, a replica group of 2 store nodes (`--group`, sync, min-insync 2) behind its own
   proxy, and a single store node behind another (each its own `--cluster-name`), both with the
   flush policy of the run; sends for `--seconds` against one, then the other, alternating which
   goes first from round to round. `sync_replication_send_ratio` is the median over the rounds of
   replicated / single throughput, `sync_replication_p99_ms` the median p99 send latency of the
   group (and `single_node_p99_ms` the single node's).
CPU: utime+stime from /proc (bench/common.py) of each server process (stores with their
fsync helpers) over each phase, as µs per message; on a 2-core machine the load generators share
the CPUs, so flat CPU per message as proxies are added is the figure that shows scaling.

    .venv/bin/python bench/cluster_bench.py [--quick] [--json] [--seconds S] [--producers N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, Server, ServerError, descendants, free_port, log, spawn_gateway, tree_cpu_s
from grpc_loadgen import TOPIC, Job, loop_policy, run_clients

sys.path.insert(0, str(REPO))
from tests.cluster.etcd_support import EtcdProcess, etcd_missing  # noqa: E402

LEASE = ["--lease-period-s", "2", "--lease-expiry-s", "10"]


def _start(name: str, args: list[str], workdir: Path, port: int, http: int = 0) -> Server:
    """`gateway <args>` (namesrv, store or start) in the repository, ready on its ready line (and
    /healthz on port `http`)."""
    return spawn_gateway(name, args, workdir, port, cwd=REPO, http_port=http or None)


class Topology:
    """Name server, 2 stores, proxies and a LOCAL gateway as processes under one work directory."""

    def __init__(self, workdir: Path, flush: str) -> None:
        self.workdir = workdir
        self.flush = flush
        self.servers: dict[str, Server] = {}
        self.grpc: dict[str, str] = {}
        self.http: dict[str, int] = {}
        self.namesrv = ""

    def start_cluster(self) -> None:
        port = free_port()
        self.namesrv = f"127.0.0.1:{port}"
        args = ["namesrv", "--port", str(port), *LEASE]
        self.servers["namesrv"] = _start("namesrv", args, self.workdir, port)
        for name in ("store-a", "store-b"):
            port = free_port()
            args = ["store", "--data-dir", str(self.workdir / name), "--port", str(port), "--name", name]
            args += ["--namesrv", self.namesrv, "--flush", self.flush, *LEASE]
            self.servers[name] = _start(name, args, self.workdir, port)

    def start_group_and_single(self, etcd: str) -> None:
        """Cluster `Replicated`: replica group g1 of two store nodes (sync, min-insync 2); cluster
        `Single`: one store node; each behind its own proxy (`proxy-r`, `proxy-s`)."""
        for name, cluster, extra in (
            ("grp-a", "Replicated", ["--group", "g1", "--controller", etcd]),
            ("grp-b", "Replicated", ["--group", "g1", "--controller", etcd]),
            ("single", "Single", []),
        ):
            port = free_port()
            args = ["store", "--data-dir", str(self.workdir / name), "--port", str(port), "--name", name]
            args += ["--namesrv", self.namesrv, "--cluster-name", cluster, "--flush", self.flush, *LEASE]
            self.servers[name] = _start(name, [*args, *extra], self.workdir, port)
        self.add_gateway("proxy-r", cluster=True, cluster_name="Replicated")
        self.add_gateway("proxy-s", cluster=True, cluster_name="Single")

    def add_gateway(self, name: str, cluster: bool, cluster_name: str = "DefaultCluster") -> str:
        """A CLUSTER proxy (`cluster`) or a LOCAL gateway `name` (gRPC + HTTP); its gRPC address."""
        grpc_port, http_port = free_port(), free_port()
        args = [
            "start",
            "--protocols",
            "grpc,http",
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
        ]
        args += ["--auto-create-topics", "--drain-timeout-s", "1"]
        if cluster:
            args += ["--mode", "cluster", "--namesrv", self.namesrv, "--proxy-name", name, *LEASE]
            args += ["--cluster-name", cluster_name]
        else:
            args += ["--data-dir", str(self.workdir / name), "--flush", self.flush]
        self.servers[name] = _start(name, args, self.workdir, grpc_port, http_port)
        self.grpc[name] = f"127.0.0.1:{grpc_port}"
        self.http[name] = http_port
        return self.grpc[name]

    def create_topic(self, name: str, queues: int = 4) -> None:
        from gateway.admin_client import AdminClient

        AdminClient(f"http://127.0.0.1:{self.http[name]}").create_topic(TOPIC, queues=queues)

    def cpu(self) -> dict[str, float]:
        out = {}
        for name, s in self.servers.items():
            if s.alive():
                out[name] = tree_cpu_s(s.pid, descendants(s.pid))
        return out

    def stop(self, name: str) -> None:
        self.servers.pop(name).stop()

    def close(self) -> None:
        for s in reversed(list(self.servers.values())):
            s.stop()
        self.servers.clear()


async def _load(top: Topology, kind: str, proxies: list[str], args: argparse.Namespace, tasks: int) -> dict:
    """Run one load generator job per proxy at once; total rate, CPU µs/message per process."""
    seconds = args.seconds if kind == "send" else args.seconds * 2
    warmup = args.warmup if kind == "send" else 0.0
    jobs = [Job(kind, top.grpc[p], tasks, seconds, warmup, 1, args.size, args.loop) for p in proxies]
    before = top.cpu()
    results = await asyncio.gather(*(run_clients(j, args.clients) for j in jobs))
    after = top.cpu()
    count = sum(r["count"] for r in results)
    rate = sum(r["per_s"] for r in results)
    cpu_us = {n: (after[n] - before[n]) * 1e6 / max(count, 1) for n in after if n in before}
    return {
        "per_s": rate,
        "count": count,
        "errors": sum(r["errors"] for r in results),
        "p50_ms": max(r["p50_ms"] for r in results),
        "p99_ms": max(r["p99_ms"] for r in results),
        "cpu_us_per_msg": cpu_us,
        "server_cpu_us_per_msg": sum(v for k, v in cpu_us.items() if k != "local" or proxies == ["local"]),
    }


async def _bench(args: argparse.Namespace, loop_name: str) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="cluster-bench-", dir=args.dir))
    top = Topology(tmp, args.flush)
    res: dict = {"event_loop": loop_name, "flush": args.flush, "body_bytes": args.size, "stores": 2}
    try:
        log("starting name server, 2 stores, proxy-1 and a LOCAL gateway")
        top.start_cluster()
        top.add_gateway("proxy-1", cluster=True)
        top.add_gateway("local", cluster=False)
        top.create_topic("proxy-1")
        top.create_topic("local", 8)

        # Warm-up, not measured: the first append of each store allocates its first commit log
        # segment (hundreds of ms), and connections and caches fill.
        warm = argparse.Namespace(**{**vars(args), "seconds": 0.3, "warmup": 0.0})
        await _load(top, "send", ["local", "proxy-1"], warm, 4)
        # 1. latency: LOCAL vs CLUSTER, one producer, sequential sends.
        lat_args = argparse.Namespace(**{**vars(args), "seconds": args.latency_seconds})
        lo = await _load(top, "send", ["local"], lat_args, 1)
        cl = await _load(top, "send", ["proxy-1"], lat_args, 1)
        top.stop("local")
        log(f"latency p50: local {lo['p50_ms']:.3f} ms, cluster {cl['p50_ms']:.3f} ms")
        res.update(
            {
                "local_send_p50_ms": lo["p50_ms"],
                "cluster_send_p50_ms": cl["p50_ms"],
                "cluster_vs_local_p50_latency_ratio": cl["p50_ms"] / lo["p50_ms"],
                "local_send_cpu_us_per_msg": lo["cpu_us_per_msg"].get("local", 0.0),
                "cluster_send_cpu_us_per_msg": cl["server_cpu_us_per_msg"],
            }
        )
        # Let the latency phase's backlog go: the throughput phases consume only their own.
        await _load(top, "receive", ["proxy-1"], argparse.Namespace(**{**vars(args), "seconds": 0.5}), 2)

        phases = {}
        for n in (1, 2):
            if n == 2:
                top.add_gateway("proxy-2", cluster=True)
            proxies = [f"proxy-{i}" for i in range(1, n + 1)]
            log(f"{n} proxy(ies): sends, {args.producers} producers per proxy, {args.seconds} s")
            snd = await _load(top, "send", proxies, args, args.producers)
            log(f"  {snd['per_s']:.0f} msg/s, server CPU {snd['server_cpu_us_per_msg']:.0f} µs/msg")
            log(f"{n} proxy(ies): receive+ack, {args.consumers} consumers per proxy")
            pop = await _load(top, "receive", proxies, args, args.consumers)
            log(f"  {pop['per_s']:.0f} msg/s, server CPU {pop['server_cpu_us_per_msg']:.0f} µs/msg")
            phases[n] = (snd, pop)
            res.update(
                {
                    f"send_per_s_{n}_proxy": snd["per_s"],
                    f"pop_per_s_{n}_proxy": pop["per_s"],
                    f"send_p50_ms_{n}_proxy": snd["p50_ms"],
                    f"send_cpu_us_per_msg_{n}_proxy": snd["cpu_us_per_msg"],
                    f"pop_cpu_us_per_msg_{n}_proxy": pop["cpu_us_per_msg"],
                    f"send_server_cpu_us_per_msg_{n}_proxy": snd["server_cpu_us_per_msg"],
                    f"pop_server_cpu_us_per_msg_{n}_proxy": pop["server_cpu_us_per_msg"],
                    f"send_errors_{n}_proxy": snd["errors"],
                    f"pop_errors_{n}_proxy": pop["errors"],
                }
            )
        res["send_scaling_2_vs_1"] = phases[2][0]["per_s"] / phases[1][0]["per_s"]
        res["pop_scaling_2_vs_1"] = phases[2][1]["per_s"] / phases[1][1]["per_s"]
        res["send_cpu_per_msg_2_vs_1"] = (
            phases[2][0]["server_cpu_us_per_msg"] / phases[1][0]["server_cpu_us_per_msg"]
        )
        res["pop_cpu_per_msg_2_vs_1"] = (
            phases[2][1]["server_cpu_us_per_msg"] / phases[1][1]["server_cpu_us_per_msg"]
        )
        res["cpus"] = os.cpu_count()
        if args.replication_rounds:
            res.update(await _replication(top, args))
        return res
    finally:
        top.close()
        shutil.rmtree(tmp, ignore_errors=True)


async def _replication(top: Topology, args: argparse.Namespace) -> dict:
    """Phase 4: sends through a sync replica group of 2 against a single store node, alternating."""
    if etcd_missing():
        log("replication phase skipped: etcd is not installed (deps/debian-packages.txt)")
        return {}
    (top.workdir / "etcd").mkdir()
    etcd = EtcdProcess(top.workdir / "etcd")
    etcd.start()
    try:
        for name in [n for n in top.servers if n.startswith("proxy-")]:
            top.stop(name)  # the earlier phases' proxies: only this phase's load from here on
        log("replication: etcd, replica group g1 (2 nodes, sync, min-insync 2), a single node")
        top.start_group_and_single(etcd.endpoint)
        await _until_replicated(etcd.endpoint)
        top.create_topic("proxy-r")
        top.create_topic("proxy-s")
        warm = argparse.Namespace(**{**vars(args), "seconds": 0.5, "warmup": 0.0})
        for p in ("proxy-r", "proxy-s"):
            await _load(top, "send", [p], warm, 4)
        rounds: list[dict] = []
        for i in range(args.replication_rounds):
            order = ("proxy-s", "proxy-r") if i % 2 == 0 else ("proxy-r", "proxy-s")
            got = {}
            for p in order:
                got[p] = await _load(top, "send", [p], args, args.producers)
            r, s = got["proxy-r"], got["proxy-s"]
            log(
                f"  round {i + 1}: replicated {r['per_s']:.0f} msg/s p99 {r['p99_ms']:.1f} ms, "
                f"single {s['per_s']:.0f} msg/s p99 {s['p99_ms']:.1f} ms"
            )
            rounds.append(
                {
                    "replicated_per_s": r["per_s"],
                    "single_per_s": s["per_s"],
                    "replicated_p99_ms": r["p99_ms"],
                    "single_p99_ms": s["p99_ms"],
                    "replicated_p50_ms": r["p50_ms"],
                    "single_p50_ms": s["p50_ms"],
                    "replicated_errors": r["errors"],
                    "ratio": r["per_s"] / max(s["per_s"], 1e-9),
                }
            )
        return {
            "sync_replication_send_ratio": statistics.median(x["ratio"] for x in rounds),
            "sync_replication_p99_ms": statistics.median(x["replicated_p99_ms"] for x in rounds),
            "sync_replication_p50_ms": statistics.median(x["replicated_p50_ms"] for x in rounds),
            "single_node_p99_ms": statistics.median(x["single_p99_ms"] for x in rounds),
            "single_node_p50_ms": statistics.median(x["single_p50_ms"] for x in rounds),
            "replication_rounds": rounds,
        }
    finally:
        for name in ("proxy-r", "proxy-s", "grp-a", "grp-b", "single"):
            if name in top.servers:
                top.stop(name)
        etcd.stop()


async def _until_replicated(etcd: str, timeout: float = 30.0) -> None:
    """Until group g1's primary has its replica in the SyncStateSet (sends are refused before)."""
    from cluster.controller import ControllerError, EtcdController

    ctl = EtcdController(etcd, cluster="Replicated")
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ControllerError):
                state = await ctl.state("g1")
                if state is not None and state.primary and len(state.sync_state_set) == 2:
                    return
            await asyncio.sleep(0.2)
    finally:
        await ctl.close()
    raise ServerError("replica group g1 has no replica in its SyncStateSet")


def _print(res: dict) -> None:
    print(f"CLUSTER bench: 2 stores, flush {res['flush']}, {res['body_bytes']} B bodies, {res['cpus']} CPUs")
    print(
        f"latency p50 (1 producer): LOCAL {res['local_send_p50_ms']:.3f} ms, CLUSTER "
        f"{res['cluster_send_p50_ms']:.3f} ms -> ratio {res['cluster_vs_local_p50_latency_ratio']:.2f}; "
        f"server CPU µs/msg LOCAL {res['local_send_cpu_us_per_msg']:.0f}, "
        f"CLUSTER {res['cluster_send_cpu_us_per_msg']:.0f}"
    )
    for n in (1, 2):
        snd, pop = res[f"send_per_s_{n}_proxy"], res[f"pop_per_s_{n}_proxy"]
        print(f"{n} proxy: send {snd:.0f} msg/s, pop {pop:.0f} msg/s")
        for kind in ("send", "pop"):
            per = res[f"{kind}_cpu_us_per_msg_{n}_proxy"]
            parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(per.items()))
            print(
                f"  {kind} CPU µs/msg: {parts} (servers {res[f'{kind}_server_cpu_us_per_msg_{n}_proxy']:.0f})"
            )
    print(
        f"scaling 2 vs 1 proxy: send x{res['send_scaling_2_vs_1']:.2f}, "
        f"pop x{res['pop_scaling_2_vs_1']:.2f}; "
        f"server CPU per message x{res['send_cpu_per_msg_2_vs_1']:.2f} (send), "
        f"x{res['pop_cpu_per_msg_2_vs_1']:.2f} (pop)"
    )
    if "sync_replication_send_ratio" in res:
        print(
            f"sync replication (group of 2, min-insync 2) vs a single node: sends "
            f"x{res['sync_replication_send_ratio']:.2f}, p99 {res['sync_replication_p99_ms']:.1f} ms "
            f"vs {res['single_node_p99_ms']:.1f} ms (medians of {len(res['replication_rounds'])} rounds)"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each send phase (pop: twice)")
    ap.add_argument("--latency-seconds", type=float, default=2.0, help="length of each latency phase")
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--producers", type=int, default=16, help="concurrent producer tasks per proxy")
    ap.add_argument("--consumers", type=int, default=4, help="concurrent consumer tasks per proxy")
    ap.add_argument("--clients", type=int, default=1, help="load generator processes per proxy")
    ap.add_argument("--size", type=int, default=100, help="message body bytes")
    ap.add_argument("--flush", choices=("sync", "async"), default="async", help="store flush policy (all)")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    ap.add_argument("--dir", default=None, help="parent of the temporary work directory")
    ap.add_argument(
        "--replication-rounds", type=int, default=3, help="replicated vs single node send rounds (0: skip)"
    )
    ap.add_argument("--quick", action="store_true", help="short smoke run")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds = min(args.seconds, 0.5)
        args.latency_seconds = min(args.latency_seconds, 0.5)
        args.warmup = min(args.warmup, 0.2)
        args.producers = min(args.producers, 4)
        args.consumers = min(args.consumers, 2)
        args.replication_rounds = min(args.replication_rounds, 1)
    loop_name = loop_policy(args.loop)
    t0 = time.monotonic()
    try:
        res = asyncio.run(_bench(args, loop_name))
    except ServerError as e:
        log(f"cluster bench: {e}")
        sys.exit(1)
    res["wall_s"] = time.monotonic() - t0
    if args.json:
        print(json.dumps(res))
    else:
        _print(res)


if __name__ == "__main__":
    main()
