"""`gateway bridge --config FILE` as a process of its own, and the far broker's failures:

- `kill -9` of the bridge process mid-stream (Mosquitto -> gateway): a new process finishes the
  job from the persistent session; every message arrives, duplicates at most the link's window;
- `kill -9` of Mosquitto mid-stream (its database saved beforehand): the link reconnects with
  backoff to the restarted broker, nothing is lost;
- TLS to Mosquitto with a client certificate, the password from a file (a wrong one is refused);
- the process's `--metrics-port` (/metrics, /bridges)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiomqtt
import httpx

from tests.bridge.conftest import link, needs_mosquitto, running
from tests.bridge.peers import Mosquitto, free_port
from tests.support import T
from tests.tls.certs import TestCa

pytestmark = needs_mosquitto
ROOT = Path(__file__).resolve().parents[2]


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


class BridgeProcess:
    """`python -m gateway.cli bridge --config FILE --metrics-port P`, its output in a file."""

    def __init__(self, config: Path, workdir: Path) -> None:
        self.config, self.metrics_port = config, free_port()
        self.log = workdir / f"bridge-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "bridge", "--config", str(config)]
                + ["--metrics-port", str(self.metrics_port)],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    async def status(self) -> list[dict]:
        async with httpx.AsyncClient() as http:
            r = await http.get(f"http://127.0.0.1:{self.metrics_port}/bridges", timeout=2)
            return r.json()

    async def metrics(self) -> str:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2)).text

    async def wait_up(self, timeout: float = 20) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if all(s["up"] for s in await self.status()):
                    return
            except (httpx.HTTPError, json.JSONDecodeError):
                pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"bridge not up:\n{self.log.read_text()}")

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            return self.proc.wait(10)
        return self.proc.returncode


class Counter:
    """An MQTT subscriber of the gateway counting payloads (integers) as they arrive."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.changed = asyncio.Event()

    async def run(self, client: aiomqtt.Client) -> None:
        async for m in client.messages:
            self.seen.append(int(m.payload))
            self.changed.set()

    async def wait(self, cond, timeout: float = 30) -> None:
        async def loop() -> None:
            while not cond():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(loop(), timeout)


async def publish(port: int, topic: str, n: int, **kw) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{time.monotonic_ns()}", **kw) as pub:
        for i in range(n):
            await pub.publish(topic, str(i).encode(), qos=1)


async def test_kill9_of_the_bridge_process_loses_nothing(mosquitto, gateway, tmp_path):
    total, inflight = 3000, 64
    cfg = write_config(
        tmp_path / "bridge.toml",
        f"""
[[bridge]]
name = "edge"
inflight = {inflight}
reconnect_min_s = 0.05
from = {{ url = "mqtt://127.0.0.1:{mosquitto.port}" }}
to = {{ url = "mqtt://127.0.0.1:{gateway.ports["mqtt"]}" }}
[[bridge.topic]]
filter = "k/#"
""",
    )
    counter = Counter()
    async with aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-sub") as sub:
        await sub.subscribe("k/#", qos=1)
        reading = asyncio.create_task(counter.run(sub))
        first = BridgeProcess(cfg, tmp_path)
        await first.wait_up()
        publishing = asyncio.create_task(publish(mosquitto.port, "k/x", total))
        await counter.wait(lambda: len(counter.seen) >= total // 4)
        first.kill9()
        at_kill = len(set(counter.seen))
        assert at_kill < total  # mid-stream
        second = BridgeProcess(cfg, tmp_path)
        await publishing
        await counter.wait(lambda: len(set(counter.seen)) == total)
        text = await second.metrics()
        assert second.stop() == 0
        reading.cancel()
    dups = len(counter.seen) - total
    print(f"bridge kill -9: {total} messages, killed after {at_kill}, {dups} duplicates")
    assert sorted(set(counter.seen)) == list(range(total))
    assert 0 <= dups <= inflight  # what was forwarded and not yet PUBACKed at the kill
    assert 'gateway_bridge_up{bridge="edge"} 1' in text


async def test_kill9_of_mosquitto_loses_nothing_it_had_saved(gateway, tmp_path):
    """Messages are queued for the link's persistent session and saved (a clean restart); then
    the link runs and Mosquitto is killed with SIGKILL mid-stream and started again on the same
    port and database: every message reaches the gateway."""
    total, inflight, autosave = 3000, 10, 20
    far = Mosquitto(tmp_path / "far", autosave_changes=autosave).start()
    try:
        cfg = link(
            "far",
            {"url": f"mqtt://127.0.0.1:{far.port}"},
            {"url": f"mqtt://127.0.0.1:{gateway.ports['mqtt']}"},
            [{"filter": "f/#"}],
            inflight=inflight,
            reconnect_min_s=0.05,
            reconnect_max_s=0.3,
        )
        async with running(cfg):
            pass  # the session exists
        await publish(far.port, "f/x", total)
        far.stop()  # saves the database
        far.start()
        counter = Counter()
        async with aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-sub") as sub:
            await sub.subscribe("f/#", qos=1)
            reading = asyncio.create_task(counter.run(sub))
            async with running(cfg) as b:
                st = b.links[0].state
                await counter.wait(lambda: len(counter.seen) >= 100)
                far.kill9()
                at_kill = st.forwarded
                assert at_kill < total  # mid-stream
                far.start()
                await counter.wait(lambda: len(set(counter.seen)) == total)
                assert st.connect_failures >= 1 and st.connects >= 2
            reading.cancel()
    finally:
        far.stop()
    dups = len(counter.seen) - total
    print(f"mosquitto kill -9: {total} messages, killed after {at_kill}, {dups} duplicates")
    assert sorted(set(counter.seen)) == list(range(total))
    # acks Mosquitto had not saved yet (< `autosave` changes), what the link had forwarded and not
    # acked (its window), with a margin of Mosquitto's own in-flight window (20)
    assert 0 <= dups <= autosave + inflight + 20


async def test_tls_client_certificate_and_password_file(tmp_path, gateway):
    ca = TestCa(tmp_path / "ca")
    server, client = ca.server("mosquitto", 10), ca.client("bridge")
    far = Mosquitto(tmp_path / "far", tls=(ca.cert, server.cert, server.key), passwords={"edge": "s3cret"})
    far.start()
    try:
        good, bad = tmp_path / "pw", tmp_path / "bad"
        good.write_text("s3cret\n")
        bad.write_text("wrong\n")
        ep = {
            "url": f"mqtts://127.0.0.1:{far.tls_port}",
            "username": "edge",
            "password_file": str(bad),
            "ca_file": ca.cert,
            "cert_file": client.cert,
            "key_file": client.key,
        }
        to = {"url": f"mqtt://127.0.0.1:{gateway.ports['mqtt']}"}
        refused = link("tls", ep, to, [{"filter": "t/#"}], reconnect_min_s=0.05, reconnect_max_s=0.1)
        from bridge import Bridges

        b = Bridges([refused])
        b.start()
        try:
            st = b.links[0].state
            await asyncio.wait_for(_until(lambda: st.connect_failures >= 2), T)
            assert st.connects == 0 and not b.links[0].up.is_set()
        finally:
            await b.stop()
        ok = link("tls", ep | {"password_file": str(good)}, to, [{"filter": "t/#"}])
        async with aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-sub") as sub:
            await sub.subscribe("t/#", qos=1)
            async with running(ok):
                await publish(far.port, "t/1", 1, username="edge", password="s3cret")
                m = await asyncio.wait_for(anext(aiter(sub.messages)), T)
        assert (str(m.topic), m.payload) == ("t/1", b"0")
    finally:
        far.stop()


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.01)
