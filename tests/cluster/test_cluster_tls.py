"""TLS on the cluster's own ports (docs/security.md, "Closed cluster"): a name server and a store
node started with `--tls-cert` serve TLS only; the store node (`--cluster-tls-ca`) registers over
TLS and a proxy (`--cluster-tls-ca`) finds and uses it: MQTT publish and consume through the proxy
work. A plain client is refused by both ports, and a TLS client that does not trust the CA fails its
handshake. In process: a store node that requires client certificates serves a client presenting
one signed by its `tls_client_ca` and refuses one without."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import aiomqtt
import pytest

from cluster import store_wire as w
from cluster.store_node import StoreNode, StoreNodeConfig
from conformance.gateway_proc import GatewayProc as Proc
from namesrv.client import NameServerClient
from remoting import ResponseCode, parse_host_port
from remoting.client import RemotingClient, RemotingClientError
from runtime.tls import ServerTls, TlsFiles, client_context
from store import Store, StoreConfig
from tests.cluster.support import LEASE, Cluster
from tests.tls.certs import TestCa

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> TestCa:
    return TestCa(tmp_path_factory.mktemp("cluster-ca"))


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, ca):
    server = ca.server("cluster", 2)
    cert = ("--tls-cert", server.cert, "--tls-key", server.key)
    c = Cluster(tmp_path_factory.mktemp("tls-cluster"))
    try:
        ns = Proc(["namesrv", "--port", "0", *LEASE, "--scan-interval-s", "0.2", *cert], "namesrv")
        c.procs.append(ns)
        c.namesrv = ns.wait_ready(60)["namesrv"]
        c.start_stores("store-a", extra=(*cert, "--cluster-tls-ca", ca.cert))
        c.start_proxies(1, "mqtt", extra=("--cluster-tls-ca", ca.cert))
        yield c
    finally:
        c.close()


async def test_publish_and_consume_through_a_tls_cluster(tls_cluster, ca):
    ((_, listeners),) = tls_cluster.proxies
    host, port = listeners["mqtt"].rsplit(":", 1)
    async with aiomqtt.Client(host, int(port), identifier="tls-sub") as sub:
        await sub.subscribe("sealed/#", qos=1)
        async with aiomqtt.Client(host, int(port), identifier="tls-pub") as pub:
            for i in range(5):
                await pub.publish(f"sealed/{i}", f"m{i}".encode(), qos=1)
        got: list[bytes] = []

        async def read() -> None:
            async for m in sub.messages:
                got.append(m.payload)
                if len(got) == 5:
                    return

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(read(), 15)
    assert sorted(got) == [f"m{i}".encode() for i in range(5)]
    ns = NameServerClient(tls_cluster.namesrv, tls=client_context(ca.cert))
    try:
        assert set((await ns.cluster_info())["brokerAddrTable"]) == {"store-a"}
        assert len(await ns.proxies()) == 1
    finally:
        await ns.close()


async def test_plain_clients_are_refused(tls_cluster):
    _, store_addr = tls_cluster.stores["store-a"]
    for addr in (tls_cluster.namesrv, store_addr):
        host, port = parse_host_port(addr, 0)
        c = await RemotingClient.connect(host, port)
        try:
            with pytest.raises(RemotingClientError):
                await c.invoke(w.OPS["ping"], timeout=5)  # not a TLS record: the server closes
        finally:
            await c.close()


async def test_a_client_that_does_not_trust_the_ca_fails_its_handshake(tls_cluster):
    host, port = parse_host_port(tls_cluster.namesrv, 0)
    with pytest.raises(ssl.SSLCertVerificationError):
        await RemotingClient.connect(host, port, ssl=ssl.create_default_context())  # system CAs only


async def test_a_store_node_requiring_client_certificates(tmp_path, ca):
    server = ca.server("mtls", 3)
    files = TlsFiles(server.cert, server.key, client_ca=ca.cert, require_client_cert=True)
    store = await Store.open(StoreConfig(data_dir=str(tmp_path / "data")))
    node = StoreNode(StoreNodeConfig("mtls", port=0, tls=ServerTls(files).context()), store)
    await node.start()
    try:
        host, port = parse_host_port(node.address, 0)
        proxy = ca.client("proxy")
        with_cert = await RemotingClient.connect(
            host, port, ssl=client_context(ca.cert, proxy.cert, proxy.key)
        )
        try:
            assert (await with_cert.invoke(w.OPS["ping"], timeout=5)).code == ResponseCode.SUCCESS
        finally:
            await with_cert.close()
        with pytest.raises((ssl.SSLError, RemotingClientError, ConnectionError)):
            without = await RemotingClient.connect(host, port, ssl=client_context(ca.cert))
            try:  # TLS 1.3: the server's refusal arrives after the client's handshake
                await without.invoke(w.OPS["ping"], timeout=5)
            finally:
                await without.close()
    finally:
        await node.stop(0)
        await store.close()
