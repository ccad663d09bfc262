"""The outbound bound per connection (docs/limits.md "Memory per connection") against a real gateway
process: a subscriber that connects, subscribes and then never reads does not grow the gateway's
memory by more than the bound plus a measured slack while a publisher sends tens of MB through it; a
second subscriber on the same topic keeps receiving everything; when the stuck one reads again it gets
its messages (MQTT QoS 1 persistent session: all of them; MQTT QoS 0 clean session: what was buffered
and what comes after; AMQP no-ack consumer: what it was written, the rest went to the other consumer).

Memory is the gateway's anonymous resident memory (`RssAnon` of /proc/PID/status): the commit log is
memory-mapped, so `VmRSS` also counts page-cache pages of the segments written, which the kernel
reclaims and which do not depend on any client."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import paho.mqtt.client as paho
import pika

from adapters.grpc.codes import Code
from adapters.grpc.generated import service_pb2_grpc
from adapters.mqtt.codec import Connect, Subscribe, Subscription, encode_connect, encode_subscribe
from tests.adapters.grpc.support import ack, msg, receive, send
from tests.tls.support import port_of, start_gateway

REPO = Path(__file__).resolve().parents[2]

MIB = 1 << 20
BOUND = 1 * MIB
SIZE = 64 * 1024  # body bytes of each message
# What the gateway's anonymous memory may grow by besides the bound: the messages of the pops in flight
# (the publisher's and the healthy subscriber's, each up to a store batch), the allocator keeping
# freed blocks, the publisher's unacked window. Measured peaks: see docs/limits.md.
SLACK = 24 * MIB
PUBACK = 0x40


def rss_anon(pid: int) -> int:
    """The process's anonymous resident memory, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc status")


