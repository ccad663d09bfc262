"""MQTT conformance scenarios driven by the Debian ``mosquitto_pub`` / ``mosquitto_sub`` tools
(mosquitto-clients 2.0, libmosquitto): every MQTT connection is one of their processes.

The driver is Python from ``.venv-conformance`` (the cross-protocol scenario also uses the RocketMQ
5 Python client there); the MQTT traffic is the tools' own.

    .venv-conformance/bin/python conformance/clients/mosquitto/scenarios.py SCENARIO CONFIG_JSON

Config, result line and scenario names: see ../python/mqtt_harness.py and
conformance/protocols/mqtt.py.

- A subscriber is ``mosquitto_sub -d -F 'MSG|%x|%j'`` under ``stdbuf -oL`` (its debug lines are
  otherwise block-buffered in a pipe): ``Subscribed (mid: ...)`` says the SUBACK arrived; each
  message is one line with the payload in hex and topic, QoS, retain flag and 5.0 properties as
  JSON (user properties come as an object with repeated keys: parsed keeping every pair in order).
- A publish is one ``mosquitto_pub -d`` run (several messages of one connection with ``-l``); it
  passed when the tool exited 0 after the PUBACK / PUBCOMP of every message.
- Abnormal disconnect: SIGKILL of a ``mosquitto_sub``; normal disconnect: ``mosquitto_sub -E``
  (exits with a DISCONNECT once subscribed). The tools cannot send DISCONNECT reason 0x04 nor set
  5.0 subscription options (retain handling, retain as published): those checks are left out.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
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

CLIENT = "mosquitto"
MSG_FORMAT = "MSG|%x|%j"  # '@' starts a strftime code in -F, so no '@' here
MAX_SHARED_BATCHES = 3


def version_args(ctx: Ctx, version: int | None) -> list[str]:
    v = version or ctx.version
    return ["-h", ctx.host, "-p", str(ctx.port), "-V", "mqttv5" if v == 5 else "mqttv311"]


def will_args(will: tuple | None) -> list[str]:
    if not will:
        return []
    topic, payload, qos, retain = will
    args = ["--will-topic", topic, "--will-payload", payload.decode(), "--will-qos", str(qos)]
    return args + (["--will-retain"] if retain else [])


class _Pairs(dict):
    """A JSON object that also keeps every (key, value) pair (mosquitto repeats user property keys)."""

    def __init__(self, pairs):
        super().__init__(pairs)
        self.pairs = [list(kv) for kv in pairs]


def parse_message(line: str) -> Received:
    _, hexpayload, js = line.split("|", 2)
    j = json.loads(js, object_pairs_hook=_Pairs)
    props: dict = {}
    p = j.get("properties") or {}
    for key, name in (
        ("content-type", "content_type"),
        ("response-topic", "response_topic"),
        ("payload-format-indicator", "payload_format"),
        ("message-expiry-interval", "expiry"),
    ):
        if key in p:
            props[name] = p[key]
    if "correlation-data" in p:
        props["correlation_data"] = p["correlation-data"].encode()
    if "user-properties" in p:
        props["user_properties"] = p["user-properties"].pairs
    return Received(j["topic"], bytes.fromhex(hexpayload), int(j["qos"]), bool(j["retain"]), props)


class Sub:
    """One ``mosquitto_sub`` process (one connection, its filters subscribed at start)."""

    def __init__(
        self,
        ctx: Ctx,
        name: str,
        filters: list[str],
        qos: int = 1,
        *,
        version: int | None = None,
        client_id: str | None = None,
        will: tuple | None = None,
        extra: tuple[str, ...] = (),
        tee: Inbox | None = None,
        wait: bool = True,
    ) -> None:
        self.ctx = ctx
        self.name = name
        self.client_id = f"{ctx.prefix}-{name}" if client_id is None else client_id
        self.filters = filters
        cmd = ["stdbuf", "-oL", "mosquitto_sub", *version_args(ctx, version), "-d", "-q", str(qos)]
        cmd += ["-F", MSG_FORMAT, "-i", self.client_id, *will_args(will), *extra]
        for f in filters:
            cmd += ["-t", f]
        self.cmd = cmd
        self.inbox = Inbox(name)
        self.tee = tee
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        ctx.on_cleanup(self.stop)
        if wait:
            self.wait_subscribed()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith("MSG|"):
                m = parse_message(line)
                self.inbox.add(m)
                if self.tee is not None:
                    self.tee.add(m)
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.lines.append("<eof>")
            self.cond.notify_all()

    def wait_line(self, pred: Callable[[list[str]], bool], timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self.cond:
            while not pred(self.lines):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def has(self, text: str) -> bool:
        with self.cond:
            return any(text in x for x in self.lines)

    def wait_subscribed(self) -> None:
        ok = self.wait_line(lambda ls: any(x.startswith("Subscribed (mid:") or x == "<eof>" for x in ls), 10)
        check(ok and self.has("Subscribed (mid:"), f"{self.name}: no SUBACK: {self.tail()}")
        check(self.has("received CONNACK (0)"), f"{self.name}: CONNACK not 0: {self.tail()}")

    def granted(self) -> list[int]:
        """The SUBACK's return codes (``Subscribed (mid: 1): 0, 1, 2``)."""
        with self.cond:
            line = next(x for x in self.lines if x.startswith("Subscribed (mid:"))
        return [int(x) for x in line.split("):", 1)[1].split(",")]

    def tail(self, n: int = 6) -> str:
        with self.cond:
            return " | ".join(self.lines[-n:])

    def kill(self) -> None:
        """Abnormal end: SIGKILL, the kernel closes the socket without a DISCONNECT."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(5)

    def exited(self, timeout: float) -> int | None:
        """The exit code once the process ended (and its output was read), None on timeout."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.proc.wait(timeout)
            self.reader.join(timeout)
            return code
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def pub(
    ctx: Ctx,
    topic: str,
    payloads: bytes | list[bytes],
    qos: int = 1,
    *,
    retain: bool = False,
    version: int | None = None,
    client_id: str | None = None,
    props: list[list[str]] | None = None,
) -> str:
    """Publish one message (any bytes) or several (one connection, ``-l``: non-empty UTF-8 lines)
    with ``mosquitto_pub``; returns its debug output. Fails unless every message was acknowledged."""
    many = isinstance(payloads, list)
    cmd = ["mosquitto_pub", *version_args(ctx, version), "-d", "-q", str(qos), "-t", topic]
    if client_id is not None:
        cmd += ["-i", client_id]
    if retain:
        cmd.append("-r")
    for p in props or []:
        cmd += ["-D", "PUBLISH", *p]
    stdin = None
    tmp = None
    if many:
        for p in payloads:
            check(p and b"\n" not in p, "mosquitto_pub -l needs non-empty single-line payloads")
        cmd.append("-l")
        stdin = b"".join(p + b"\n" for p in payloads)
    elif payloads == b"":
        cmd.append("-n")
    else:
        fd, tmp = tempfile.mkstemp(prefix="payload-")
        with os.fdopen(fd, "wb") as f:
            f.write(payloads)
        cmd += ["-f", tmp]
    try:
        r = subprocess.run(cmd, input=stdin, capture_output=True, timeout=ctx.wait_s(15))
    finally:
        if tmp:
            os.unlink(tmp)
    out = r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
    check(r.returncode == 0, f"mosquitto_pub to {topic} exited {r.returncode}: {out[-300:]}")
    n = len(payloads) if many else 1
    if qos:
        acked = len(re.findall(r"received (?:PUBACK|PUBCOMP) \(Mid: \d+, RC:0\)", out))
        check(acked == n, f"mosquitto_pub to {topic}: {acked} of {n} messages acknowledged with reason 0")
    return out


