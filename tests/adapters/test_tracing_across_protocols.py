"""Message trace across protocols (issue 29): real clients of four protocols each send one message
with their own W3C `traceparent` through one topic (plus one gRPC message without one, whose context
is derived from its id), consumers of five protocols read the topic, and

- every consumer gets, for every message, the traceparent its producer sent in its own protocol's
  place: MQTT 5 user property (in its place among the others), AMQP header, CloudEvents
  `traceparent` attribute, RocketMQ 5 `system_properties.trace_context`, RocketMQ 4.x message
  property; and none for the message sent without one (issue 47: the derived one is not delivered);
- `GET /admin/messages/{id}/trace` shows received (producer's protocol) and stored, then delivered
  and acked by each consumer's protocol; by trace id and by key find the same messages;
- with `--otlp-endpoint`, a real OTLP/HTTP receiver gets the events as spans in the producer's
  trace, children of the producer's span.

Clients: aiomqtt (MQTT 5), aio-pika (AMQP 0-9-1), the cloudevents SDK with httpx, grpcio with the v2
stubs, and the project's remoting client speaking the 4.x POP/ACK commands, against one in-process
gateway (`gateway.server.Gateway`, LOCAL mode)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aio_pika
import aiomqtt
import grpc
import httpx
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from adapters.remoting.message_codec import decode_messages
from gateway.config import Settings
from gateway.server import Gateway
from messaging_processor import ClientContext
from messaging_processor.tracing import derived_traceparent, valid_traceparent
from remoting import RequestCode, ResponseCode
from remoting.client import RemotingClient
from tests.adapters.grpc.support import ack, msg, receive
from tests.adapters.mqtt.support import V5, next_message
from tests.support import T, running_gateway

pytestmark = pytest.mark.timeout(90)

TOPIC = "traced"
TP = {
    "mqtt": "00-11111111111111111111111111111111-1111111111111111-01",
    "amqp": "00-22222222222222222222222222222222-2222222222222222-01",
    "http": "00-33333333333333333333333333333333-3333333333333333-01",
    "grpc": "00-44444444444444444444444444444444-4444444444444444-01",
}
BODIES = {p: f"from-{p}".encode() for p in TP} | {"http": b'{"from":"http"}', "none": b"from-grpc-untraced"}
MD = (("x-mq-client-id", "trace-host@1@0@grpc"), ("x-mq-language", "PYTHON"))


@pytest.fixture
async def gw(tmp_path):
    async with running_gateway(
        str(tmp_path / "data"), ("mqtt", "amqp", "http", "grpc", "remoting"), default_queues=1
    ) as g:
        yield g


def listener(gw: Gateway, name: str):
    return next(a for a in gw.adapters if a.name == name)


async def publish_all(gw: Gateway, amqp_ch: aio_pika.abc.AbstractChannel) -> None:
    """One message per producing protocol, each with its traceparent (gRPC also one without)."""
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("site", "north"), ("traceparent", TP["mqtt"]), ("zone", "b")]
    async with aiomqtt.Client("127.0.0.1", listener(gw, "mqtt").bound_port, protocol=V5) as pub:
        await pub.publish(TOPIC, BODIES["mqtt"], qos=1, properties=props)

    await amqp_ch.default_exchange.publish(
        aio_pika.Message(BODIES["amqp"], headers={"traceparent": TP["amqp"]}, delivery_mode=2),
        routing_key=TOPIC,
    )

    from cloudevents.core.formats.json import JSONFormat
    from cloudevents.core.v1.event import CloudEvent

    ev = CloudEvent(
        {"id": "ce-1", "source": "/trace-test", "type": "test.trace", "traceparent": TP["http"]},
        {"from": "http"},
    )
    async with httpx.AsyncClient(base_url=f"http://{listener(gw, 'http').address}", timeout=T) as http:
        r = await http.post(
            f"/topics/{TOPIC}/events",
            content=JSONFormat().write(ev),
            headers={"content-type": "application/cloudevents+json"},
        )
        assert r.status_code in (200, 202), r.text

    async with grpc.aio.insecure_channel(listener(gw, "grpc").address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        r = await stub.SendMessage(
            s.SendMessageRequest(
                messages=[msg(TOPIC, BODIES["grpc"], trace_context=TP["grpc"]), msg(TOPIC, BODIES["none"])]
            ),
            metadata=MD,
        )
        assert r.status.code == d.OK, r.status


async def consume_grpc(gw: Gateway, n: int) -> dict[bytes, str]:
    got: dict[bytes, str] = {}
    async with grpc.aio.insecure_channel(listener(gw, "grpc").address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        async with asyncio.timeout(T):
            while len(got) < n:
                _st, msgs, _ = await receive(stub, "G-TRACE", TOPIC, poll_ms=1000, md=MD)
                for m in msgs:
                    got[m.body] = m.system_properties.trace_context
                    assert "traceparent" not in m.user_properties  # a system property, not a user one
                if msgs:
                    await ack(
                        stub, "G-TRACE", TOPIC, *(m.system_properties.receipt_handle for m in msgs), md=MD
                    )
    return got


async def consume_cloudevents(gw: Gateway, n: int) -> dict[bytes, str]:
    got: dict[bytes, str] = {}
    base = f"/topics/{TOPIC}/subscriptions/CG-TRACE"
    async with httpx.AsyncClient(base_url=f"http://{listener(gw, 'http').address}", timeout=T) as http:
        async with asyncio.timeout(T):
            while len(got) < n:
                r = await http.post(f"{base}/pop", json={"max_events": 16, "wait_ms": 1000})
                assert r.status_code == 200, r.text
                events = r.json()
                for e in events:
                    got[ce_body(e)] = e.get("traceparent", "")
                if events:
                    r = await http.post(
                        f"{base}/ack", json={"receipt_handles": [e["receipthandle"] for e in events]}
                    )
                    assert r.json()["acked"] == len(events)
    return got


def ce_body(e: dict) -> bytes:
    """The data of a structured-mode event as bytes."""
    if "data_base64" in e:
        return base64.b64decode(e["data_base64"])
    data = e.get("data")
    return data.encode() if isinstance(data, str) else json.dumps(data, separators=(",", ":")).encode()


async def consume_remoting(gw: Gateway, n: int) -> dict[bytes, str]:
    got: dict[bytes, str] = {}
    client = await RemotingClient.connect("127.0.0.1", listener(gw, "remoting").bound_port)
    try:
        async with asyncio.timeout(T):
            while len(got) < n:
                r = await client.invoke(
                    RequestCode.POP_MESSAGE,
                    {
                        "consumerGroup": "PG-TRACE", "topic": TOPIC, "queueId": -1, "maxMsgNums": 16,
                        "invisibleTime": 30_000, "pollTime": 1000, "bornTime": 0, "initMode": 0,
                        "expType": "TAG", "exp": "*", "order": False,
                    },
                )  # fmt: skip
                if r.code != ResponseCode.SUCCESS:
                    continue
                for m in decode_messages(r.body):
                    got[m.body] = m.properties.get("traceparent", "")
                    settle = {
                        "consumerGroup": "PG-TRACE", "topic": m.topic, "queueId": m.queue_id,
                        "offset": m.queue_offset, "extraInfo": m.properties["POP_CK"],
                    }  # fmt: skip
                    assert (await client.invoke(RequestCode.ACK_MESSAGE, settle)).code == ResponseCode.SUCCESS
    finally:
        await client.close()
    return got


async def test_traceparent_crosses_protocols_and_the_trace_shows_every_hop(gw):
    n = len(BODIES)
    await gw.processor.create_topic(TOPIC, 1)
    mqtt_sub = aiomqtt.Client(
        "127.0.0.1", listener(gw, "mqtt").bound_port, identifier="trace-sub", protocol=V5
    )
    conn = await aio_pika.connect(
        f"amqp://guest:guest@127.0.0.1:{listener(gw, 'amqp').bound_port}/", timeout=T
    )
    async with mqtt_sub, conn:
        await mqtt_sub.subscribe(f"{TOPIC}/#", qos=1)
        ch = await conn.channel()
        queue = await ch.declare_queue(TOPIC, durable=True)  # the AMQP queue of that name is the topic
        inbox: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(inbox.put)

        await publish_all(gw, ch)

        by_mqtt: dict[bytes, str] = {}
        while len(by_mqtt) < n:
            m = await next_message(mqtt_sub)
            ups = (
                dict(m.properties.UserProperty)
                if m.properties and hasattr(m.properties, "UserProperty")
                else {}
            )
            by_mqtt[m.payload] = ups.get("traceparent", "")
            if m.payload == BODIES["mqtt"]:  # exactly the user properties sent, in their order
                assert m.properties.UserProperty == [
                    ("site", "north"),
                    ("traceparent", TP["mqtt"]),
                    ("zone", "b"),
                ]
        by_amqp: dict[bytes, str] = {}
        async with asyncio.timeout(T):
            while len(by_amqp) < n:
                am = await inbox.get()
                tp = (am.headers or {}).get("traceparent", "")
                by_amqp[am.body] = tp.decode() if isinstance(tp, bytes) else tp
                await am.ack()
    by_grpc = await consume_grpc(gw, n)
    by_ce = await consume_cloudevents(gw, n)
    by_remoting = await consume_remoting(gw, n)

    # CloudEvents delivers JSON data as JSON: map its bodies back through the stored messages
    stored = {
        m.message_id: m
        for m in await gw.processor.read(ClientContext("test"), TOPIC, 0, 0, max_messages=n + 1)
    }
    assert len(stored) == n
    untraced = next(m for m in stored.values() if m.body == BODIES["none"])
    assert "traceparent" not in untraced.properties  # nothing stored: derived from the id when read
    made = derived_traceparent(untraced.message_id)
    assert valid_traceparent(made) and made not in TP.values()
    expected = {BODIES[p]: tp for p, tp in TP.items()} | {BODIES["none"]: made}
    delivered = expected | {BODIES["none"]: ""}  # (no consumer gets the derived one)
    assert by_mqtt == delivered
    assert by_amqp == delivered
    assert by_grpc == delivered
    assert by_remoting == delivered
    assert by_ce == delivered

    consumers = {"mqtt", "amqp", "grpc", "http", "remoting"}
    producer_of = {BODIES[p]: p for p in TP} | {BODIES["none"]: "grpc"}
    async with httpx.AsyncClient(base_url=f"http://{listener(gw, 'http').address}", timeout=T) as http:
        for mid, m in stored.items():
            key = m.body
            r = await http.get(f"/admin/messages/{mid}/trace")
            assert r.status_code == 200, r.text
            t = r.json()
            assert t["traceparent"] == expected[key] and t["trace_id"] == t["traceparent"][3:35]
            assert t["topic"] == TOPIC
            events = t["events"]
            assert [e["time"] for e in events] == sorted(e["time"] for e in events)
            assert [(e["event"], e["protocol"]) for e in events[:2]] == [
                ("received", producer_of[key]),
                ("stored", producer_of[key]),
            ]
            assert events[1]["queue_id"] == m.queue_id and events[1]["offset"] == m.queue_offset
            delivered = {e["protocol"] for e in events if e["event"] == "delivered"}
            acked = {e["protocol"] for e in events if e["event"] == "acked"}
            assert delivered == consumers and acked == consumers, events

        r = await http.get(f"/admin/traces/{TP['amqp'][3:35]}")
        assert r.status_code == 200 and [t["traceparent"] for t in r.json()] == [TP["amqp"]]
        r = await http.get(f"/admin/messages/{'0' * 32}/trace")
        assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem+json")
        r = await http.get("/admin/messages/trace", params={"key": "no-such-key"})
        assert r.status_code == 404
        schema = (await http.get("/openapi.json")).json()
        assert "/admin/messages/{message_id}/trace" in schema["paths"]


class Collector:
    """An OTLP/HTTP traces receiver (protobuf) on a thread: the spans it was sent."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        spans = self.spans = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                req = ExportTraceServiceRequest.FromString(body)
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _mqtt_in_amqp_acked(tmp_path, body: bytes, user_props: list[tuple[str, str]]):
    """A gateway exporting to a real OTLP/HTTP collector: `body` published over MQTT 5 with
    `user_props`, consumed and acked over AMQP (aio-pika). (the exported spans, the AMQP headers
    the consumer got, the stored message), after the gateway stopped (the exporter flushed)."""
    collector = Collector()
    settings = Settings(
        data_dir=str(tmp_path / "data"),
        protocols=("mqtt", "amqp"),
        mqtt_port=0,
        amqp_port=0,
        flush="async",
        default_queues=1,
        segment_size_mib=4,
        otlp_endpoint=collector.url,
    )
    g = Gateway(settings)
    await g.start()
    try:
        await g.processor.create_topic(TOPIC, 1)
        conn = await aio_pika.connect(
            f"amqp://guest:guest@127.0.0.1:{listener(g, 'amqp').bound_port}/", timeout=T
        )
        async with conn:
            ch = await conn.channel()
            queue = await ch.declare_queue(TOPIC, durable=True)
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = user_props
            async with aiomqtt.Client("127.0.0.1", listener(g, "mqtt").bound_port, protocol=V5) as pub:
                await pub.publish(TOPIC, body, qos=1, properties=props)
            async with queue.iterator() as it:
                async with asyncio.timeout(T):
                    async for m in it:
                        assert m.body == body
                        headers = dict(m.headers or {})
                        await m.ack()
                        break
        [stored] = await g.processor.read(ClientContext("test"), TOPIC, 0, 0, max_messages=2)
    finally:
        await g.stop()  # flushes the trace and shuts the exporter down (sending what it batched)
        collector.close()
    return collector.spans, headers, stored


