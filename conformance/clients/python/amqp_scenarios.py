"""AMQP 0-9-1 conformance scenarios driven by pika 1.4.4 (BlockingConnection) or aio-pika 10.2.1.

Runs in ``.venv-conformance``, never in the gateway's ``.venv``; imports nothing from the project.

    .venv-conformance/bin/python conformance/clients/python/amqp_scenarios.py SCENARIO CONFIG_JSON

``config["client"]`` is ``pika`` or ``aiopika``; ``config["amqp"]`` the gateway's AMQP host/port,
``config["mqtt"]`` its MQTT port (cross_protocol, with Paho). The scenario logic is written once
against `Client`, a small synchronous facade with one implementation per library (the aio-pika one
drives its own event loop), so both libraries run exactly the same checks. Prints one JSON line:
{"ok": bool, "reason": str, "details": {...}}.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

TIMEOUT = 10.0


class Fail(Exception):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Fail(what)


@dataclass
class Msg:
    body: bytes
    props: dict
    redelivered: bool
    tag: int
    routing_key: str = ""
    exchange: str = ""


@dataclass
class ChannelClosed(Exception):
    code: int
    text: str = ""


PROPS = {
    "content_type": "application/json",
    "content_encoding": "utf-8",
    "headers": {"s": "text", "i": 42, "neg": -7, "f": True, "nested": {"k": "v"}, "list": [1, "two"]},
    "delivery_mode": 2,
    "priority": 3,
    "correlation_id": "corr-1",
    "reply_to": "replies",
    "expiration": "600000",
    "message_id": "mid-1",
    "timestamp": 1700000000,
    "type": "order.created",
    "user_id": "guest",
    "app_id": "conformance",
}


# ----------------------------------------------------------------------------- pika


class PikaClient:
    def __init__(self, host: str, port: int) -> None:
        import pika

        self.pika = pika
        params = pika.ConnectionParameters(
            host=host, port=port, credentials=pika.PlainCredentials("guest", "guest")
        )
        self.conn = pika.BlockingConnection(params)
        self.ch = self.conn.channel()
        self.returns: list[tuple[int, str, bytes]] = []
        self.ch.add_on_return_callback(
            lambda _ch, method, _p, body: self.returns.append((method.reply_code, method.reply_text, body))
        )
        self.confirming = False

    def new(self) -> PikaClient:
        c = object.__new__(PikaClient)
        c.__dict__.update(self.__dict__)
        c.ch = self.conn.channel()
        c.returns = []
        c.ch.add_on_return_callback(
            lambda _ch, method, _p, body: c.returns.append((method.reply_code, method.reply_text, body))
        )
        c.confirming = False
        return c

    def _wrap(self, fn, *a, **k):
        try:
            return fn(*a, **k)
        except self.pika.exceptions.ChannelClosedByBroker as e:
            raise ChannelClosed(e.reply_code, e.reply_text) from None

    def reopen(self) -> None:
        self.ch = self.conn.channel()

    def confirm(self) -> None:
        self.ch.confirm_delivery()
        self.confirming = True

    def qos(self, n: int) -> None:
        self.ch.basic_qos(prefetch_count=n)

    def queue(
        self,
        name: str,
        durable: bool = False,
        args: dict | None = None,
        passive: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
    ) -> tuple[str, int]:
        r = self._wrap(
            self.ch.queue_declare,
            name,
            passive=passive,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=args,
        )
        return r.method.queue, r.method.message_count

    def exchange(self, name: str, kind: str, durable: bool = False) -> None:
        self._wrap(self.ch.exchange_declare, name, kind, durable=durable)

    def bind(self, queue: str, exchange: str, key: str = "", args: dict | None = None) -> None:
        self._wrap(self.ch.queue_bind, queue, exchange, key, arguments=args)

    def publish(
        self, exchange: str, key: str, body: bytes, props: dict | None = None, mandatory: bool = False
    ) -> bool:
        p = self.pika.BasicProperties(**(props or {}))
        try:
            self.ch.basic_publish(exchange, key, body, p, mandatory=mandatory)
            return True
        except self.pika.exceptions.UnroutableError:
            return True  # returned, then confirmed (pika reports it this way)
        except self.pika.exceptions.NackError:
            return False

    def get(self, queue: str, no_ack: bool = False) -> Msg | None:
        end = time.monotonic() + TIMEOUT
        while True:
            m, p, body = self._wrap(self.ch.basic_get, queue, auto_ack=no_ack)
            if m is not None:
                return Msg(body, _pika_props(p), m.redelivered, m.delivery_tag, m.routing_key, m.exchange)
            if time.monotonic() > end:
                return None
            self.conn.sleep(0.05)

    def get_now(self, queue: str) -> Msg | None:
        m, p, body = self._wrap(self.ch.basic_get, queue, auto_ack=True)
        return None if m is None else Msg(body, _pika_props(p), m.redelivered, m.delivery_tag)

    def ack(self, tag: int, multiple: bool = False) -> None:
        self.ch.basic_ack(tag, multiple)

    def reject(self, tag: int, requeue: bool) -> None:
        self.ch.basic_reject(tag, requeue)

    def nack(self, tag: int, requeue: bool) -> None:
        self.ch.basic_nack(tag, requeue=requeue)

    def consume(self, queue: str, on_msg, no_ack: bool = False, exclusive: bool = False) -> str:
        def cb(ch, m, p, body):
            on_msg(Msg(body, _pika_props(p), m.redelivered, m.delivery_tag, m.routing_key, m.exchange))

        return self.ch.basic_consume(queue, cb, auto_ack=no_ack, exclusive=exclusive)

    def pump(self, until, timeout: float = TIMEOUT) -> bool:
        end = time.monotonic() + timeout
        while not until():
            if time.monotonic() > end:
                return False
            self.conn.process_data_events(time_limit=0.05)
        return True

    def connection_open(self) -> bool:
        return self.conn.is_open

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


def _pika_props(p) -> dict:
    out = {}
    for k in PROPS:
        v = getattr(p, k, None)
        if v is not None:
            out[k] = v
    return out


# ----------------------------------------------------------------------------- aio-pika

_REPLY_CODES = {"ACCESS_REFUSED": 403, "NOT_FOUND": 404, "RESOURCE_LOCKED": 405, "PRECONDITION_FAILED": 406}


class AioPikaClient:
    """A synchronous facade: every call runs the aio-pika coroutine on this client's loop."""

    def __init__(
        self, host: str, port: int, loop: asyncio.AbstractEventLoop | None = None, conn=None
    ) -> None:
        import aio_pika

        self.ap = aio_pika
        self.loop = loop or asyncio.new_event_loop()
        self.conn = conn or self.run(aio_pika.connect(host=host, port=port, login="guest", password="guest"))
        self.returns: list[tuple[int, str, bytes]] = []
        self.ch = None
        self.confirming = False
        self.reopen()

    def run(self, coro, timeout: float = TIMEOUT):
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def new(self) -> AioPikaClient:
        return AioPikaClient("", 0, self.loop, self.conn)

    def _wrap(self, coro):
        try:
            return self.run(coro)
        except self.ap.exceptions.ChannelClosed as e:
            text = str(e)
            code = next((c for name, c in _REPLY_CODES.items() if name in text), 0)
            raise ChannelClosed(code, text) from None

    def _do(self, coro):
        """Run now, or schedule when called from a consumer callback (the loop is running)."""
        if self.loop.is_running():
            return asyncio.ensure_future(coro)
        return self.run(coro)

    def reopen(self, confirm: bool = False) -> None:
        async def go():
            return await self.conn.channel(publisher_confirms=confirm, on_return_raises=False)

        self.ch = self.run(go())
        self.confirming = confirm

        def on_return(_ch, msg):
            self.returns.append((312, "NO_ROUTE", msg.body))

        self.ch.return_callbacks.add(on_return)

    def confirm(self) -> None:
        self.reopen(confirm=True)

    def qos(self, n: int) -> None:
        self.run(self.ch.set_qos(prefetch_count=n))

    def queue(self, name, durable=False, args=None, passive=False, exclusive=False, auto_delete=False):
        q = self._wrap(
            self.ch.declare_queue(
                name,
                durable=durable,
                arguments=args,
                passive=passive,
                exclusive=exclusive,
                auto_delete=auto_delete,
            )
        )
        return q.name, q.declaration_result.message_count

    def exchange(self, name, kind, durable=False):
        self._wrap(self.ch.declare_exchange(name, kind, durable=durable))

    def bind(self, queue, exchange, key="", args=None):
        async def go():
            q = await self.ch.get_queue(queue, ensure=False)
            await q.bind(exchange, key, arguments=args)

        self._wrap(go())

    def publish(self, exchange, key, body, props=None, mandatory=False) -> bool:
        async def go():
            ex = await self.ch.get_exchange(exchange, ensure=False) if exchange else self.ch.default_exchange
            p = dict(props or {})
            if "expiration" in p:
                p["expiration"] = int(p["expiration"]) / 1000  # aio-pika: seconds
            msg = self.ap.Message(body, **p)
            r = await ex.publish(msg, key, mandatory=mandatory)
            return r

        if self.loop.is_running():
            asyncio.ensure_future(go())
            return True
        try:
            r = self._wrap(go())
        except self.ap.exceptions.DeliveryError:
            return False
        return type(r).__name__ != "Nack"

    def _msg(self, m) -> Msg:
        props = {}
        for k in PROPS:
            v = getattr(m, k, None)
            if k == "delivery_mode" and v is not None:
                v = int(v)
            if k == "timestamp" and v is not None:
                v = int(v.timestamp())
            if k == "expiration" and v is not None:
                v = str(int(v * 1000)) if isinstance(v, (int, float)) else str(v)
            if v is not None and v != {}:
                props[k] = v
        return Msg(m.body, props, m.redelivered, m.delivery_tag, m.routing_key or "", m.exchange or "")

    def get(self, queue, no_ack=False) -> Msg | None:
        async def go():
            q = await self.ch.get_queue(queue, ensure=False)
            end = time.monotonic() + TIMEOUT
            while True:
                m = await q.get(no_ack=no_ack, fail=False)
                if m is not None:
                    return self._msg(m)
                if time.monotonic() > end:
                    return None
                await asyncio.sleep(0.05)

        return self._wrap(go())

    def get_now(self, queue):
        async def go():
            q = await self.ch.get_queue(queue, ensure=False)
            m = await q.get(no_ack=True, fail=False)
            return None if m is None else self._msg(m)

        return self._wrap(go())

    def ack(self, tag, multiple=False):
        self._do(self.ch.channel.basic_ack(tag, multiple=multiple))

    def reject(self, tag, requeue):
        self._do(self.ch.channel.basic_reject(tag, requeue=requeue))

    def nack(self, tag, requeue):
        self._do(self.ch.channel.basic_nack(tag, requeue=requeue))

    def consume(self, queue, on_msg, no_ack=False, exclusive=False):
        async def go():
            q = await self.ch.get_queue(queue, ensure=False)

            async def cb(m):
                on_msg(self._msg(m))

            return await q.consume(cb, no_ack=no_ack, exclusive=exclusive)

        return self._wrap(go())

    def pump(self, until, timeout: float = TIMEOUT) -> bool:
        async def go():
            end = time.monotonic() + timeout
            while not until():
                if time.monotonic() > end:
                    return False
                await asyncio.sleep(0.02)
            return True

        return self.loop.run_until_complete(go())

    def connection_open(self) -> bool:
        return not self.conn.is_closed

    def close(self):
        with contextlib.suppress(Exception):
            self.run(self.conn.close())