# --------------------------------------------------------------------------- scenarios


def sc_connect(ctx: Ctx) -> None:
    v = ctx.version
    echo = ctx.topic("echo")
    a = Sub(ctx, "a", [echo])
    expect_exact(a.granted(), [1], "granted QoS")
    # Empty client id (mosquitto_pub's default without -i): 3.1.1 allows it with a clean session,
    # 5.0 gets an Assigned Client Identifier (shown as the client's name in the debug lines).
    out = pub(ctx, echo, b"ping")
    m = re.search(r"Client (\S+) received CONNACK \((\d+)\)", out)
    check(m and m.group(2) == "0", f"CONNACK for an empty client id: {out[:300]}")
    if v == 5:
        check(m.group(1) != "(null)", "5.0 CONNACK for an empty client id has no Assigned Client Identifier")
        ctx.details["assigned_client_id"] = m.group(1)
    check("sending DISCONNECT" in out, "mosquitto_pub did not end with a DISCONNECT")
    check(a.inbox.wait_topic(echo, ctx.wait_s()), "the subscriber did not get the message")
    # Takeover: another connection with the subscriber's client id closes the subscriber's.
    pub(ctx, echo, b"takeover", client_id=a.client_id)
    if v == 5:
        ok = a.wait_line(lambda ls: any("DISCONNECT" in x and "Received" in x for x in ls), ctx.wait_s())
        check(ok and a.has("Received DISCONNECT (142)"), f"taken-over client: {a.tail()}")
        check(a.exited(ctx.wait_s()) is not None, "mosquitto_sub still running after DISCONNECT 0x8E")
    else:
        # 3.1.1 has no server DISCONNECT: the connection closes and mosquitto_sub reconnects.
        ok = a.wait_line(lambda ls: sum("sending CONNECT" in x for x in ls) >= 2, ctx.wait_s())
        check(ok, f"taken-over 3.1.1 client was not disconnected: {a.tail()}")
    ctx.details["subscriber_log"] = a.tail(4)


