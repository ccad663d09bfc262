"""The disk low-watermark (`--disk-free-limit`) on a real small filesystem (a tmpfs of 48 MiB, or the
test is skipped where it cannot be mounted): with a ballast file taking the space, MQTT 5 publishers
get PUBACK 0x97, AMQP publishers a nack (and connection.blocked), HTTP 503 with problem+json; a
consumer still receives and acks; deleting the ballast lets publishing resume by itself, and every
message acknowledged before is still there."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import aio_pika
import httpx
import paho.mqtt.client as paho
import pytest

from tests.tls.support import start_gateway

LIMIT = 16 << 20
T = 15.0


@pytest.fixture
def small_fs(tmp_path: Path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, ballast: Path, leave: int) -> None:
    """Write `ballast` until `leave` bytes are free on the volume of `path`."""
    with open(ballast, "wb") as f:
        while (room := free_bytes(path) - leave) > 0:
            f.write(bytes(min(room, 1 << 20)))
            f.flush()


def mqtt_publish(port: int, topic: str, payloads: list[bytes]) -> list[int]:
    """QoS 1 publishes from a paho 5.0 client: the PUBACK reason code of each."""
    codes: dict[int, int] = {}
    done = threading.Event()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"disk-{time.monotonic_ns()}", protocol=5)
    mids: list[int] = []

    def on_publish(client, userdata, mid, rc, props):
        codes[mid] = rc.value if hasattr(rc, "value") else int(rc)
        if len(codes) == len(payloads):
            done.set()

    c.on_publish = on_publish
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        mids = [c.publish(topic, p, qos=1).mid for p in payloads]
        assert done.wait(T), "PUBACKs missing"
    finally:
        c.disconnect()
        c.loop_stop()
    return [codes[m] for m in mids]


def read_bodies(http: str, topic: str) -> list[bytes]:
    """Every body of a store topic, through the read API (NDJSON rows)."""
    out: list[bytes] = []
    for q in httpx.get(f"{http}/read/topics/{topic}/queues", timeout=T).json()["queues"]:
        r = httpx.get(
            f"{http}/read/topics/{topic}/queues/{q['queue_id']}/messages",
            headers={"accept": "application/x-ndjson"},
            timeout=T,
        )
        r.raise_for_status()
        out += [base64.b64decode(json.loads(line)["body"]) for line in r.text.splitlines() if line.strip()]
    return out


async def test_disk_watermark_refuses_publishes_and_resumes(small_fs: Path) -> None:
    gw = start_gateway(
        small_fs,
        *("--disk-free-limit", f"{LIMIT}", "--segment-size-mib", "2"),
        *("--max-body-size", "65536", "--amqp-max-body-size", "65536", "--auto-create-topics"),
        protocols="mqtt,amqp,http",
    )
    try:
        mqtt_port = int(gw.listeners["mqtt"].rsplit(":", 1)[1])
        http = f"http://{gw.listeners['http']}"
        before = [f"before-{i}".encode() for i in range(20)]
        assert await asyncio.to_thread(mqtt_publish, mqtt_port, "disk/a", before) == [0] * 20

        conn = await aio_pika.connect_robust(f"amqp://guest:guest@{gw.listeners['amqp']}/")
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue("diskq", durable=True)
        await ch.default_exchange.publish(aio_pika.Message(b"amqp-before"), routing_key="diskq")

        fill(small_fs, small_fs / "ballast", LIMIT // 2)
        await asyncio.sleep(0.3)  # past the watermark's re-read interval (250 ms)

        refused = await asyncio.to_thread(mqtt_publish, mqtt_port, "disk/a", [b"refused"] * 3)
        assert refused == [0x97] * 3, refused
        r = httpx.post(
            f"{http}/topics/disk/events",
            content=b"x",
            headers={"ce-specversion": "1.0", "ce-id": "1", "ce-source": "t", "ce-type": "t"},
        )
        assert r.status_code == 503 and r.headers["content-type"].startswith("application/problem+json")
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await ch.default_exchange.publish(aio_pika.Message(b"amqp-refused"), routing_key="diskq")

        # consumers keep working while publishers are refused: get and ack
        got = await q.get(timeout=T)
        assert got.body == b"amqp-before"
        await got.ack()

        (small_fs / "ballast").unlink()
        deadline = time.monotonic() + T
        while (codes := await asyncio.to_thread(mqtt_publish, mqtt_port, "disk/a", [b"after"])) != [0]:
            assert time.monotonic() < deadline, f"publishing did not resume: {codes}"
        await ch.default_exchange.publish(aio_pika.Message(b"amqp-after"), routing_key="diskq")
        assert (await q.get(timeout=T)).body == b"amqp-after"
        await conn.close()

        # every message acknowledged before the watermark is still there, none of the refused ones
        stored = read_bodies(http, "disk")
        assert set(before) <= set(stored) and b"after" in stored and b"refused" not in stored
    finally:
        assert gw.stop() == 0