# ----------------------------------------------------------------------------- scenarios


@dataclass
class Ctx:
    cfg: dict
    client: Any
    details: dict = field(default_factory=dict)

    def name(self, role: str) -> str:
        return f"{self.cfg['prefix']}-{role}"


def s_connect_confirm(c: Ctx) -> None:
    cl = c.client
    q, n = cl.queue(c.name("q"), durable=True)
    check(n == 0, f"new queue has {n} messages")
    cl.confirm()
    for i in range(20):
        check(cl.publish("", q, f"m{i}".encode(), PROPS), f"publish {i} not confirmed (nack)")
    _, n = cl.queue(q, passive=True)
    check(n == 20, f"passive declare-ok message_count {n}, want 20")
    m = cl.get(q)
    check(m is not None, "basic.get: nothing")
    check(m.body == b"m0", f"first body {m.body!r}")
    for k, v in PROPS.items():
        got = m.props.get(k)
        if k == "headers":
            got = _plain(got)  # exactly as published: no traceparent added (issue 47)
        check(got == v, f"property {k}: got {got!r}, want {v!r}")
    cl.ack(m.tag)
    bodies = []
    for _ in range(19):
        m = cl.get(q)
        check(m is not None, "basic.get: message missing")
        bodies.append(m.body)
        cl.ack(m.tag)
    check(bodies == [f"m{i}".encode() for i in range(1, 20)], f"order {bodies[:5]}")
    check(cl.get_now(q) is None, "queue not empty after 20 gets")
    c.details["confirmed"] = 20