def sc_qos(ctx: Ctx) -> None:
    n = int(ctx.params.get("count", 10))
    # mosquitto_sub has one QoS for all its filters: one subscriber per case.
    subs = {level: Sub(ctx, f"sub{level}", [ctx.topic(level)], sq) for level, sq, _ in QOS_CASES}
    for level, sq, _ in QOS_CASES:
        expect_exact(subs[level].granted(), [sq], f"granted QoS for {level}")
    sent: dict[str, list[bytes]] = {}
    for level, sq, pq in QOS_CASES:
        texts = qos_texts(level, sq, pq, n)
        pub(ctx, ctx.topic(level), texts, pq)  # one connection (-l): order is defined
        extra = list(QOS_EXTRA) if sq == pq else []
        for body in extra:
            pub(ctx, ctx.topic(level), body, pq)
        sent[level] = texts + extra
    received = {}
    for level, sq, pq in QOS_CASES:
        what = f"{level} (publish QoS {pq}, subscription QoS {sq})"
        inbox = subs[level].inbox
        inbox.wait_count(len(sent[level]), ctx.wait_s(15))
        got = inbox.snapshot()
        received[level] = len(got)
        check(len(got) == len(sent[level]), f"{what}: received {len(got)} of {len(sent[level])}")
        # Each mosquitto_pub run is its own connection: order is only defined within the -l batch.
        k = len(sent[level]) - (len(QOS_EXTRA) if sq == pq else 0)
        check(
            [m.payload for m in got[:k]] == sent[level][:k], f"{what}: one connection's messages out of order"
        )
        check(sorted(m.payload for m in got) == sorted(sent[level]), f"{what}: payloads differ")
        qs = sorted({m.qos for m in got})
        check(qs == [min(sq, pq)], f"{what}: delivered with QoS {qs}, expected {min(sq, pq)}")
        check(not any(m.retain for m in got), f"{what}: live message flagged retained")
    ctx.details["received"] = received


def sc_retained(ctx: Ctx) -> None:
    r, s, everything = ctx.topic("r"), ctx.topic("s"), ctx.topic("#")
    pub(ctx, r, b"keep", retain=True)
    pub(ctx, s, b"sentinel", retain=True)
    ctx.on_cleanup(lambda: pub(ctx, s, b"", retain=True))
    s1 = Sub(ctx, "s1", [everything])
    check(s1.inbox.wait_count(2, ctx.wait_s()), f"retained on subscribe: {s1.inbox.topics()}")
    first = {m.topic: m for m in s1.inbox.snapshot()}
    check(set(first) == {r, s}, f"retained on subscribe: {sorted(first)}")
    check(first[r].payload == b"keep" and first[r].retain, f"retained {r}: {first[r].short()}")
    check(first[s].retain, f"retained {s} delivered without the retain flag")
    pub(ctx, r, b"live")
    check(s1.inbox.wait_count(3, ctx.wait_s()), "live publish not delivered")
    live = s1.inbox.snapshot()[2]
    check(live.topic == r and live.payload == b"live" and not live.retain, f"live copy: {live.short()}")
    pub(ctx, r, b"", retain=True)  # clears the retained message
    check(s1.inbox.wait_count(4, ctx.wait_s()), "the empty retained publish was not delivered")
    empty = s1.inbox.snapshot()[3]
    check(empty.topic == r and empty.payload == b"", f"empty retained publish delivered as {empty.short()}")
    s2 = Sub(ctx, "s2", [everything])
    check(s2.inbox.wait_topic(s, ctx.wait_s()), "the remaining retained message was not delivered")
    s2.inbox.wait_topic(r, ctx.quiet)
    check(r not in s2.inbox.topics(), f"cleared retained message still delivered: {s2.inbox.topics()}")
    ctx.details["second_subscriber"] = [m.short() for m in s2.inbox.snapshot()]
    if ctx.version == 5:
        ctx.details["not_checked"] = "retain handling / retain as published: mosquitto_sub cannot set them"


