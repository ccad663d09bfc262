"""Every name server gone under load (docs/cluster.md, "When every name server is gone"): two name
servers, two store nodes and two proxies as processes. gRPC and MQTT publishers and gRPC
consumers (one group) and MQTT subscribers run on every proxy; both name servers are killed with
`kill -9` for `NAMESRV_OUTAGE_S` seconds (5 here; `make soak` runs 60). Meanwhile:

- sends and pops go on through every proxy, and each proxy's /healthz says `degraded`;
- QueryRoute and QueryAssignment on every proxy answer what they answered before;
- a RocketMQ 5 client (the official Python one) starts and sends through a proxy: its route query
  (QueryRoute) is answered by the proxy; a 4.x client (ali-ons) produces and consumes through the
  proxy's remoting port, route queries included;

then the name servers start again, empty: store nodes and proxies register again, /healthz says
`ok`, and every acknowledged message was consumed (lost 0)."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import os
import time

import grpc
import httpx
import pytest

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from namesrv.client import NameServerClient
from tests.adapters.grpc import support as g
from tests.adapters.remoting.support import alions_missing, received, run
from tests.cluster.load import Load, Official
from tests.cluster.support import Cluster

OUTAGE_S = float(os.environ.get("NAMESRV_OUTAGE_S", "5"))
pytestmark = pytest.mark.timeout(90 + 2 * OUTAGE_S)
OFFICIAL = importlib.util.find_spec("rocketmq") is not None  # found, not imported


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        c.start_namesrvs(2)
        c.start_stores("store-a", "store-b")
        c.start_proxies(2)
        yield c
    finally:
        c.close()


async def health(listeners: dict[str, str]) -> dict:
    async with httpx.AsyncClient() as h:
        r = await h.get(f"http://{listeners['http']}/healthz", timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


async def routes(li: dict[str, str]) -> tuple[int, int]:
    """(queues in QueryRoute, assignments in QueryAssignment) of topic `nsloss` at a proxy."""
    async with grpc.aio.insecure_channel(li["grpc"]) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        topic, group = d.Resource(name="nsloss"), d.Resource(name="g-nsloss")
        r = await stub.QueryRoute(s.QueryRouteRequest(topic=topic), metadata=g.MD)
        assert r.status.code == d.OK, r.status
        a = await stub.QueryAssignment(s.QueryAssignmentRequest(topic=topic, group=group), metadata=g.MD)
        assert a.status.code == d.OK, a.status
        return len(r.message_queues), len(a.assignments)


async def registered(addr: str) -> tuple[set[str], set[str]]:
    """(store nodes, proxies) one name server lists."""
    ns = NameServerClient(addr, timeout=1)
    try:
        info = await ns.cluster_info()
        stores = set((info.get("clusterAddrTable") or {}).get("DefaultCluster", ()))
        return stores, {p["name"] for p in await ns.proxies()}
    except Exception:  # noqa: BLE001 - not up yet
        return set(), set()
    finally:
        await ns.close()


async def until(cond, timeout: float, what: str) -> None:  # noqa: ANN001
    """Wait until `cond()` (a bool or an awaitable of one) holds."""
    deadline = time.monotonic() + timeout
    while not await _value(cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_sends_and_pops_go_on_through_every_proxy_while_every_name_server_is_gone(cluster, tmp_path):
    listeners = [li for _, li in cluster.proxies]
    load = Load(listeners, "nsloss", "g-nsloss")
    official = Official() if OFFICIAL else None
    four_x: list[dict] = []
    try:
        await load.start()
        await until(lambda: all(c.ok for c in load.sent.values()), 10, "every publisher's first ack")
        assert {(await health(li))["status"] for li in listeners} == {"ok"}

        before = await routes(listeners[0])
        assert before[0] > 1 and before[1] == 1  # queues of both store nodes; one "any queue" assignment
        cluster.kill_namesrvs()
        t_kill = time.monotonic()
        for li in listeners:  # each proxy notices at its next route refresh
            await until(lambda li=li: _is(health(li), "degraded"), 5, "a degraded /healthz")
        for li in listeners:  # RocketMQ 5 route and assignment queries: answered by the proxy
            assert await routes(li) == before  # as with the name servers: every queue of both stores
        if official is not None:  # a 5.x client that starts now: routes from the proxy alone
            await official.start(listeners[1]["grpc"], "nsloss", "o")
        if alions_missing() is None:  # a 4.x client: routes from the proxy's remoting port
            home = tmp_path / "home"
            sent = await run("alions", "produce", "--namesrv", listeners[0]["remoting"], "--topic", "nsloss4",
                             "--count", "5", "--prefix", "x", home=home)  # fmt: skip
            assert [e["status"] for e in sent] == ["SEND_OK"] * 5
            got = await run("alions", "consume", "--namesrv", listeners[1]["remoting"], "--topic", "nsloss4",
                            "--group", "g-4x", "--expect", "5", home=home)  # fmt: skip
            four_x = received(got)
            assert sorted(e["body"] for e in four_x) == sorted(e["body"] for e in sent)
        await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - t_kill)))
        t_back = time.monotonic()
        during = {k: c.since(t_kill) - c.since(t_back) for k, c in {**load.sent, **load.popped}.items()}
        for li in listeners:
            assert (await health(li))["status"] == "degraded"

        cluster.restart_namesrvs()
        t_up = time.monotonic()  # the name servers are ready
        for _, addr in cluster.namesrvs:  # refilled: every store node and proxy registered again
            await until(lambda a=addr: _refilled(a, {"store-a", "store-b"}), 10, f"{addr} refilled")
        refill_s = time.monotonic() - t_up
        for li in listeners:
            await until(lambda li=li: _is(health(li), "ok"), 5, "an ok /healthz")
        await until(lambda: all(c.since(t_back) > 0 for c in load.sent.values()), 10, "sends after")
        load.stop_sending()
        official_acked: set[bytes] = set()
        if official is not None:
            await official.stop()
            official_acked = set(official.acked)
            assert official_acked, "the official client's sends were acknowledged during the outage"
            assert not official.failed, official.failed[:5]
        await load.drain(load.acked() | official_acked)
    finally:
        await load.close()
    # during the outage every publisher and every consumer did its work, through both proxies
    assert all(n > 0 for n in during.values()), during
    assert load.failures() == {}, {k: v[:5] for k, v in load.failures().items()}
    lost = load.lost(official_acked)
    assert lost == set(), f"{len(lost)} of {len(load.acked())} lost, e.g. {sorted(lost)[:5]}"
    for name, sub in load.subscribed.items():  # every MQTT subscriber saw every acknowledged send
        missing = load.acked() - {b for _, b in sub.ok}
        assert missing == set(), f"{name} missed {len(missing)}"
    logs = "\n".join(p.output(100_000) for p, _ in cluster.proxies)
    assert "dropped: no longer listed" not in logs  # no proxy let a store node go meanwhile
    print(
        f"outage {OUTAGE_S:g} s: {during}; {len(load.acked())} acknowledged and {len(official_acked)}"
        f" by the official client, 0 lost; 4.x {len(four_x)} received; name servers refilled"
        f" {refill_s:.2f} s after their restart"
    )


async def _value(v):  # noqa: ANN001, ANN202
    return await v if inspect.isawaitable(v) else v


async def _is(h, status: str) -> bool:  # noqa: ANN001
    return (await h)["status"] == status


async def _refilled(addr: str, stores: set[str]) -> bool:
    got_stores, proxies = await registered(addr)
    return got_stores == stores and len(proxies) == 2