def _plain(v):
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, bytes):
        return v.decode()
    return v


def s_work_queue(c: Ctx) -> None:
    cl = c.client
    q, _ = cl.queue(c.name("work"))
    a, b = cl.new(), cl.new()
    got: dict[str, list[int]] = {"a": [], "b": []}

    for who, ch in (("a", a), ("b", b)):
        ch.qos(1)

        def on(m, who=who, ch=ch):
            got[who].append(int(m.body))
            ch.ack(m.tag)

        ch.consume(q, on)
    for i in range(20):
        cl.publish("", q, str(i).encode())
    ok = cl.pump(lambda: len(got["a"]) + len(got["b"]) >= 20)
    check(ok, f"only {len(got['a']) + len(got['b'])} of 20 delivered")
    all_ = sorted(got["a"] + got["b"])
    check(all_ == list(range(20)), f"lost or duplicated: {all_}")
    check(got["a"] == sorted(got["a"]) and got["b"] == sorted(got["b"]), f"out of order per consumer {got}")
    check(min(len(got["a"]), len(got["b"])) >= 5, f"unfair split {len(got['a'])}/{len(got['b'])}")
    c.details["split"] = [len(got["a"]), len(got["b"])]


def s_topic_routing(c: Ctx) -> None:
    cl = c.client
    ex = c.name("topic")
    cl.exchange(ex, "topic")
    qs = {}
    for role, key in (
        ("star", "stock.*.nyse"),
        ("hash", "stock.#"),
        ("tail", "#.eur"),
        ("exact", "stock.ibm.nyse"),
    ):
        qs[role], _ = cl.queue(c.name(role), exclusive=True)
        cl.bind(qs[role], ex, key)
    cl.confirm()
    for key in ("stock.ibm.nyse", "stock.ibm.lse.x", "stock", "fx.usd.eur", "stock.eur", "other"):
        cl.publish(ex, key, key.encode())
    want = {
        "star": ["stock.ibm.nyse"],
        "hash": ["stock.ibm.nyse", "stock.ibm.lse.x", "stock", "stock.eur"],
        "tail": ["fx.usd.eur", "stock.eur"],
        "exact": ["stock.ibm.nyse"],
    }
    for role, keys in want.items():
        got = []
        while True:
            m = cl.get_now(qs[role])
            if m is None:
                break
            got.append(m.body.decode())
        check(got == keys, f"{role}: got {got}, want {keys}")
    dx = c.name("direct")
    cl.exchange(dx, "direct")
    dq, _ = cl.queue(c.name("dq"), exclusive=True)
    cl.bind(dq, dx, "red")
    cl.publish(dx, "blue", b"blue")
    cl.publish(dx, "red", b"red")
    m = cl.get(dq, no_ack=True)
    check(m is not None and m.body == b"red" and m.routing_key == "red", f"direct: {m}")
    check(cl.get_now(dq) is None, "direct: blue routed")