async def test_otlp_export_puts_the_gateway_hop_into_the_producers_trace(tmp_path):
    spans, headers, _ = await _mqtt_in_amqp_acked(tmp_path, b"otlp", [("traceparent", TP["mqtt"])])
    assert headers["traceparent"] == TP["mqtt"]
    names = {(sp.name, sp.trace_id.hex(), sp.parent_span_id.hex()) for sp in spans}
    trace_id, parent = TP["mqtt"][3:35], TP["mqtt"][36:52]
    for event in ("received", "stored", "delivered", "acked"):
        assert (f"{event} {TOPIC}", trace_id, parent) in names, names
    attrs = {sp.name: {a.key: a.value.string_value for a in sp.attributes} for sp in spans}
    assert attrs[f"received {TOPIC}"]["network.protocol.name"] == "mqtt"
    assert attrs[f"delivered {TOPIC}"]["network.protocol.name"] == "amqp"


async def test_otlp_gets_every_span_of_a_message_sent_without_a_context(tmp_path):
    """Issue 47's acceptance: a message published over MQTT without a trace context, consumed and
    acked over AMQP, gives received, stored, delivered and acked spans in one trace (the one
    derived from its id) at a real OTLP/HTTP receiver, and the AMQP consumer gets no traceparent."""
    exported, headers, stored = await _mqtt_in_amqp_acked(tmp_path, b"no-context", [("site", "north")])
    assert "traceparent" not in headers  # none added (issue 47)
    tp = derived_traceparent(stored.message_id)
    assert tp is not None and "traceparent" not in stored.properties
    spans = [sp for sp in exported if sp.name.endswith(f" {TOPIC}")]
    by_event = {sp.name.split(" ")[0]: sp for sp in spans}
    assert set(by_event) == {"received", "stored", "delivered", "acked"}, [sp.name for sp in spans]
    assert {sp.trace_id.hex() for sp in spans} == {tp[3:35]}  # one trace: the derived context's
    assert {sp.parent_span_id.hex() for sp in spans} == {tp[36:52]}
    mid = {
        sp.name: {a.key: a.value.string_value for a in sp.attributes}["messaging.message.id"] for sp in spans
    }
    assert set(mid.values()) == {stored.message_id}
    attrs = {sp.name: {a.key: a.value.string_value for a in sp.attributes} for sp in spans}
    assert attrs[f"acked {TOPIC}"]["network.protocol.name"] == "amqp"
