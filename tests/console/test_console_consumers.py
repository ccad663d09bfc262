"""Live consumers of every protocol on the console's group and topic pages (Chromium): an aio-pika
consumer holding an unacked message shows on its queue's group page with channel, prefetch and
unacked count; an aiomqtt client's normal and shared (`$share/...`) subscriptions show with their
filters and QoS, the shared one on its share's group page."""

from __future__ import annotations

import asyncio

import aio_pika
import aiomqtt
import httpx
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.console.support import Console, Shots, address, needs_chromium
from tests.support import T, running_gateway, wait_until

pytestmark = [pytest.mark.timeout(90), needs_chromium]


async def detail_rows(c: Console) -> list[dict[str, str]]:
    """The consumers table, each row's details as name -> value (from their data-k spans)."""
    js = """rows => rows.filter((r) => r.cells.length > 1).map((r) => {
        const out = {protocol: r.cells[0].textContent, client: r.cells[1].textContent,
                     group: r.cells[3].textContent};
        for (const d of r.querySelectorAll(".detail")) out[d.dataset.k] = d.lastChild.textContent.trim();
        return out;
    })"""
    return await c.page.locator("#consumers tbody tr").evaluate_all(js)


async def test_group_and_topic_pages_list_amqp_consumers_and_mqtt_subscriptions(tmp_path, browser):
    async with running_gateway(str(tmp_path / "data"), ("http", "mqtt", "amqp")) as gw:
        await gw.processor.create_topic("plant", 2)
        (mhost, mport), (ahost, aport), (hhost, hport) = (address(gw, n) for n in ("mqtt", "amqp", "http"))
        base = f"http://{hhost}:{hport}"
        amqp = await aio_pika.connect(f"amqp://guest:guest@{ahost}:{aport}/")
        try:
            ch = await amqp.channel()
            await ch.set_qos(prefetch_count=1)
            q = await ch.declare_queue("line-alerts", durable=True)
            for i in range(2):
                await ch.default_exchange.publish(
                    aio_pika.Message(f"alert {i}".encode()), routing_key="line-alerts"
                )
            held = []
            it = q.iterator(timeout=T)
            held.append(await it.__anext__())  # held, not acked: prefetch 1 keeps the second back
            dev = aiomqtt.Client(mhost, mport, identifier="press-8", protocol=aiomqtt.ProtocolVersion.V5)
            async with dev:
                await dev.subscribe("plant/+/temp", qos=1)
                await dev.subscribe("$share/ops/plant/#", qos=2)
                async with httpx.AsyncClient(base_url=base, timeout=T) as http:
                    clients = (await http.get("/admin/clients", params={"protocol": "amqp"})).json()
                    assert [(c["group"], c["details"]["unacked"]) for c in clients] == [("line-alerts", 1)]

                    async def share_group() -> bool:
                        return (await http.get("/admin/groups/mqtt.share.ops")).status_code == 200

                    await wait_until_async(share_group)
                    # a persistent session's subscription: on its session's own group
                    props = Properties(PacketTypes.CONNECT)
                    props.SessionExpiryInterval = 300
                    keeper = aiomqtt.Client(
                        mhost, mport, identifier="keeper-1", protocol=aiomqtt.ProtocolVersion.V5,
                        clean_start=False, properties=props,
                    )  # fmt: skip
                    async with keeper:
                        await keeper.subscribe("plant/#", qos=1)
                        rows = (await http.get("/admin/consumers", params={"topic": "plant"})).json()
                        (kept,) = [r for r in rows if r["client_id"] == "keeper-1"]
                        assert (kept["details"]["filter"], kept["details"]["session"]) == (
                            "plant/#",
                            "persistent",
                        )
                        assert kept["group"] and kept["group"] != "mqtt.share.ops"
                        assert (await http.get(f"/admin/groups/{kept['group']}")).status_code == 200

                c = Console(
                    await browser.new_page(viewport={"width": 1280, "height": 900}), base, Shots(tmp_path)
                )
                await c.open("groups/line-alerts", "group-consumers")
                (row,) = await detail_rows(c)
                assert row["protocol"] == "amqp"
                assert (row["queue"], row["prefetch"], row["unacked"], row["ack"]) == (
                    "line-alerts",
                    "1",
                    "1",
                    "manual",
                )
                assert row["channel"] == str(ch.number)

                await c.open("groups/mqtt.share.ops")
                (row,) = await detail_rows(c)
                assert (row["protocol"], row["client"]) == ("mqtt", "press-8")
                assert (row["filter"], row["qos"], row["share"]) == ("$share/ops/plant/#", "2", "ops")

                await c.open("topics/plant", "topic-consumers")
                rows = sorted(await detail_rows(c), key=lambda r: r["filter"])
                assert [(r["protocol"], r["client"], r["filter"], r["qos"]) for r in rows] == [
                    ("mqtt", "press-8", "$share/ops/plant/#", "2"),
                    ("mqtt", "press-8", "plant/+/temp", "1"),
                ]
                assert [r["group"] for r in rows] == ["mqtt.share.ops", ""]
                assert c.errors == []
            await held[0].ack()
        finally:
            await amqp.close()
        # gone with their connections
        await wait_until(lambda: gw.processor.clients.consumers() == [])


async def wait_until_async(cond, timeout: float = T) -> None:  # noqa: ANN001 - an async predicate
    """Poll an async condition the server announces no event for, until it holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)
