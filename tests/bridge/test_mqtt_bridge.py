"""MQTT links with a real Mosquitto and an in-process gateway: both directions, topic filters, QoS,
prefix remapping, persistent and clean sessions on the far side, at-least-once across a
reconnect, the gateway's /metrics."""

from __future__ import annotations

import asyncio

import aiomqtt
import httpx

from tests.bridge.conftest import link, needs_mosquitto, running
from tests.support import T, running_gateway

pytestmark = needs_mosquitto


async def collect(client: aiomqtt.Client, n: int, timeout: float = T) -> list[aiomqtt.Message]:
    out: list[aiomqtt.Message] = []

    async def run() -> None:
        async for m in client.messages:
            out.append(m)
            if len(out) >= n:
                return

    await asyncio.wait_for(run(), timeout)
    return out


async def test_far_to_gateway_filters_qos_and_prefix_remap(mosquitto, gateway):
    cfg = link(
        "edge-in",
        {"url": f"mqtt://127.0.0.1:{mosquitto.port}"},
        {"url": f"mqtt://127.0.0.1:{gateway.ports['mqtt']}"},
        [{"filter": "sensors/+/temp", "qos": 1, "from_prefix": "site1/", "to_prefix": "plant/"}],
    )
    async with (
        aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-sub") as sub,
        aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="far-pub") as pub,
    ):
        await sub.subscribe("plant/#", qos=1)
        async with running(cfg) as b:
            await pub.publish("site1/sensors/a/temp", b"21.5", qos=1)
            await pub.publish("site1/sensors/a/humidity", b"no", qos=1)  # not in the filter
            await pub.publish("site2/sensors/a/temp", b"no", qos=1)  # other prefix
            await pub.publish("site1/sensors/b/temp", b"19.0", qos=0)
            got = await collect(sub, 2)
            assert sorted((str(m.topic), m.payload) for m in got) == [  # (two paths: no order between them)
                ("plant/sensors/a/temp", b"21.5"),
                ("plant/sensors/b/temp", b"19.0"),
            ]
            await asyncio.wait_for(_until(lambda: b.snapshot()[0]["forwarded"] == 2), T)
            snap = b.snapshot()[0]
            assert snap["up"] and snap["received"] == 2 and snap["dropped"] == 0


async def test_gateway_to_far_clean_session_and_qos0(mosquitto, gateway):
    cfg = link(
        "cloud-out",
        {"url": f"mqtt://127.0.0.1:{gateway.ports['mqtt']}"},
        {"url": f"mqtt://127.0.0.1:{mosquitto.port}", "qos": 0, "clean_session": True},
        [{"filter": "#", "from_prefix": "out/", "to_prefix": "cloud/gw1/"}],
    )
    async with (
        aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="far-sub") as sub,
        aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-pub") as pub,
    ):
        await sub.subscribe("cloud/#", qos=1)
        async with running(cfg):
            for i in range(20):
                await pub.publish(f"out/dev{i % 3}/v", str(i).encode(), qos=1)
            got = await collect(sub, 20)
            assert sorted(int(m.payload) for m in got) == list(range(20))
            assert {str(m.topic) for m in got} == {f"cloud/gw1/dev{i}/v" for i in range(3)}
            assert all(m.qos == 0 for m in got)  # the link's destination QoS


async def test_persistent_source_session_keeps_what_came_while_the_link_was_down(mosquitto, gateway):
    """The far side's session outlives the link: messages published while it is stopped arrive
    when it runs again (Mosquitto queues them for `bridge-<name>-src`)."""
    cfg = link(
        "persist",
        {"url": f"mqtt://127.0.0.1:{mosquitto.port}"},
        {"url": f"mqtt://127.0.0.1:{gateway.ports['mqtt']}"},
        [{"filter": "p/#"}],
    )
    async with aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-sub") as sub:
        await sub.subscribe("p/#", qos=1)
        async with running(cfg):
            pass  # the session and its subscription now exist at Mosquitto
        async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="far-pub") as pub:
            for i in range(50):
                await pub.publish("p/x", str(i).encode(), qos=1)
        async with running(cfg):
            got = await collect(sub, 50)
        assert [int(m.payload) for m in got] == list(range(50))