def s_fanout_headers(c: Ctx) -> None:
    cl = c.client
    fx = c.name("fan")
    cl.exchange(fx, "fanout")
    qs = []
    for i in range(3):
        q, _ = cl.queue(c.name(f"f{i}"), exclusive=True)
        cl.bind(q, fx, "ignored")
        qs.append(q)
    cl.confirm()
    cl.publish(fx, "any.key", b"fan")
    for q in qs:
        m = cl.get(q, no_ack=True)
        check(m is not None and m.body == b"fan", f"fanout: {q} got {m}")
    hx = c.name("hdr")
    cl.exchange(hx, "headers")
    qall, _ = cl.queue(c.name("all"), exclusive=True)
    qany, _ = cl.queue(c.name("any"), exclusive=True)
    cl.bind(qall, hx, "", {"x-match": "all", "format": "pdf", "type": "report"})
    cl.bind(qany, hx, "", {"x-match": "any", "format": "pdf", "type": "report"})
    cl.publish(hx, "", b"both", {"headers": {"format": "pdf", "type": "report"}})
    cl.publish(hx, "", b"one", {"headers": {"format": "pdf", "type": "log"}})
    cl.publish(hx, "", b"none", {"headers": {"format": "zip"}})
    ga = [m.body for m in iter(lambda: cl.get_now(qall), None)]
    gy = [m.body for m in iter(lambda: cl.get_now(qany), None)]
    check(ga == [b"both"], f"x-match all got {ga}")
    check(gy == [b"both", b"one"], f"x-match any got {gy}")