def sc_wildcards(ctx: Ctx) -> None:
    p, d = ctx.prefix, "$" + ctx.prefix
    pubs = [f"{p}/a/temp", f"{p}/b/temp", f"{p}/a/hum", f"{p}/a/b/temp", p, f"{d}/a/temp"]
    expected = {
        "plus": (Sub(ctx, "plus", [f"{p}/+/temp"]), [f"{p}/a/temp", f"{p}/b/temp"]),
        "hash": (Sub(ctx, "hash", [f"{p}/#"]), pubs[:5]),
        "root": (Sub(ctx, "root", ["#"]), pubs[:5]),
        "rootplus": (Sub(ctx, "rootplus", ["+/a/temp"]), [f"{p}/a/temp"]),
        "dollar": (Sub(ctx, "dollar", [f"{d}/#"]), [f"{d}/a/temp"]),
    }
    for t in pubs:
        pub(ctx, t, t.encode())
    for c, want in expected.values():
        c.inbox.wait_for(lambda ms, w=want: {m.topic for m in ms if ctx.own(m.topic)} >= set(w), ctx.wait_s())
    expected["root"][0].inbox.wait_topic(pubs[5], ctx.quiet)  # give a wrong '$' delivery time to show up
    got = {name: sorted(c.inbox.topics(lambda m: ctx.own(m.topic))) for name, (c, _) in expected.items()}
    ctx.details["received"] = got
    for name, (c, want) in expected.items():
        expect_exact(got[name], sorted(want), f"subscriber {name}")
        for m in c.inbox.snapshot(lambda m: ctx.own(m.topic)):
            check(m.payload == m.topic.encode(), f"{name}: payload of {m.topic} is {m.payload!r}")


def sc_will(ctx: Ctx) -> None:
    will_root = ctx.topic("will")
    obs = Sub(ctx, "observer", [f"{will_root}/#"])
    # Normal: subscribe, then DISCONNECT and exit (-E).
    normal = Sub(
        ctx,
        "normal",
        [ctx.topic("idle")],
        will=(f"{will_root}/normal", b"normal-will", 1, False),
        extra=("-E",),
        wait=False,
    )
    code = normal.exited(ctx.wait_s())
    check(code == 0, f"mosquitto_sub -E exited {code}: {normal.tail()}")
    check(normal.has("sending DISCONNECT"), f"no DISCONNECT sent: {normal.tail()}")
    if ctx.version == 5:
        ctx.details["not_checked"] = "DISCONNECT 0x04: the tools always disconnect with reason 0"
    abnormal = Sub(
        ctx, "abnormal", [ctx.topic("idle")], will=(f"{will_root}/abnormal", b"abnormal-will", 1, False)
    )
    abnormal.kill()
    obs.inbox.wait_topic(f"{will_root}/abnormal", ctx.wait_s())
    obs.inbox.wait_topic(f"{will_root}/normal", ctx.quiet)
    got = obs.inbox.snapshot()
    ctx.details["received"] = [m.short() for m in got]
    check(
        f"{will_root}/normal" not in {m.topic for m in got},
        "will published although the client sent a normal DISCONNECT",
    )
    ms = [m for m in got if m.topic == f"{will_root}/abnormal"]
    check(len(ms) == 1, f"will after SIGKILL: received {len(ms)} times")
    check(ms[0].payload == b"abnormal-will" and ms[0].qos == 1, f"will: {ms[0].short()}")


