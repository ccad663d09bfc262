"""The web console in a real headless browser (Debian's Chromium driven by Playwright): real MQTT
(aiomqtt) and AMQP (aio-pika) clients publish and consume through an in-process gateway, and the
pages show what they did; closing a connection from the console closes it for the client. One
screenshot per page is kept (tests/console/support.py)."""

from __future__ import annotations

import asyncio

import aio_pika
import aiomqtt
import httpx
import pytest

from gateway.config import Settings
from gateway.server import Gateway
from tests.console.support import Console, Shots, address, needs_chromium
from tests.support import wait_until

pytestmark = [pytest.mark.timeout(90), needs_chromium]


@pytest.fixture
async def gw(tmp_path):
    g = Gateway(
        Settings(
            data_dir=str(tmp_path / "data"),
            protocols=("http", "mqtt", "amqp"),
            http_port=0,
            mqtt_port=0,
            amqp_port=0,
            flush="async",
            default_queues=2,
        )
    )
    await g.start()
    try:
        yield g
    finally:
        await g.stop()


@pytest.fixture
async def console(gw, browser, tmp_path):
    page = await browser.new_page(viewport={"width": 1280, "height": 860})
    host, port = address(gw, "http")
    c = Console(page, f"http://{host}:{port}", Shots(tmp_path))
    yield c
    assert c.errors == []  # no script error on any page


async def test_overview_topics_groups_and_connections_pages(gw, console):
    mhost, mport = address(gw, "mqtt")
    ahost, aport = address(gw, "amqp")
    await gw.processor.create_topic("plant", 2)
    amqp = await aio_pika.connect(f"amqp://guest:guest@{ahost}:{aport}/")
    try:
        ch = await amqp.channel()
        q = await ch.declare_queue("line-alerts", durable=True)
        await q.bind("amq.topic", "plant.#")
        async with aiomqtt.Client(mhost, mport, identifier="press-7") as dev:
            for i in range(5):
                await dev.publish("plant/press7/temp", f'{{"t": {20 + i}}}'.encode(), qos=1)
            await ch.default_exchange.publish(aio_pika.Message(b"from amqp"), routing_key="line-alerts")
            await wait_until(lambda: gw.processor.metrics.messages_in.total() >= 6)

            text = await console.open("", "overview")
            assert "Topics" in text and "Connections" in text
            rows = await console.page.locator("#protocols tbody tr").all_inner_texts()
            by_proto = {r.split("\t")[0]: r.split("\t") for r in rows}
            assert int(by_proto["mqtt"][4].replace(",", "")) >= 5  # messages in
            assert int(by_proto["mqtt"][1]) >= 1 and int(by_proto["amqp"][1]) >= 1  # connections

            text = await console.open("topics", "topics")
            row = await console.page.locator("#topics tbody tr", has_text="plant").inner_text()
            assert "plant" in row and "5" in row.split("\t")[2]

            text = await console.open("topics/plant", "topic")
            assert "Browse messages" in text

            text = await console.open("connections", "connections")
            rows = await console.page.locator("#connections tbody tr").all_inner_texts()
            mqtt_row = next(r for r in rows if r.startswith("mqtt"))
            assert "press-7" in mqtt_row and mqtt_row.split("\t")[5] == "5"  # 5 PUBLISH in
            assert any(r.startswith("amqp") for r in rows)
            # close the device's connection from the console: the client sees it end (5.0: 0x98)
            console.page.once("dialog", lambda d: asyncio.ensure_future(d.accept()))
            await console.page.locator("#connections tr", has_text="press-7").locator("button").click()
            await wait_until(lambda: not any(c["client_id"] == "press-7" for c in _mqtt_conns(gw)))
            with pytest.raises(aiomqtt.MqttError):
                await dev.publish("plant/press7/temp", b"after close", qos=1, timeout=5)
    finally:
        await amqp.close()

    # a consumer group with a backlog: the groups page shows its lag per queue
    await gw.processor.create_group("G-PLANT", 3, None)
    await gw.processor.commit_offset(gw_ctx(), "G-PLANT", "plant", 0, 0)
    text = await console.open("groups", "groups")
    assert "G-PLANT" in text
    text = await console.open("groups/G-PLANT", "group")
    lag = await console.page.locator("#lag-plant tbody tr").all_inner_texts()
    assert sum(int(r.split("\t")[4].replace(",", "")) for r in lag) == 5  # the 5 MQTT messages of plant


