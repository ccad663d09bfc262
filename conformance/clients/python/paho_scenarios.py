"""MQTT conformance scenarios driven by Eclipse Paho Python (paho-mqtt 2.2.0 from requirements.lock).

Runs in ``.venv-conformance``, never in the gateway's ``.venv``; imports nothing from the project.

    .venv-conformance/bin/python conformance/clients/python/paho_scenarios.py SCENARIO CONFIG_JSON

Config, result line and scenario names: see mqtt_harness.py and conformance/protocols/mqtt.py.
Every connection runs paho's own network thread (``loop_start``) with automatic reconnects off, so a
connection the server closes stays closed and is seen as such.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mqtt_harness import (  # noqa: E402
    QOS_CASES,
    QOS_EXTRA,
    Ctx,
    Inbox,
    Received,
    RocketMQSide,
    check,
    check_from_mqtt,
    expect_exact,
    qos_texts,
    run,
)

CLIENT = "paho"
SESSION_TAKEN_OVER = 0x8E
DISCONNECT_WITH_WILL = 0x04
MAX_SHARED_BATCHES = 3


def props_of(p: Properties | None) -> dict:
    if p is None:
        return {}
    out: dict = {}
    for attr, key in (
        ("ContentType", "content_type"),
        ("ResponseTopic", "response_topic"),
        ("CorrelationData", "correlation_data"),
        ("PayloadFormatIndicator", "payload_format"),
        ("MessageExpiryInterval", "expiry"),
    ):
        if hasattr(p, attr):
            out[key] = getattr(p, attr)
    if hasattr(p, "UserProperty"):
        out["user_properties"] = [list(kv) for kv in p.UserProperty]
    return out


def publish_props(
    *,
    user: list | None = None,
    content_type: str | None = None,
    response_topic: str | None = None,
    correlation: bytes | None = None,
    payload_format: int | None = None,
    expiry: int | None = None,
) -> Properties:
    p = Properties(PacketTypes.PUBLISH)
    if user:
        p.UserProperty = [tuple(kv) for kv in user]
    if content_type is not None:
        p.ContentType = content_type
    if response_topic is not None:
        p.ResponseTopic = response_topic
    if correlation is not None:
        p.CorrelationData = correlation
    if payload_format is not None:
        p.PayloadFormatIndicator = payload_format
    if expiry is not None:
        p.MessageExpiryInterval = expiry
    return p


class Conn:
    """One paho client connection with blocking connect / subscribe / publish / disconnect."""

    def __init__(
        self,
        ctx: Ctx,
        name: str,
        *,
        client_id: str | None = None,
        version: int | None = None,
        will: tuple | None = None,  # (topic, payload, qos, retain)
        tee: Inbox | None = None,  # also collect the messages here (several connections, one wait)
    ) -> None:
        self.ctx = ctx
        self.name = name
        self.version = version or ctx.version
        self.client_id = f"{ctx.prefix}-{name}" if client_id is None else client_id
        kwargs = (
            {"protocol": mqtt.MQTTv5}
            if self.version == 5
            else {"protocol": mqtt.MQTTv311, "clean_session": True}
        )
        # params "transport": "websockets" (and "ws_path"): MQTT over WebSocket to the same scenarios
        transport = ctx.params.get("transport", "tcp")
        self.c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            reconnect_on_failure=False,
            transport=transport,
            **kwargs,
        )
        if transport == "websockets":
            self.c.ws_set_options(path=ctx.params.get("ws_path", "/mqtt"))
        if will:
            self.c.will_set(*will)
        self.inbox = Inbox(name)
        self.tee = tee
        self.connack: dict | None = None
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.disconnect_reason: int | None = None
        self._subacks: dict[int, list[int]] = {}
        self._pub_reasons: dict[int, int] = {}  # 5.0 PUBACK / PUBREC reason codes by mid
        self._cond = threading.Condition()
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        self.c.on_publish = self._on_publish
        ctx.on_cleanup(self.close)

    # callbacks (paho's network thread)
    def _on_connect(self, _c, _u, flags, reason_code, properties) -> None:
        self.connack = {
            "reason": reason_code.value,
            "session_present": bool(flags.session_present),
            "properties": properties.json() if properties is not None and self.version == 5 else {},
        }
        self.connected.set()

    def _on_disconnect(self, _c, _u, _flags, reason_code, _properties) -> None:
        self.disconnect_reason = getattr(reason_code, "value", reason_code)
        self.disconnected.set()

    def _on_message(self, _c, _u, msg) -> None:
        props = props_of(msg.properties) if self.version == 5 else {}
        m = Received(msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain), props)
        self.inbox.add(m)
        if self.tee is not None:
            self.tee.add(m)

    def _on_subscribe(self, _c, _u, mid, reason_codes, _properties) -> None:
        with self._cond:
            self._subacks[mid] = [rc.value for rc in reason_codes]
            self._cond.notify_all()

    def _on_publish(self, _c, _u, mid, reason_code, _properties) -> None:
        self._pub_reasons[mid] = reason_code.value  # runs before the publish counts as complete

    # blocking operations
    def connect(self, keepalive: int = 30) -> Conn:
        self.c.connect(self.ctx.host, self.ctx.port, keepalive)
        self.c.loop_start()
        check(self.connected.wait(self.ctx.wait_s()), f"{self.name}: no CONNACK")
        check(self.connack["reason"] == 0, f"{self.name}: CONNACK refused: {self.connack}")
        return self

    def subscribe(self, *subs: tuple[str, int | SubscribeOptions]) -> list[int]:
        rc, mid = self.c.subscribe(list(subs))
        check(rc == mqtt.MQTT_ERR_SUCCESS, f"{self.name}: subscribe failed locally: {rc}")
        with self._cond:
            ok = self._cond.wait_for(lambda: mid in self._subacks, self.ctx.wait_s())
        check(ok, f"{self.name}: no SUBACK for {[s[0] for s in subs]}")
        return self._subacks[mid]

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, props=None) -> None:
        info = self.c.publish(topic, payload, qos, retain, props)
        check(info.rc == mqtt.MQTT_ERR_SUCCESS, f"{self.name}: publish to {topic} failed locally: {info.rc}")
        info.wait_for_publish(self.ctx.wait_s())
        check(info.is_published(), f"{self.name}: publish to {topic} (QoS {qos}) not acknowledged")
        reason = self._pub_reasons.pop(info.mid, 0)
        check(reason < 0x80, f"{self.name}: publish to {topic} answered with reason {reason:#x}")

    def disconnect(self, reason: int | None = None) -> None:
        rc = ReasonCode(PacketTypes.DISCONNECT, identifier=reason) if reason is not None else None
        self.c.disconnect(reasoncode=rc)
        check(self.disconnected.wait(self.ctx.wait_s()), f"{self.name}: DISCONNECT did not complete")
        self.c.loop_stop()

    def kill(self) -> None:
        """Abnormal end: the TCP connection is shut down without a DISCONNECT packet."""
        sock = self.c.socket()
        check(sock is not None, f"{self.name}: no socket to kill")
        sock = getattr(sock, "_socket", sock)  # over WebSocket: the TCP socket under paho's wrapper
        sock.shutdown(socket.SHUT_RDWR)
        self.disconnected.wait(self.ctx.wait_s())
        self.c.loop_stop()

    def close(self) -> None:
        if not self.disconnected.is_set():
            self.c.disconnect()
            self.disconnected.wait(2)
        self.c.loop_stop()


def conn(ctx: Ctx, name: str, **kw) -> Conn:
    return Conn(ctx, name, **kw).connect()


# --------------------------------------------------------------------------- scenarios


def sc_connect(ctx: Ctx) -> None:
    v = ctx.version
    a = conn(ctx, "a")
    check(a.connack["session_present"] is False, f"clean connect reports session present: {a.connack}")
    ctx.details["connack"] = a.connack
    # Empty client id: 3.1.1 allows it with clean session; 5.0 assigns one.
    e = conn(ctx, "empty", client_id="")
    if v == 5:
        assigned = e.connack["properties"].get("AssignedClientIdentifier")
        check(assigned, f"5.0 CONNACK for an empty client id has no Assigned Client Identifier: {e.connack}")
        ctx.details["assigned_client_id"] = assigned
    e.disconnect()
    # The connection works: a round trip through the gateway on the same connection.
    echo = ctx.topic("echo")
    check(a.subscribe((echo, 1)) == [1], "SUBACK did not grant QoS 1")
    a.publish(echo, b"ping", 1)
    check(a.inbox.wait_topic(echo, ctx.wait_s()), "own message did not come back")
    # Takeover: a second connection with the same client id closes the first.
    b = conn(ctx, "b", client_id=a.client_id)
    check(a.disconnected.wait(ctx.wait_s()), "first connection still open after a takeover of its client id")
    if v == 5:
        check(
            a.disconnect_reason == SESSION_TAKEN_OVER,
            f"taken-over 5.0 client got reason {a.disconnect_reason}, expected 0x8E",
        )
    ctx.details["takeover_reason"] = a.disconnect_reason
    check(b.subscribe((echo, 1)) == [1], "SUBACK after takeover did not grant QoS 1")
    b.publish(echo, b"after-takeover", 1)
    check(b.inbox.wait_topic(echo, ctx.wait_s()), "the new connection gets nothing")
    b.disconnect()
    check(b.disconnect_reason == 0, f"normal DISCONNECT ended with {b.disconnect_reason}")


def sc_qos(ctx: Ctx) -> None:
    n = int(ctx.params.get("count", 10))
    sub = conn(ctx, "sub")
    granted = sub.subscribe(*((ctx.topic(level), sq) for level, sq, _ in QOS_CASES))
    expect_exact(granted, [sq for _, sq, _ in QOS_CASES], "granted QoS")
    pub = conn(ctx, "pub")
    sent: dict[str, list[bytes]] = {}
    for level, sq, pq in QOS_CASES:
        sent[level] = qos_texts(level, sq, pq, n) + (list(QOS_EXTRA) if sq == pq else [])
        for body in sent[level]:
            pub.publish(ctx.topic(level), body, pq)

    def done(ms: list) -> bool:
        return all(sum(m.topic == ctx.topic(lv) for m in ms) >= len(b) for lv, b in sent.items())

    sub.inbox.wait_for(done, ctx.wait_s(15))
    got = sub.inbox.snapshot()
    ctx.details["received"] = {lv: sum(m.topic == ctx.topic(lv) for m in got) for lv in sent}
    for level, sq, pq in QOS_CASES:
        what = f"{level} (publish QoS {pq}, subscription QoS {sq})"
        ms = [m for m in got if m.topic == ctx.topic(level)]
        check(len(ms) == len(sent[level]), f"{what}: received {len(ms)} of {len(sent[level])}")
        check([m.payload for m in ms] == sent[level], f"{what}: payloads differ or out of order")
        qs = sorted({m.qos for m in ms})
        check(qs == [min(sq, pq)], f"{what}: delivered with QoS {qs}, expected {min(sq, pq)}")
        check(not any(m.retain for m in ms), f"{what}: live message flagged retained")


def sc_retained(ctx: Ctx) -> None:
    r, s, everything = ctx.topic("r"), ctx.topic("s"), ctx.topic("#")
    pub = conn(ctx, "pub")
    pub.publish(r, b"keep", 1, retain=True)
    pub.publish(s, b"sentinel", 1, retain=True)
    ctx.on_cleanup(lambda: pub.publish(s, b"", 1, retain=True))
    s1 = conn(ctx, "s1")
    s1.subscribe((everything, 1))
    check(
        s1.inbox.wait_for(lambda ms: len(ms) >= 2, ctx.wait_s()),
        f"retained on subscribe: {s1.inbox.topics()}",
    )
    first = {m.topic: m for m in s1.inbox.snapshot()}
    check(set(first) == {r, s}, f"retained on subscribe: {sorted(first)}")
    check(first[r].payload == b"keep" and first[r].retain, f"retained {r}: {first[r].short()}")
    check(first[s].retain, f"retained {s} delivered without the retain flag")
    pub.publish(r, b"live", 1)
    check(s1.inbox.wait_for(lambda ms: len(ms) >= 3, ctx.wait_s()), "live publish not delivered")
    live = s1.inbox.snapshot()[2]
    check(live.topic == r and live.payload == b"live" and not live.retain, f"live copy: {live.short()}")
    pub.publish(r, b"", 1, retain=True)  # clears the retained message
    check(
        s1.inbox.wait_for(lambda ms: len(ms) >= 4, ctx.wait_s()),
        "the empty retained publish was not delivered",
    )
    empty = s1.inbox.snapshot()[3]
    check(empty.topic == r and empty.payload == b"", f"empty retained publish delivered as {empty.short()}")
    s2 = conn(ctx, "s2")
    s2.subscribe((everything, 1))
    check(s2.inbox.wait_topic(s, ctx.wait_s()), "the remaining retained message was not delivered")
    s2.inbox.wait_topic(r, ctx.quiet)
    check(r not in s2.inbox.topics(), f"cleared retained message still delivered: {s2.inbox.topics()}")
    ctx.details["second_subscriber"] = [m.short() for m in s2.inbox.snapshot()]
    if ctx.version == 5:
        # Retain handling 2: nothing retained on subscribe; retain-as-published keeps the flag live.
        s3 = conn(ctx, "s3")
        s3.subscribe((everything, SubscribeOptions(qos=1, retainAsPublished=True, retainHandling=2)))
        pub.publish(s, b"again", 1, retain=True)
        check(s3.inbox.wait_topic(s, ctx.wait_s()), "retain handling 2 subscriber got no live message")
        m = s3.inbox.snapshot()
        check(
            m[0].payload == b"again",
            f"retain handling 2 still sent retained messages: {[x.short() for x in m]}",
        )
        check(m[0].retain, "retain-as-published subscription got the retain flag cleared")
        check(s1.inbox.wait_for(lambda ms: len(ms) >= 5, ctx.wait_s()), "s1 missed the retained live publish")
        check(not s1.inbox.snapshot()[4].retain, "a plain subscription got a live message with retain 1")


def sc_wildcards(ctx: Ctx) -> None:
    p, d = ctx.prefix, "$" + ctx.prefix
    pubs = [f"{p}/a/temp", f"{p}/b/temp", f"{p}/a/hum", f"{p}/a/b/temp", p, f"{d}/a/temp"]
    plus, hash_, root, root_plus, dollar = (
        conn(ctx, n) for n in ("plus", "hash", "root", "rootplus", "dollar")
    )
    plus.subscribe((f"{p}/+/temp", 1))
    hash_.subscribe((f"{p}/#", 1))
    root.subscribe(("#", 1))
    root_plus.subscribe(("+/a/temp", 1))
    dollar.subscribe((f"{d}/#", 1))
    pub = conn(ctx, "pub")
    for t in pubs:
        pub.publish(t, t.encode(), 1)
    expected = {
        "plus": (plus, [f"{p}/a/temp", f"{p}/b/temp"]),
        "hash": (hash_, pubs[:5]),
        "root": (root, pubs[:5]),
        "rootplus": (root_plus, [f"{p}/a/temp"]),
        "dollar": (dollar, [f"{d}/a/temp"]),
    }
    for c, want in expected.values():
        c.inbox.wait_for(lambda ms, w=want: {m.topic for m in ms if ctx.own(m.topic)} >= set(w), ctx.wait_s())
    root.inbox.wait_topic(pubs[5], ctx.quiet)  # give a wrong '$' delivery time to show up
    got = {name: sorted(c.inbox.topics(lambda m: ctx.own(m.topic))) for name, (c, _) in expected.items()}
    ctx.details["received"] = got
    for name, (c, want) in expected.items():
        expect_exact(got[name], sorted(want), f"subscriber {name}")
        for m in c.inbox.snapshot(lambda m: ctx.own(m.topic)):
            check(m.payload == m.topic.encode(), f"{name}: payload of {m.topic} is {m.payload!r}")


def sc_will(ctx: Ctx) -> None:
    v = ctx.version
    will_root = ctx.topic("will")
    obs = conn(ctx, "observer")
    obs.subscribe((f"{will_root}/#", 1))
    normal = conn(ctx, "normal", will=(f"{will_root}/normal", b"normal-will", 1, False))
    normal.disconnect()
    expect = {f"{will_root}/abnormal": b"abnormal-will"}
    if v == 5:
        w4 = conn(ctx, "reason4", will=(f"{will_root}/reason4", b"reason4-will", 1, False))
        w4.disconnect(DISCONNECT_WITH_WILL)
        expect[f"{will_root}/reason4"] = b"reason4-will"
    ab = conn(ctx, "abnormal", will=(f"{will_root}/abnormal", b"abnormal-will", 1, False))
    ab.kill()
    obs.inbox.wait_for(lambda ms: {m.topic for m in ms} >= set(expect), ctx.wait_s())
    obs.inbox.wait_topic(f"{will_root}/normal", ctx.quiet)
    got = obs.inbox.snapshot()
    ctx.details["received"] = [m.short() for m in got]
    check(
        f"{will_root}/normal" not in {m.topic for m in got},
        "will published although the client sent a normal DISCONNECT",
    )
    for topic, payload in expect.items():
        ms = [m for m in got if m.topic == topic]
        check(len(ms) == 1, f"will {topic}: received {len(ms)} times")
        check(ms[0].payload == payload and ms[0].qos == 1, f"will {topic}: {ms[0].short()}")


def sc_shared(ctx: Ctx) -> None:
    n = int(ctx.params.get("count", 20))
    share = f"$share/{ctx.prefix}/{ctx.prefix}/#"
    both = Inbox("members")
    members = [conn(ctx, f"m{i}", tee=both) for i in (1, 2)]
    for m in members:
        expect_exact(m.subscribe((share, 1)), [1], f"{m.name} shared SUBACK")
    plain = conn(ctx, "plain")
    plain.subscribe((ctx.topic("#"), 1))
    pub = conn(ctx, "pub")
    sent: list[bytes] = []
    # Which member gets a message is up to the server; if one got none of the first batch, send
    # more (at most MAX_SHARED_BATCHES): a server that never uses the second member still fails.
    for _ in range(MAX_SHARED_BATCHES):
        batch = [f"item-{len(sent) + i}".encode() for i in range(n)]
        for body in batch:
            pub.publish(ctx.topic("items"), body, 1)
        sent += batch
        both.wait_count(len(sent), ctx.wait_s(15))
        if all(m.inbox.snapshot() for m in members):
            break
    plain.inbox.wait_count(len(sent), ctx.wait_s())
    both.wait_for(lambda ms: len(ms) > len(sent), ctx.quiet)  # room for a late duplicate
    a, b = ([x.payload for x in m.inbox.snapshot()] for m in members)
    ctx.details.update(sent=len(sent), m1=len(a), m2=len(b), plain=len(plain.inbox.snapshot()))
    check(len(a) == len(set(a)) and len(b) == len(set(b)), "a member got a message twice")
    check(not set(a) & set(b), f"{len(set(a) & set(b))} messages went to both members")
    check(set(a) | set(b) == set(sent), f"{len(set(sent) - set(a) - set(b))} messages reached no member")
    check(a and b, f"one member got nothing (m1={len(a)}, m2={len(b)})")
    check(
        [x.payload for x in plain.inbox.snapshot()] == sent,
        f"the non-shared subscriber got {len(plain.inbox.snapshot())} of {len(sent)}",
    )


def sc_properties(ctx: Ctx) -> None:
    req_t, resp_t = ctx.topic("req"), ctx.topic("resp")
    responder = conn(ctx, "responder")
    responder.subscribe((req_t, 1))
    requester = conn(ctx, "requester")
    requester.subscribe((resp_t, 1))
    user = [["trace", "t-1"], ["dup", "1"], ["dup", "2"], ["ünïcode", "välue"]]
    corr = b"\x00corr\xff-42"
    requester.publish(
        req_t,
        b'{"q": 1}',
        1,
        props=publish_props(
            user=user,
            content_type="application/json",
            response_topic=resp_t,
            correlation=corr,
            payload_format=1,
            expiry=120,
        ),
    )
    check(responder.inbox.wait_topic(req_t, ctx.wait_s()), "request not delivered")
    req = responder.inbox.snapshot()[0]
    ctx.details["request_properties"] = {
        **req.props,
        "correlation_data": repr(req.props.get("correlation_data")),
    }
    check(req.payload == b'{"q": 1}', f"request payload {req.payload!r}")
    ups = req.props.get("user_properties")  # exactly as sent: no traceparent added (issue 47)
    check(ups == user, f"user properties {req.props.get('user_properties')}")
    check(
        req.props.get("content_type") == "application/json", f"content type {req.props.get('content_type')!r}"
    )
    check(req.props.get("response_topic") == resp_t, f"response topic {req.props.get('response_topic')!r}")
    check(
        req.props.get("correlation_data") == corr, f"correlation data {req.props.get('correlation_data')!r}"
    )
    check(req.props.get("payload_format") == 1, f"payload format {req.props.get('payload_format')!r}")
    expiry = req.props.get("expiry")
    check(expiry is not None and 0 < expiry <= 120, f"message expiry interval {expiry!r}, expected 1..120")
    # The responder answers where the request asked, echoing the correlation data.
    responder.publish(
        req.props["response_topic"],
        b"answer",
        1,
        props=publish_props(user=[["status", "ok"]], correlation=req.props["correlation_data"]),
    )
    check(requester.inbox.wait_topic(resp_t, ctx.wait_s()), "response not delivered")
    resp = requester.inbox.snapshot()[0]
    check(resp.payload == b"answer", f"response payload {resp.payload!r}")
    check(
        resp.props.get("correlation_data") == corr,
        f"response correlation data {resp.props.get('correlation_data')!r}",
    )
    resp_ups = resp.props.get("user_properties")
    check(resp_ups == [["status", "ok"]], f"response user properties {resp.props}")
    check("content_type" not in resp.props, "request properties leaked into the response")


def sc_cross_protocol(ctx: Ctx) -> None:
    sensors, orders, group = ctx.topics["sensors"], ctx.topics["orders"], ctx.groups["sensors"]
    rmq = RocketMQSide(ctx)
    # MQTT -> RocketMQ: the first MQTT level is the store topic.
    consumer = rmq.consumer(group, sensors)
    p311 = conn(ctx, "pub311", version=4)
    p5 = conn(ctx, "pub5", version=5)
    p311.publish(f"{sensors}/dev1/temp", b"21.5", 1)
    p5.publish(
        f"{sensors}/dev2/temp",
        b"19.0",
        1,
        props=publish_props(user=[["unit", "C"]], content_type="text/plain"),
    )
    got = rmq.receive(consumer, 2)
    check_from_mqtt(
        ctx,
        got,
        {
            f"{sensors}/dev1/temp": (b"21.5", 1, {}),
            f"{sensors}/dev2/temp": (
                b"19.0",
                1,
                {
                    "mqtt.user_properties": json.dumps([["unit", "C"]], separators=(",", ":")),
                    "mqtt.content_type": "text/plain",
                },
            ),
        },
    )
    # RocketMQ -> MQTT: path <topic>/<tag>, or <topic> without a tag; QoS 1.
    subs = [conn(ctx, "sub311", version=4), conn(ctx, "sub5", version=5)]
    for s in subs:
        expect_exact(s.subscribe((f"{orders}/#", 2)), [2], f"{s.name} SUBACK")
    producer = rmq.producer(orders)
    rmq.send(producer, orders, b"order-1", tag="created")
    rmq.send(producer, orders, b"order-2")
    want = sorted([(f"{orders}/created", b"order-1", 1), (orders, b"order-2", 1)])
    for s in subs:
        s.inbox.wait_for(lambda ms: len(ms) >= 2, ctx.wait_s(15))
    for s in subs:
        got_mqtt = sorted((m.topic, m.payload, m.qos) for m in s.inbox.snapshot())
        ctx.details[f"{s.name}_received"] = [m.short() for m in s.inbox.snapshot()]
        expect_exact(got_mqtt, want, f"{s.name} (MQTT {'5.0' if s.version == 5 else '3.1.1'}) got")


SCENARIOS = {
    "connect": sc_connect,
    "qos": sc_qos,
    "retained": sc_retained,
    "wildcards": sc_wildcards,
    "will": sc_will,
    "shared": sc_shared,
    "properties": sc_properties,
    "cross_protocol": sc_cross_protocol,
}

if __name__ == "__main__":
    run(CLIENT, SCENARIOS, sys.argv)