def sc_shared(ctx: Ctx) -> None:
    n = int(ctx.params.get("count", 20))
    share = f"$share/{ctx.prefix}/{ctx.prefix}/#"
    both = Inbox("members")
    members = [Sub(ctx, f"m{i}", [share], tee=both) for i in (1, 2)]
    for m in members:
        expect_exact(m.granted(), [1], f"{m.name} shared SUBACK")
    plain = Sub(ctx, "plain", [ctx.topic("#")])
    sent: list[bytes] = []
    for _ in range(MAX_SHARED_BATCHES):  # see paho_scenarios.sc_shared
        batch = [f"item-{len(sent) + i}".encode() for i in range(n)]
        pub(ctx, ctx.topic("items"), batch)
        sent += batch
        both.wait_count(len(sent), ctx.wait_s(15))
        if all(m.inbox.snapshot() for m in members):
            break
    plain.inbox.wait_count(len(sent), ctx.wait_s())
    both.wait_count(len(sent) + 1, ctx.quiet)  # room for a late duplicate
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
    responder = Sub(ctx, "responder", [req_t])
    requester = Sub(ctx, "requester", [resp_t])
    user = [["trace", "t-1"], ["dup", "1"], ["dup", "2"], ["ünïcode", "välue"]]
    corr = "corr-42"  # mosquitto_sub prints correlation data as text: keep it printable
    props = [["user-property", k, v] for k, v in user] + [
        ["content-type", "application/json"],
        ["response-topic", resp_t],
        ["correlation-data", corr],
        ["payload-format-indicator", "1"],
        ["message-expiry-interval", "120"],
    ]
    pub(ctx, req_t, b'{"q": 1}', props=props)
    check(responder.inbox.wait_topic(req_t, ctx.wait_s()), "request not delivered")
    req = responder.inbox.snapshot()[0]
    ctx.details["request_properties"] = {k: str(v) for k, v in req.props.items()}
    check(req.payload == b'{"q": 1}', f"request payload {req.payload!r}")
    ups = req.props.get("user_properties")  # exactly as sent: no traceparent added (issue 47)
    check(ups == user, f"user properties {req.props.get('user_properties')}")
    check(
        req.props.get("content_type") == "application/json", f"content type {req.props.get('content_type')!r}"
    )
    check(req.props.get("response_topic") == resp_t, f"response topic {req.props.get('response_topic')!r}")
    check(req.props.get("correlation_data") == corr.encode(), f"correlation data {req.props}")
    check(req.props.get("payload_format") == 1, f"payload format {req.props.get('payload_format')!r}")
    expiry = req.props.get("expiry")
    check(expiry is not None and 0 < expiry <= 120, f"message expiry interval {expiry!r}, expected 1..120")
    pub(
        ctx,
        req.props["response_topic"],
        b"answer",
        props=[
            ["user-property", "status", "ok"],
            ["correlation-data", req.props["correlation_data"].decode()],
        ],
    )
    check(requester.inbox.wait_topic(resp_t, ctx.wait_s()), "response not delivered")
    resp = requester.inbox.snapshot()[0]
    check(resp.payload == b"answer", f"response payload {resp.payload!r}")
    check(resp.props.get("correlation_data") == corr.encode(), f"response correlation data {resp.props}")
    resp_ups = resp.props.get("user_properties")
    check(resp_ups == [["status", "ok"]], f"response user properties {resp.props}")
    check("content_type" not in resp.props, "request properties leaked into the response")


def sc_cross_protocol(ctx: Ctx) -> None:
    sensors, orders, group = ctx.topics["sensors"], ctx.topics["orders"], ctx.groups["sensors"]
    rmq = RocketMQSide(ctx)
    consumer = rmq.consumer(group, sensors)
    pub(ctx, f"{sensors}/dev1/temp", b"21.5", version=4)
    pub(
        ctx,
        f"{sensors}/dev2/temp",
        b"19.0",
        version=5,
        props=[["user-property", "unit", "C"], ["content-type", "text/plain"]],
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
    subs = [
        Sub(ctx, "sub311", [f"{orders}/#"], 2, version=4),
        Sub(ctx, "sub5", [f"{orders}/#"], 2, version=5),
    ]
    for s in subs:
        expect_exact(s.granted(), [2], f"{s.name} SUBACK")
    producer = rmq.producer(orders)
    rmq.send(producer, orders, b"order-1", tag="created")
    rmq.send(producer, orders, b"order-2")
    want = sorted([(f"{orders}/created", b"order-1", 1), (orders, b"order-2", 1)])
    for s in subs:
        s.inbox.wait_count(2, ctx.wait_s(15))
    for s in subs:
        ctx.details[f"{s.name}_received"] = [m.short() for m in s.inbox.snapshot()]
        got_mqtt = sorted((m.topic, m.payload, m.qos) for m in s.inbox.snapshot())
        expect_exact(got_mqtt, want, f"{s.name} got")


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
