"""MQTT over WebSocket in a real `gateway start` process: a Chromium page (Debian's chromium driven
by Playwright, as tests/console) with MQTT.js (the browser bundle of conformance/clients/node)
subscribes over ws:// and over wss:// and receives what aiomqtt publishes over TCP; paho-mqtt over
wss presents a client certificate whose CN becomes the user (--mqtt-cert-identity); without a
certificate only ws is served and the log says why."""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import threading
import uuid
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiomqtt
import httpx
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.console.support import CHROMIUM, CHROMIUM_ARGS, needs_chromium
from tests.tls.certs import TestCa
from tests.tls.support import port_of, start_gateway

REPO = Path(__file__).resolve().parents[3]
MQTT_JS = REPO / "conformance/clients/node/node_modules/mqtt/dist/mqtt.min.js"
WS = ("--mqtt-ws", "--mqtt-ws-port", "0", "--mqtt-wss-port", "0")
PAGE = """<!doctype html><html><head><script src="/mqtt.min.js"></script></head><body><script>
window.got = [];
window.subscribe = ([url, topic, version]) => new Promise((resolve, reject) => {
  const c = mqtt.connect(url, {protocolVersion: version, reconnectPeriod: 0, connectTimeout: 10000,
                               clientId: "browser-" + Math.random().toString(16).slice(2, 10)});
  c.on("error", (e) => reject(String(e)));
  c.on("close", () => reject("closed before SUBACK"));
  c.on("message", (t, p) => window.got.push([url, t, p.toString()]));
  c.on("connect", () => c.subscribe(topic, {qos: 1}, (e) => (e ? reject(String(e)) : resolve())));
});
</script></body></html>"""


@pytest.fixture
def page_url(tmp_path):
    """The test page and MQTT.js, served over HTTP on loopback (Chromium's local network access
    checks refuse a loopback WebSocket from a page of another address space)."""
    (tmp_path / "index.html").write_text(PAGE)
    (tmp_path / "mqtt.min.js").write_bytes(MQTT_JS.read_bytes())
    handler = functools.partial(QuietHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()
    server.server_close()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _tls_gateway(root: Path, *, cert_identity: bool = False):
    ca = TestCa(root / "ca")
    server = ca.server("server", 1)
    tls = ["--tls-cert", server.cert, "--tls-key", server.key]
    if cert_identity:
        tls += ["--tls-client-ca", ca.cert, "--mqtt-cert-identity"]
    return start_gateway(root, *WS, *tls, protocols="mqtt,http"), ca


@pytest.fixture
def tls_gateway(tmp_path):
    """ws and wss; no client certificates asked for (headless Chromium fails a handshake that asks)."""
    proc, ca = _tls_gateway(tmp_path)
    yield proc, ca
    proc.stop()


@needs_chromium
@pytest.mark.skipif(not MQTT_JS.exists(), reason="MQTT.js missing: `make install-conformance`")
async def test_browser_mqttjs_over_ws_and_wss_gets_an_aiomqtt_publish(tls_gateway, page_url):
    from playwright.async_api import async_playwright

    proc, _ = tls_gateway
    ws_url = f"ws://127.0.0.1:{port_of(proc.listeners['mqtt_ws'])}/mqtt"
    wss_url = f"wss://127.0.0.1:{port_of(proc.listeners['mqtt_wss'])}/mqtt"
    topic = f"browser/{uuid.uuid4().hex[:8]}/temp"
    async with async_playwright() as p:
        # the test CA is not in Chromium's store: its certificate errors are ignored for wss
        browser = await p.chromium.launch(
            executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, "--ignore-certificate-errors"]
        )
        try:
            context = await browser.new_context(ignore_https_errors=True)
            page = await context.new_page()
            await page.goto(page_url)
            await page.evaluate("window.subscribe", [ws_url, topic, 4])  # MQTT 3.1.1 over ws
            await page.evaluate("window.subscribe", [wss_url, topic, 5])  # MQTT 5.0 over wss
            async with aiomqtt.Client("127.0.0.1", port_of(proc.listeners["mqtt"])) as pub:
                await pub.publish(topic, b"hello browser", qos=1)
            await page.wait_for_function("window.got.length >= 2", timeout=10_000)
            got = sorted(map(tuple, await page.evaluate("window.got")))
        finally:
            await browser.close()
    assert got == [(ws_url, topic, "hello browser"), (wss_url, topic, "hello browser")]


async def test_wss_client_certificate_is_the_user(tmp_path):
    proc, ca = _tls_gateway(tmp_path, cert_identity=True)
    client = ca.client("device-42")
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id="cert-client", transport="websockets")
    c.tls_set(ca_certs=ca.cert, certfile=client.cert, keyfile=client.key, cert_reqs=ssl.CERT_REQUIRED)
    connected: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    c.on_connect = lambda _c, _u, _f, rc, _p: loop.call_soon_threadsafe(connected.put_nowait, rc)
    await asyncio.to_thread(c.connect, "localhost", port_of(proc.listeners["mqtt_wss"]), 30)
    c.loop_start()
    try:
        rc = await asyncio.wait_for(connected.get(), 10)
        assert not rc.is_failure, rc
        async with httpx.AsyncClient(base_url=f"http://{proc.listeners['http']}") as http:
            r = await http.get("/admin/connections")
        assert r.status_code == 200, r.text
        rows = [row for row in r.json() if row.get("client_id") == "cert-client"]
        assert [row["user"] for row in rows] == ["device-42"], json.dumps(r.json())
    finally:
        c.disconnect()
        c.loop_stop()
        proc.stop()


def test_without_a_certificate_only_ws_is_served(tmp_path):
    proc = start_gateway(tmp_path, *WS, protocols="mqtt,http")
    try:
        assert "mqtt_ws" in proc.listeners and "mqtt_wss" not in proc.listeners, proc.listeners
        assert "mqtt_wss (MQTT over secure WebSocket) not started: no --tls-cert" in proc.output()
    finally:
        proc.stop()