async def until_async(cond, timeout: float = 10.0) -> None:  # noqa: ANN001 - an async predicate
    """Poll an async condition the server changes without telling us, until it holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def _mqtt_conns(gw: Gateway) -> list[dict]:
    return next(a for a in gw.adapters if a.name == "mqtt").connections_info()


def gw_ctx():
    from messaging_processor import ClientContext

    return ClientContext("test", client_id="console-test")


async def test_console_logs_in_with_the_admin_api_identities(tmp_path, monkeypatch, browser):
    """With auth on, the console asks for credentials (HTTP Basic, as the admin API) and the users
    and ACL page lists the gateway's users and rules; without credentials nothing is shown."""
    monkeypatch.setenv("GATEWAY_ADMIN_PASSWORD", "admin-pw-Zq8")
    g = Gateway(
        Settings(data_dir=str(tmp_path / "data"), flush="async", protocols="http", http_port=0, auth=True)
    )
    await g.start()
    try:
        (http,) = g.adapters
        base = f"http://{http.address}"
        async with httpx.AsyncClient(base_url=base) as anon:  # (headless Chromium cannot show the prompt)
            r = await anon.get("/console")
            assert (
                r.status_code == 401 and r.headers.get_list("www-authenticate")[0] == 'Basic realm="gateway"'
            )
        ctx = await browser.new_context(http_credentials={"username": "admin", "password": "admin-pw-Zq8"})
        page = await ctx.new_page()
        c = Console(page, base, Shots(tmp_path))
        async with httpx.AsyncClient(base_url=base, auth=("admin", "admin-pw-Zq8")) as admin:
            r = await admin.post(
                "/admin/users", json={"name": "ops", "password": "ops-pw-Zq8", "role": "user"}
            )
            assert r.status_code == 201, r.text
            r = await admin.post(
                "/admin/acl",
                json={
                    "subject": "user:ops",
                    "kind": "topic",
                    "pattern": "plant/#",
                    "actions": ["publish"],
                    "effect": "allow",
                },  # fmt: skip
            )
            assert r.status_code == 201, r.text
        text = await c.open("users", "users")
        assert "ops" in text and "plant/#" in text
        assert c.errors == []
        await ctx.close()
    finally:
        await g.stop()


async def test_message_browser_trace_timeline_and_dlq_redrive(gw, console):
    """An MQTT device publishes and an AMQP publisher sends to a queue whose consumer keeps
    requeueing until the store dead-letters the message; the message browser shows both messages,
    the trace page shows the AMQP message's lifecycle, and redrive from the dead-letter page moves
    it back, where an AMQP consumer receives it."""
    import pika

    mhost, mport = address(gw, "mqtt")
    ahost, aport = address(gw, "amqp")
    queue = "alerts"
    async with aiomqtt.Client(mhost, mport, identifier="press-9") as dev:
        await dev.publish("plant/press9/temp", b'{"t": 71.5}', qos=1)

    def publish() -> None:
        conn = pika.BlockingConnection(pika.ConnectionParameters(ahost, aport))
        try:
            ch = conn.channel()
            ch.queue_declare(queue, durable=True)
            ch.confirm_delivery()
            ch.basic_publish("", queue, b"overheated press 9", mandatory=True)
        finally:
            conn.close()

    await asyncio.to_thread(publish)
    await gw.processor.create_group(queue, 2, None)  # the queue's group: dead-lettered after 2 attempts
    amqp = await aio_pika.connect(f"amqp://guest:guest@{ahost}:{aport}/")
    try:
        ch = await amqp.channel()
        await ch.set_qos(prefetch_count=1)
        q = await ch.get_queue(queue)
        deliveries = 0
        async with q.iterator() as it:
            async for m in it:
                await m.nack(requeue=True)
                deliveries += 1
                if deliveries == 2:  # the group's max attempts: the store moves it on its next pop
                    break
    finally:
        await amqp.close()
    await until_async(lambda: gw.processor.dead_letters(queue))

    # the message browser: the MQTT message in its topic, as JSON, with how each protocol sees it
    text = await console.open("messages?topic=plant&format=json", "messages")
    assert '"t": 71.5' in text and '"topic": "plant/press9/temp"' in text
    # the dead letter, then its trace
    text = await console.open(f"dlq?group={queue}", "dlq")
    row = console.page.locator("#dead-letters tbody tr", has_text=queue)
    assert "max attempts reached" in await row.inner_text()
    dead_id = (await row.inner_text()).split("\t")[1].strip()
    text = await console.open(f"trace/{dead_id}", "trace")
    events = await console.page.locator("#timeline li").evaluate_all("els => els.map(e => e.dataset.event)")
    assert events[:2] == ["received", "stored"] and events.count("delivered") == 2
    assert "dead_lettered" in events
    assert "amqp" in await console.page.locator("#timeline li[data-event=received]").inner_text()
    # redrive it from the console: an AMQP consumer receives it again
    await console.open(f"dlq?group={queue}")
    await console.page.locator("#dead-letters tbody tr", has_text=queue).locator("input.pick").check()
    await console.page.click("#redrive")
    await console.page.wait_for_selector("#toast:has-text('redriven 1')")
    amqp = await aio_pika.connect(f"amqp://guest:guest@{ahost}:{aport}/")
    try:
        ch = await amqp.channel()
        q = await ch.get_queue(queue)
        async with q.iterator(timeout=10) as it:
            async for got in it:
                assert got.body == b"overheated press 9"
                await got.ack()
                break
    finally:
        await amqp.close()
    text = await console.open(f"dlq?group={queue}")
    assert (
        "yes" in await console.page.locator("#dead-letters tbody tr", has_text=queue).inner_text()
    )  # redriven
