"""Randomized faults in a replica group, as real processes: three `gateway store --group g1` nodes
(sync, min-insync 2), a name server, a proxy and a real etcd. In a loop, a seeded RNG kills
(`kill -9`) the primary or a replica, pauses a node (SIGSTOP for 2-5 s) or restarts a killed one,
while gRPC and MQTT QoS 1 publishers and a gRPC consumer run. Then every node is restarted, and the
whole topic, read by offsets, must hold every acknowledged message exactly once, and every node the
same commit log bytes. `FAULT_SEED` replays a run (the seed is printed and in every failure),
`FAULT_ITERATIONS` sets the number of faults (3 here, 40 in `make soak`)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import pytest

from tests.cluster.etcd_support import EtcdProcess, etcd_missing
from tests.cluster.fault_loop import AuditConsumer, Fault, UniquePublishers, judge, next_fault, read_topic
from tests.cluster.support import Cluster
from tests.cluster.test_replica_group import _in_sync, group_state, log_files, start_member, until

ITERATIONS = int(os.environ.get("FAULT_ITERATIONS", "3"))
SEED = (
    int(os.environ["FAULT_SEED"]) if os.environ.get("FAULT_SEED") else random.SystemRandom().randrange(2**32)
)
NODES = {"a", "b", "c"}
HEAL_S = 60.0  # every node restarted, until all three are in the SyncStateSet again

pytestmark = [
    pytest.mark.skipif(etcd_missing(), reason="etcd is not installed (deps/debian-packages.txt)"),
    pytest.mark.timeout(120 + 15 * ITERATIONS),  # a fault lasts at most 5 s of pause + 3 s of load
]


async def apply(c: Cluster, fault: Fault, etcd: str) -> None:
    proc = c.stores[fault.node][0].p
    if fault.kind == "kill":
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 10)
    elif fault.kind == "pause":
        proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(fault.pause_s)  # the fault's length: the node is frozen that long
        finally:
            proc.send_signal(signal.SIGCONT)
    else:
        await asyncio.to_thread(start_member, c, fault.node, etcd)  # same data dir


async def test_random_kills_pauses_and_restarts_lose_and_duplicate_no_acknowledged_message(tmp_path):
    print(f"\nfault loop: FAULT_SEED={SEED} FAULT_ITERATIONS={ITERATIONS}")
    rng = random.Random(SEED)
    replay = f"replay with FAULT_SEED={SEED} FAULT_ITERATIONS={ITERATIONS}"
    (tmp_path / "etcd").mkdir()
    etcd = EtcdProcess(tmp_path / "etcd")
    etcd.start()
    c = Cluster(tmp_path)
    t0 = time.monotonic()
    try:
        c.start_namesrv()
        for name in sorted(NODES):
            start_member(c, name, etcd.endpoint)
        (listeners,) = c.start_proxies(1, "grpc,mqtt,http")
        await until(lambda: _in_sync(etcd.endpoint, NODES), 20, "every node in the SyncStateSet")
        pubs, audit = UniquePublishers(listeners), AuditConsumer(listeners)
        tasks = [asyncio.create_task(t) for t in (pubs.grpc(), pubs.mqtt(), audit.run())]
        await until(_acked(pubs, 50), 30, "50 acknowledged sends")
        killed: set[str] = set()
        for i in range(ITERATIONS):
            state = await group_state(etcd.endpoint)
            primary = state.primary if state else None
            fault = next_fault(rng, NODES, killed, primary)
            print(f"  {time.monotonic() - t0:6.1f} s  fault {i + 1}: {fault} (primary {primary})")
            await apply(c, fault, etcd.endpoint)
            if fault.kind == "kill":
                killed.add(fault.node)
            elif fault.kind == "restart":
                killed.discard(fault.node)
            await asyncio.sleep(rng.uniform(1, 3))  # load under the fault before the next one
        for name in sorted(killed):
            await apply(c, Fault("restart", name), etcd.endpoint)
        await until(lambda: _in_sync(etcd.endpoint, NODES), HEAL_S, f"all nodes in sync again ({replay})")
        await until(_acked(pubs, len(pubs.acked) + 20), 30, f"sends acknowledged after healing ({replay})")
        pubs.stop.set()
        audit.stop.set()
        await asyncio.gather(*tasks)
        verdict = judge(pubs.acked, await read_topic(listeners["http"]))
        print(
            f"fault loop: seed {SEED}, faults {ITERATIONS}, attempts {pubs.attempts}, acked {verdict.acked}, "
            f"lost {len(verdict.lost)}, duplicates {len(verdict.duplicated)} (stored twice, any: "
            f"{verdict.stored_twice}; stored though unacknowledged: {verdict.unacked_stored}); consumer: "
            f"{len(audit.got)} deliveries, {len(audit.got) - len(set(audit.got))} redelivered, "
            f"{audit.errors} errors; {time.monotonic() - t0:.0f} s"
        )
        assert verdict.acked > 0, replay
        assert not verdict.lost, f"{len(verdict.lost)} acknowledged lost, e.g. {verdict.lost[:10]}; {replay}"
        assert not verdict.duplicated, f"acknowledged stored twice: {verdict.duplicated[:10]}; {replay}"
        for name in sorted(NODES):
            assert c.stores[name][0].stop() == 0, f"{name} did not stop cleanly; {replay}"
        logs = [log_files(tmp_path / name) for name in sorted(NODES)]
        n = min(len(x.rstrip(b"\0")) for x in logs)
        assert n > 0 and all(x[:n] == logs[0][:n] for x in logs), f"commit logs differ; {replay}"
    finally:
        c.close()
        etcd.stop()


def _acked(pubs: UniquePublishers, n: int):
    async def check() -> bool:
        return len(pubs.acked) >= n

    return check


def test_the_fault_plan_keeps_a_node_alive_and_replays_from_its_seed():
    def plan(seed: int) -> list[Fault]:
        rng, killed, out = random.Random(seed), set[str](), []
        for _ in range(200):
            f = next_fault(rng, NODES, killed, "a" if "a" not in killed else None)
            assert f.node in (killed if f.kind == "restart" else NODES - killed), f
            assert f.kind != "pause" or 2 <= f.pause_s <= 5, f
            (killed.add if f.kind == "kill" else killed.discard)(f.node)
            assert len(killed) < len(NODES)
            out.append(f)
        return out

    faults = plan(SEED)
    assert faults == plan(SEED), f"seed {SEED}"
    assert {f.kind for f in faults} == {"kill", "pause", "restart"}, f"seed {SEED}"