class PeakMemory:
    """Samples `rss_anon(pid)` every 20 ms on a thread until `stop()`; `peak` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_anon(pid)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.02):
            self.peak = max(self.peak, rss_anon(self.pid))

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


class RawMqtt:
    """An MQTT 3.1.1 subscriber on a bare socket: it reads only when asked to (`receive`)."""

    def __init__(self, port: int, client_id: str, *, clean: bool, rcvbuf: int = 64 * 1024) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: a small window
        self.sock.connect(("127.0.0.1", port))
        self.buf = bytearray()
        self.sock.sendall(encode_connect(Connect(client_id, clean_start=clean, keep_alive=0)))
        assert self._packet(10.0)[0] >> 4 == 2  # CONNACK

    def subscribe(self, topic_filter: str, qos: int) -> None:
        self.sock.sendall(encode_subscribe(Subscribe(1, [Subscription(topic_filter, qos)])))
        while self._packet(10.0)[0] >> 4 != 9:  # SUBACK
            pass

    def _packet(self, timeout: float) -> tuple[int, bytes]:
        """The next packet (first byte, body); raises TimeoutError."""
        self.sock.settimeout(timeout)
        while True:
            b = self.buf
            if len(b) >= 2:
                n, mult, i = 0, 1, 1
                while i < len(b) and i <= 4:
                    n += (b[i] & 0x7F) * mult
                    mult <<= 7
                    i += 1
                    if not b[i - 1] & 0x80:
                        if len(b) >= i + n:
                            first, body = b[0], bytes(b[i : i + n])
                            del b[: i + n]
                            return first, body
                        break
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed by the gateway")
            b += chunk

    def receive(self, want: int, timeout: float) -> list[int]:
        """Read PUBLISHes (acking QoS 1) until `want` arrived or nothing came for `timeout` s; the
        message numbers (each payload starts with one)."""
        got: list[int] = []
        while len(got) < want:
            try:
                first, body = self._packet(timeout)
            except TimeoutError:
                break
            if first >> 4 != 3:
                continue
            tlen = struct.unpack_from(">H", body)[0]
            at = 2 + tlen
            if (first >> 1) & 3:
                self.sock.sendall(bytes((PUBACK, 2)) + body[at : at + 2])
                at += 2
            got.append(int.from_bytes(body[at : at + 8], "big"))
        return got

    def close(self) -> None:
        self.sock.close()


def publish(port: int, topic: str, first: int, count: int, size: int = SIZE) -> None:
    """Publish messages `first`..`first+count-1` at QoS 1, each `size` bytes long, with a window of
    2 MiB (what the gateway holds for the publisher)."""
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"pub-{first}")
    window = max(1, 2 * MIB // size)
    c.max_inflight_messages_set(window)
    c.connect("127.0.0.1", port)
    c.loop_start()
    pad = b"p" * (size - 8)
    infos = []
    for i in range(first, first + count):
        infos.append(c.publish(topic, i.to_bytes(8, "big") + pad, qos=1))
        if len(infos) >= 2 * window:
            infos.pop(0).wait_for_publish(30)
    for info in infos:
        info.wait_for_publish(30)
    c.disconnect()
    c.loop_stop()


def healthy_reader(sub: RawMqtt, want: int, out: list[int]) -> threading.Thread:
    t = threading.Thread(target=lambda: out.extend(sub.receive(want, 20.0)), daemon=True)
    t.start()
    return t


def mqtt_case(tmp_path: Path, qos: int, total: int, size: int) -> None:
    gw = start_gateway(
        tmp_path,
        *("--max-outbound-bytes-per-connection", str(BOUND), "--auto-create-topics"),
        protocols="mqtt,http",
    )
    try:
        port = port_of(gw.listeners["mqtt"])
        # QoS 1 asks for a persistent session: its backlog may wait in the store. QoS 0 is a clean one.
        stuck = RawMqtt(port, f"stuck{qos}", clean=qos == 0)
        stuck.subscribe("mem/#", qos)
        good = RawMqtt(port, f"good{qos}", clean=False, rcvbuf=4 * MIB)
        good.subscribe("mem/#", 1)
        warm = 32
        got_good: list[int] = []
        reader = healthy_reader(good, warm, got_good)
        publish(port, "mem/x", 0, warm, size)  # warms the gateway's pools up; fills the stuck one's windows
        reader.join()
        assert sorted(got_good) == list(range(warm))
        time.sleep(0.3)  # the stuck connection's buffers are full by now
        base = rss_anon(gw.p.pid)
        meter = PeakMemory(gw.p.pid)
        reader = healthy_reader(good, total, got_good)
        t0 = time.monotonic()
        publish(port, "mem/x", warm, total, size)
        reader.join()
        lag = time.monotonic() - t0
        peak = meter.stop()
        growth = peak - base
        print(f"qos {qos}: {total * size / MIB:.0f} MiB sent in {lag:.1f} s, growth {growth / MIB:.1f} MiB")
        assert sorted(got_good) == list(range(warm + total)), "the healthy subscriber missed messages"
        assert growth < BOUND + SLACK, f"grew by {growth / MIB:.1f} MiB"

        got = stuck.receive(warm + total, 3.0)
        if qos == 1:  # nothing lost: every message, once the client reads (order kept per queue)
            assert sorted(set(got)) == list(range(warm + total))
        else:  # what was buffered (its socket's and the gateway's bound), then what comes after
            assert 0 < len(got) < total // 2, len(got)
            publish(port, "mem/x", 10**6, 1)
            assert stuck.receive(1, 10.0) == [10**6]
        stuck.close()
        good.close()
    finally:
        assert gw.stop() == 0


def test_mqtt_qos0_subscriber_that_never_reads(tmp_path: Path) -> None:
    mqtt_case(tmp_path, 0, 1600, SIZE)  # 100 MiB


def test_mqtt_qos1_subscriber_that_never_reads(tmp_path: Path) -> None:
    # 1 MiB messages: the session's 64 deliveries in flight alone would hold 64 MiB without the bound
    mqtt_case(tmp_path, 1, 100, MIB)  # 100 MiB


def test_amqp_consumer_that_never_reads(tmp_path: Path) -> None:
    """A no-ack consumer (the deepest window there is) that stops reading after basic.consume (pika's
    blocking connection reads only when called) shares a queue with a healthy consumer: its memory
    stays bounded, the other gets what it does not, and between them every message arrives once."""
    gw = start_gateway(tmp_path, *("--max-outbound-bytes-per-connection", str(BOUND)), protocols="amqp,http")
    try:
        params = pika.URLParameters(f"amqp://guest:guest@{gw.listeners['amqp']}/?heartbeat=0")
        stuck = pika.BlockingConnection(params)
        sch = stuck.channel()
        sch.queue_declare("memq", durable=True)
        got_stuck: list[int] = []
        sch.basic_consume(
            "memq", lambda c, m, p, body: got_stuck.append(int.from_bytes(body[:8], "big")), auto_ack=True
        )
        total = 1200  # 75 MiB
        good_conn = pika.BlockingConnection(params)
        got_good: list[int] = []
        done = threading.Event()

        def good() -> None:
            ch = good_conn.channel()
            ch.basic_qos(prefetch_count=64)

            def on(c, m, p, body: bytes) -> None:
                got_good.append(int.from_bytes(body[:8], "big"))
                c.basic_ack(m.delivery_tag)

            ch.basic_consume("memq", on)
            while not done.is_set():
                good_conn.process_data_events(0.1)

        pub_conn = pika.BlockingConnection(params)
        pch = pub_conn.channel()
        pch.confirm_delivery()
        pad = b"p" * (SIZE - 8)
        for i in range(64):  # warm-up: the stuck consumer's socket and the bound fill
            pch.basic_publish("", "memq", i.to_bytes(8, "big") + pad)
        time.sleep(0.5)
        base = rss_anon(gw.p.pid)
        meter = PeakMemory(gw.p.pid)
        reader = threading.Thread(target=good, daemon=True)
        reader.start()
        for i in range(64, 64 + total):
            pch.basic_publish("", "memq", i.to_bytes(8, "big") + pad)
        deadline = time.monotonic() + 30
        while len(got_good) < total - 64 and time.monotonic() < deadline:
            time.sleep(0.05)
        growth = meter.stop() - base
        print(f"amqp: growth {growth / MIB:.1f} MiB, healthy consumer got {len(got_good)}")
        assert growth < BOUND + SLACK, f"grew by {growth / MIB:.1f} MiB"

        deadline = time.monotonic() + 10  # the stuck one reads again: what it was written
        while time.monotonic() < deadline and len(got_stuck) + len(got_good) < 64 + total:
            stuck.process_data_events(0.1)
        done.set()
        reader.join()
        assert sorted(got_stuck + got_good) == list(range(64 + total)), "lost or doubled messages"
        assert got_stuck and len(got_good) > total // 2, (len(got_stuck), len(got_good))
        for conn in (stuck, good_conn, pub_conn):
            conn.close()
    finally:
        assert gw.stop() == 0


# A RocketMQ 5 consumer that opens ReceiveMessage calls, takes their first response and reads no more
# (grpc's client reads from the socket only as far as the HTTP/2 window its application opened).
GRPC_STUCK = """
import asyncio, sys
import grpc
from adapters.grpc.generated import definition_pb2 as d, service_pb2 as s, service_pb2_grpc
from tests.adapters.grpc.support import MD, dur
async def main(address, calls):
    stub = service_pb2_grpc.MessagingServiceStub(grpc.aio.insecure_channel(address))
    streams = []
    for _ in range(calls):
        req = s.ReceiveMessageRequest(
            group=d.Resource(name="g"), message_queue=d.MessageQueue(topic=d.Resource(name="gm"), id=-1),
            filter_expression=d.FilterExpression(type=d.TAG, expression="*"), batch_size=32,
        )
        req.invisible_duration.CopyFrom(dur(60_000))
        req.long_polling_timeout.CopyFrom(dur(2_000))
        it = stub.ReceiveMessage(req, metadata=MD, timeout=60).__aiter__()
        streams.append((it, asyncio.ensure_future(it.__anext__())))
    print("ready", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def test_grpc_receiver_that_never_reads(tmp_path: Path) -> None:
    """Four ReceiveMessage calls of a client that reads nothing, over 128 MiB of 1 MiB messages: the
    gateway holds about the bound (grpc's flow control alone bounds the wire, not the popped batches:
    about calls x 32 MiB without the bound), and another client receives the rest."""
    gw = start_gateway(
        tmp_path,
        *("--max-outbound-bytes-per-connection", str(BOUND), "--auto-create-topics"),
        protocols="grpc,http",
    )
    client = None
    try:
        address = gw.listeners["grpc"]
        stub = service_pb2_grpc.MessagingServiceStub(grpc.aio.insecure_channel(address))
        total = 128
        for i in range(total):
            r = await send(stub, msg("gm", i.to_bytes(8, "big") + b"g" * (MIB - 8)))
            assert r.status.code == Code.OK, r.status
        base = rss_anon(gw.p.pid)
        meter = PeakMemory(gw.p.pid)
        client = subprocess.Popen(
            [sys.executable, "-c", GRPC_STUCK, address, "4"], stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        assert client.stdout is not None and client.stdout.readline().strip() == "ready"
        got: set[int] = set()
        md = (("x-mq-client-id", "healthy@1"),)
        deadline = time.monotonic() + 30
        while len(got) < total - 32 and time.monotonic() < deadline:
            _, msgs, _ = await receive(stub, "g", "gm", batch=8, poll_ms=1000, md=md)
            got.update(int.from_bytes(m.body[:8], "big") for m in msgs)
            handles = [m.system_properties.receipt_handle for m in msgs]
            if handles:
                await ack(stub, "g", "gm", *handles, md=md)
        growth = meter.stop() - base
        print(f"grpc: growth {growth / MIB:.1f} MiB, healthy client got {len(got)}")
        assert len(got) >= total - 32, len(got)  # what the stuck client holds is at most a batch
        assert growth < BOUND + 32 * MIB + SLACK, f"grew by {growth / MIB:.1f} MiB"
    finally:
        if client is not None:
            client.kill()
            client.wait()
        assert gw.stop() == 0