async def test_clean_source_session_forgets(mosquitto, gateway):
    cfg = link(
        "clean",
        {"url": f"mqtt://127.0.0.1:{mosquitto.port}", "clean_session": True},
        {"url": f"mqtt://127.0.0.1:{gateway.ports['mqtt']}"},
        [{"filter": "c/#"}],
    )
    async with aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-sub") as sub:
        await sub.subscribe("c/#", qos=1)
        async with running(cfg):
            pass
        async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="far-pub") as pub:
            await pub.publish("c/lost", b"while down", qos=1)
        async with running(cfg), aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="far-pub") as pub:
            await pub.publish("c/kept", b"while up", qos=1)
            got = await collect(sub, 1)
        assert [(str(m.topic), m.payload) for m in got] == [("c/kept", b"while up")]
        assert len(sub.messages) == 0  # nothing else arrived


async def test_mqtt5_far_side_user_properties(mosquitto, gateway):
    cfg = link(
        "v5",
        {"url": f"mqtt://127.0.0.1:{gateway.ports['mqtt']}", "mqtt_version": "5"},
        {"url": f"mqtt://127.0.0.1:{mosquitto.port}", "mqtt_version": "5"},
        [{"filter": "v5/#"}],
    )
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    v5 = aiomqtt.ProtocolVersion.V5
    async with (
        aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="far-sub", protocol=v5) as sub,
        aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-pub", protocol=v5) as pub,
    ):
        await sub.subscribe("v5/#", qos=1)
        async with running(cfg):
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = [("k", "v")]
            props.ContentType = "text/plain"
            await pub.publish("v5/a", b"x", qos=1, properties=props)
            (m,) = await collect(sub, 1)
        assert m.properties.ContentType == "text/plain"
        assert ("k", "v") in m.properties.UserProperty


async def test_embedded_bridge_in_gateway_config_and_metrics(mosquitto, tmp_path):
    """`[[bridge]]` in the gateway's settings: `gateway:mqtt` is its own listener; the link's
    status and counters are in the gateway's /metrics."""
    from bridge.config import parse_bridges

    bridges = parse_bridges(
        [
            {
                "name": "emb",
                "from": {"url": f"mqtt://127.0.0.1:{mosquitto.port}"},
                "to": {"url": "gateway:mqtt"},
                "topic": [{"filter": "e/#"}],
            }
        ]
    )
    async with running_gateway(str(tmp_path / "gw"), ("mqtt", "http"), bridge=bridges) as g:
        port = {a.name: int(a.address.rsplit(":", 1)[1]) for a in g.adapters}
        link_ = g.bridges.links[0]
        await asyncio.wait_for(link_.up.wait(), T)
        async with (
            aiomqtt.Client("127.0.0.1", port["mqtt"], identifier="gw-sub") as sub,
            aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="far-pub") as pub,
        ):
            await sub.subscribe("e/#", qos=1)
            await pub.publish("e/1", b"a", qos=1)
            await collect(sub, 1)
        await asyncio.wait_for(_until(lambda: link_.state.forwarded == 1), T)  # (acked after the PUBACK)
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{port['http']}/metrics")).text
            overview = (await http.get(f"http://127.0.0.1:{port['http']}/admin/overview")).json()
        assert 'gateway_bridge_up{bridge="emb"} 1' in text
        assert 'gateway_bridge_forwarded_total{bridge="emb"} 1' in text
        (shown,) = overview["bridges"]  # the console's overview lists the links
        assert (shown["name"], shown["state"], shown["forwarded"]) == ("emb", "up", 1)
        mosquitto.kill9()
        await asyncio.wait_for(_until(lambda: not link_.up.is_set()), T)
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{port['http']}/metrics")).text
        assert 'gateway_bridge_up{bridge="emb"} 0' in text


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.01)