def s_rpc(c: Ctx) -> None:
    cl = c.client
    server = cl.new()
    rq, _ = server.queue(c.name("rpc"))

    def serve(m):
        server.publish("", m.props["reply_to"], m.body.upper(), {"correlation_id": m.props["correlation_id"]})
        server.ack(m.tag)

    server.consume(rq, serve)
    reply_q, _ = cl.queue("", exclusive=True)
    check(reply_q.startswith("amq.gen-"), f"server-named queue {reply_q!r}")
    replies: dict[str, bytes] = {}
    cl.consume(reply_q, lambda m: replies.__setitem__(m.props.get("correlation_id"), m.body), no_ack=True)
    for i in range(5):
        cl.publish("", rq, f"req{i}".encode(), {"reply_to": reply_q, "correlation_id": f"c{i}"})
    check(cl.pump(lambda: len(replies) >= 5), f"replies {replies}")
    check(replies == {f"c{i}": f"REQ{i}".encode() for i in range(5)}, f"replies {replies}")


def s_requeue_dlx(c: Ctx) -> None:
    cl = c.client
    dlx = c.name("dlx")
    cl.exchange(dlx, "direct")
    dead, _ = cl.queue(c.name("dead"), exclusive=True)
    cl.bind(dead, dlx, "dead-key")
    q, _ = cl.queue(
        c.name("src"), args={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead-key"}
    )
    cl.confirm()
    cl.publish("", q, b"one")
    m = cl.get(q)
    check(m is not None and not m.redelivered, f"first delivery {m}")
    cl.reject(m.tag, True)
    m = cl.get(q)
    check(m is not None and m.body == b"one" and m.redelivered, f"requeued delivery {m}")
    cl.nack(m.tag, False)
    d = cl.get(dead, no_ack=True)
    check(d is not None and d.body == b"one", f"dead-lettered: {d}")
    check(d.routing_key == "dead-key", f"dead-letter routing key {d.routing_key!r}")
    xd = _plain((d.props.get("headers") or {}).get("x-death"))
    check(
        isinstance(xd, list) and xd and xd[0].get("reason") == "rejected" and xd[0].get("queue") == q,
        f"x-death {xd}",
    )
    check(cl.get_now(q) is None, "source queue not empty")


def s_mandatory_return(c: Ctx) -> None:
    cl = c.client
    cl.confirm()
    ok = cl.publish("", c.name("nowhere"), b"lost", mandatory=True)
    check(ok, "unroutable mandatory publish was nacked")
    check(cl.pump(lambda: len(cl.returns) >= 1, 5), "no basic.return")
    code, _text, body = cl.returns[0]
    check(code == 312 and body == b"lost", f"return {cl.returns[0]}")
    q, _ = cl.queue(c.name("q"), exclusive=True)
    cl.publish("", q, b"kept", mandatory=True)
    m = cl.get(q, no_ack=True)
    check(m is not None and m.body == b"kept", f"routable mandatory: {m}")
    check(len(cl.returns) == 1, "routable publish returned")


def s_channel_errors(c: Ctx) -> None:
    cl = c.client
    q, _ = cl.queue(c.name("q"), durable=False, args={"x-max-length": 10})
    try:
        cl.queue(q, args={"x-max-length": 20})
        raise Fail("inequivalent redeclare accepted")
    except ChannelClosed as e:
        check(e.code == 406, f"redeclare: code {e.code} {e.text}")
    check(cl.connection_open(), "connection closed after a channel error")
    cl.reopen()
    try:
        cl.queue(c.name("missing"), passive=True)
        raise Fail("passive declare of a missing queue succeeded")
    except ChannelClosed as e:
        check(e.code == 404, f"passive: code {e.code} {e.text}")
    cl.reopen()
    cl.publish("", q, b"still")
    m = cl.get(q, no_ack=True)
    check(m is not None and m.body == b"still", "connection unusable after channel errors")


def s_cross_protocol(c: Ctx) -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    cl = c.client
    q, _ = cl.queue(c.name("x"), durable=True)
    got: list[tuple[str, bytes]] = []
    ev = threading.Event()
    m = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=c.name("mq"), protocol=mqtt.MQTTv311)
    m.on_message = lambda _c, _u, msg: got.append((msg.topic, msg.payload))
    m.on_subscribe = lambda *a: ev.set()
    m.connect(c.cfg["mqtt"]["host"], c.cfg["mqtt"]["port"])
    m.loop_start()
    try:
        m.subscribe(f"{q}/#", qos=1)
        check(ev.wait(TIMEOUT), "no SUBACK")
        cl.confirm()
        check(cl.publish("", q, b"from-amqp", {"delivery_mode": 2}), "publish not confirmed")
        end = time.monotonic() + TIMEOUT
        while not got and time.monotonic() < end:
            time.sleep(0.05)
        check(got and got[0] == (q, b"from-amqp"), f"MQTT got {got}")
        # the MQTT subscriber is not the queue's consumer group: the AMQP queue still has it
        a = cl.get(q, no_ack=True)
        check(a is not None and a.body == b"from-amqp", f"AMQP queue lost its copy: {a}")
        info = m.publish(f"{q}/dev1", b"from-mqtt", qos=1)
        info.wait_for_publish(TIMEOUT)
        a = cl.get(q, no_ack=True)
        check(a is not None and a.body == b"from-mqtt", f"AMQP got {a}")
        check(a.routing_key == f"{q}.dev1", f"routing key {a.routing_key!r}")
    finally:
        m.loop_stop()
        m.disconnect()


SCENARIOS = {
    "connect_confirm": s_connect_confirm,
    "work_queue": s_work_queue,
    "topic_routing": s_topic_routing,
    "fanout_headers": s_fanout_headers,
    "rpc": s_rpc,
    "requeue_dlx": s_requeue_dlx,
    "mandatory_return": s_mandatory_return,
    "channel_errors": s_channel_errors,
    "cross_protocol": s_cross_protocol,
}


def main() -> int:
    scenario, cfg = sys.argv[1], json.loads(sys.argv[2])
    host, port = cfg["amqp"]["host"], cfg["amqp"]["port"]
    kind = cfg.get("client", "pika")
    result = {"ok": False, "reason": "", "details": {"client": kind}}
    client = None
    try:
        client = PikaClient(host, port) if kind == "pika" else AioPikaClient(host, port)
        ctx = Ctx(cfg, client, result["details"])
        SCENARIOS[scenario](ctx)
        result["ok"] = True
    except Fail as e:
        result["reason"] = str(e)
    except Exception as e:  # noqa: BLE001
        result["reason"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        if client is not None:
            client.close()
    print(json.dumps(result, default=str), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
