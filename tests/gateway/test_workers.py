"""`gateway start --workers 2` as a real process tree (a supervisor holding the store, two worker
proxies sharing every port with SO_REUSEPORT), driven by real clients of every protocol:

- both workers take connections on the same ports;
- MQTT (aiomqtt, paho), AMQP (aio-pika, pika), CloudEvents (the SDK over httpx), gRPC (the
  apache.rocketmq.v2 stubs) and RocketMQ 4.x (ali-ons, the C++ client) through either worker, with
  a message in through one protocol and out through another;
- an MQTT client id connecting on the other worker takes the session over (5.0 DISCONNECT 0x8E to
  the old connection, session present on the new);
- an AMQP exclusive queue of one worker is locked for the other's connections, and its bindings
  route publishes made through the other worker (pub/sub across workers);
- `kill -9` of a worker loses nothing it acknowledged (MQTT, and the AMQP exclusive queues of the
  other worker), and the supervisor starts another."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time

import aio_pika
import aiomqtt
import grpc
import httpx
import paho.mqtt.client as paho
import pika
import pytest
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2_grpc
from conformance.gateway_proc import GatewayProc
from gateway.workers.supervisor import DIR_PREFIX, PID_FILE, remove_stale_dirs
from tests.adapters.grpc import support as g
from tests.adapters.mqtt.support import drain_messages, qos1_flood
from tests.adapters.remoting.support import needs_alions, needs_cpp, received, run
from tests.gateway.workers_support import worker_serving, workers

pytestmark = pytest.mark.timeout(180)

PROTOCOLS = "grpc,mqtt,remoting,amqp,http"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    root = tmp_path_factory.mktemp("workers")
    args = ["start", "--workers", "2", "--data-dir", str(root / "data"), "--protocols", PROTOCOLS]
    args += ["--auto-create-topics", "--drain-timeout-s", "1"]
    for proto in PROTOCOLS.split(","):
        args += [f"--{proto}-port", "0"]  # chosen once by the supervisor for both workers
    proc = GatewayProc(args, "workers")
    try:
        listeners = proc.wait_ready(90)
        yield proc, listeners
    finally:
        proc.stop(20)


def port(listeners: dict[str, str], proto: str) -> tuple[str, int]:
    host, p = listeners[proto].rsplit(":", 1)
    return host, int(p)


def wait_for(cond, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout} s")


def test_both_workers_accept_on_every_port(gw):
    proc, listeners = gw
    pids = wait_for(lambda: (w := workers(proc.pid)) and len(w) == 2 and w, what="two workers")
    for proto in ("mqtt", "amqp", "grpc", "remoting", "http"):
        host, p = port(listeners, proto)
        socks = [socket.create_connection((host, p)) for _ in range(24)]
        try:
            served = {
                wait_for(lambda s=s, p=p: worker_serving(proc.pid, p, s.getsockname()[1])) for s in socks
            }
        finally:
            for s in socks:
                s.close()
        assert served == set(pids), proto  # 24 connections all on one worker: odds 2^-23


async def test_a_message_goes_in_and_out_through_every_protocol(gw):
    """Each message enters through one protocol and leaves through another; with several
    connections per client, both workers take part."""
    _, listeners = gw
    host, mqtt_port = port(listeners, "mqtt")
    amqp_host, amqp_port = port(listeners, "amqp")
    conn = await aio_pika.connect(host=amqp_host, port=amqp_port)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue("fleet-feed", durable=True)
        await q.bind("amq.topic", "fleet.#")
        # MQTT in (publishers on several connections), gRPC and AMQP out.
        for k in range(4):
            async with aiomqtt.Client(host, mqtt_port, identifier=f"w-pub{k}") as pub:
                for i in range(5):
                    await pub.publish(f"fleet/{k}", f"m{k}.{i}".encode(), qos=1)
        sent = sorted(f"m{k}.{i}".encode() for k in range(4) for i in range(5))
        async with grpc.aio.insecure_channel(listeners["grpc"]) as gch:
            stub = service_pb2_grpc.MessagingServiceStub(gch)
            got = await receive_until(stub, "w-grpc", "fleet", 20)
            assert sorted(m.body for m in got) == sent
            got_a: list[bytes] = []
            async with q.iterator() as it:
                async for m in it:
                    got_a.append(m.body)
                    await m.ack()
                    if len(got_a) == 20:
                        break
            assert sorted(got_a) == sent
            # gRPC in, MQTT out (a subscriber on each of several connections).
            async with contextlib.AsyncExitStack() as stack:
                subs = []
                for i in range(4):
                    s = await stack.enter_async_context(
                        aiomqtt.Client(host, mqtt_port, identifier=f"w-sub{i}")
                    )
                    await s.subscribe("alerts", qos=1)
                    subs.append(s)
                for i in range(5):
                    r = await g.send(stub, g.msg("alerts", f"a{i}".encode()))
                    assert r.status.code == d.OK, r.status
                for s in subs:
                    assert [m.payload for m in await drain_messages(s, 5)] == [
                        f"a{i}".encode() for i in range(5)
                    ]
                # CloudEvents in (the SDK's binary mode over httpx), MQTT out.
                ev = CloudEvent({"type": "order.created", "source": "/shop", "id": "e1"}, {"n": 1})
                msg = to_binary_event(ev)
                async with httpx.AsyncClient(base_url=f"http://{listeners['http']}") as http:
                    r = await http.post("/topics/alerts/events", headers=msg.headers, content=msg.body)
                    assert r.status_code == 202, r.text
                for s in subs:
                    assert [json.loads(m.payload) for m in await drain_messages(s, 1)] == [{"n": 1}]
    finally:
        await conn.close()


async def receive_until(stub, group: str, topic: str, n: int, timeout: float = 20.0) -> list[d.Message]:
    """Receive and ack until `n` messages arrived or `timeout` passed."""
    out: list[d.Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        st, msgs, _ = await g.receive(stub, group, topic, batch=32, poll_ms=500)
        assert st.code in (d.OK, d.MESSAGE_NOT_FOUND), st
        if msgs:
            r = await g.ack(stub, group, topic, *[m.system_properties.receipt_handle for m in msgs])
            assert all(e.status.code == d.OK for e in r.entries), r
        out += msgs
    return out


@needs_alions
@needs_cpp
async def test_4x_clients_through_the_workers(gw, tmp_path):
    _, listeners = gw
    home = tmp_path / "home"
    sent = await run("alions", "produce", "--namesrv", listeners["remoting"], "--topic", "old4",
                     "--count", "6", "--prefix", "w", home=home)  # fmt: skip
    assert [e["status"] for e in sent] == ["SEND_OK"] * 6
    got = await run("cpp", "consume", "--namesrv", listeners["remoting"], "--topic", "old4",
                    "--group", "g-old4", "--expect", "6", home=home)  # fmt: skip
    assert sorted(e["body"] for e in received(got)) == sorted(e["body"] for e in sent)


class PahoSession:
    """A paho 5.0 client with a persistent session; records its CONNACK and DISCONNECT."""

    def __init__(self, host: str, port: int, ident: str) -> None:
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=ident, protocol=paho.MQTTv5)
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.session_present: bool | None = None
        self.disconnect_reason: int | None = None
        self.messages: list[bytes] = []
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.c.on_message = lambda _c, _u, m: self.messages.append(m.payload)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 300
        self.c.connect(host, port, clean_start=False, properties=props)
        self.c.loop_start()
        assert self.connected.wait(10), "no CONNACK"
        self.local_port = self.c.socket().getsockname()[1]

    def _on_connect(self, _c, _u, flags, reason, _props) -> None:
        self.session_present = bool(flags.session_present)
        self.connected.set()

    def _on_disconnect(self, _c, _u, _flags, reason, _props) -> None:
        self.disconnect_reason = reason.value if hasattr(reason, "value") else int(reason)
        self.disconnected.set()
        self.c.loop_stop() if threading.current_thread() is not self.c._thread else None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.c.disconnect()
        with contextlib.suppress(Exception):
            self.c.loop_stop()


def test_mqtt_client_id_taken_over_on_the_other_worker(gw):
    proc, listeners = gw
    host, p = port(listeners, "mqtt")
    first = PahoSession(host, p, "dev-roam")
    first.c.subscribe("roam/#", qos=1)
    time.sleep(0.3)
    holder, holder_worker = first, wait_for(lambda: worker_serving(proc.pid, p, first.local_port))
    opened = [first]
    try:
        for _ in range(40):  # until a connection lands on the other worker
            nxt = PahoSession(host, p, "dev-roam")
            opened.append(nxt)
            w = wait_for(lambda n=nxt: worker_serving(proc.pid, p, n.local_port))
            assert holder.disconnected.wait(10), "the older connection of the id was not closed"
            assert holder.disconnect_reason == 0x8E  # Session taken over
            assert nxt.session_present is True
            if w != holder_worker:
                break
            holder = nxt
        else:
            pytest.fail("40 connections all landed on one worker")
        # The subscription moved with the session: a message reaches the new connection.
        with contextlib.closing(PahoSession(host, p, "roam-pub")) as pub:
            pub.c.publish("roam/1", b"after-takeover", qos=1).wait_for_publish(10)
        wait_for(lambda: b"after-takeover" in nxt.messages, what="delivery after the takeover")
        assert not holder.messages or b"after-takeover" not in holder.messages
    finally:
        for s in opened:
            s.close()


class AmqpConnections:
    """pika connections to the workers' AMQP port, each with the worker serving it."""

    def __init__(self, gw) -> None:
        proc, listeners = gw
        self.supervisor = proc.pid
        self.host, self.port = port(listeners, "amqp")
        self.conns: list[pika.BlockingConnection] = []

    def open(self) -> tuple[pika.BlockingConnection, int]:
        c = pika.BlockingConnection(pika.ConnectionParameters(self.host, self.port, connection_attempts=1))
        self.conns.append(c)
        local = c._impl._transport._sock.getsockname()[1]
        return c, wait_for(lambda: worker_serving(self.supervisor, self.port, local))

    def open_elsewhere(self, worker: int) -> pika.BlockingConnection:
        """A connection served by a worker other than `worker`."""
        for _ in range(40):
            c, w = self.open()
            if w != worker:
                return c
        pytest.fail("40 connections all landed on one worker")

    def close(self) -> None:
        for c in self.conns:
            with contextlib.suppress(Exception):
                c.close()


def test_amqp_exclusive_queue_of_one_worker_is_locked_on_the_other(gw):
    amqp = AmqpConnections(gw)
    try:
        c1, w1 = amqp.open()
        ch1 = c1.channel()
        ch1.queue_declare("only-mine", exclusive=True)
        c2 = amqp.open_elsewhere(w1)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            c2.channel().queue_declare("only-mine", exclusive=True)
        assert e.value.reply_code == 405  # RESOURCE_LOCKED
    finally:
        amqp.close()


def test_amqp_pub_sub_across_workers(gw):
    """RabbitMQ's pub/sub tutorial with the two sides on different workers: the subscriber's
    exclusive queue is bound to a fanout exchange through one worker, publishers declare the
    exchange and publish through the other. Before, the publishing worker knew only its own
    bindings, and every such publish was lost (unroutable)."""
    amqp = AmqpConnections(gw)
    try:
        sub, sub_worker = amqp.open()
        ch = sub.channel()
        ch.exchange_declare("logs", "fanout", durable=False)
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "logs")
        sent = {}
        for i in range(40):
            c, w = amqp.open()
            pub = c.channel()
            pub.exchange_declare("logs", "fanout", durable=False)
            pub.confirm_delivery()
            pub.basic_publish("logs", "", f"m{i}".encode(), mandatory=True)  # UnroutableError if lost
            sent[f"m{i}"] = w
            c.close()
            if len(set(sent.values())) == 2 and len(sent) >= 4:
                break
        else:
            pytest.fail("40 connections all landed on one worker")
        got = set()
        deadline = time.monotonic() + 20
        while len(got) < len(sent) and time.monotonic() < deadline:
            method, _, body = ch.basic_get(q, auto_ack=True)
            if method is not None:
                got.add(body.decode())
        assert got == set(sent)
        assert any(w != sub_worker for w in sent.values())
    finally:
        amqp.close()


def test_amqp_queue_deleted_through_one_worker_is_gone_on_the_other(gw):
    """A queue known to both workers is deleted through one: on the other, a passive declare is
    404 NOT_FOUND and a declare with other flags makes a new queue. Before, the other worker kept
    the deleted queue until its restart (declare-ok for the passive declare, 406 for new flags)."""
    amqp = AmqpConnections(gw)
    try:
        c1, w1 = amqp.open()
        ch1 = c1.channel()
        ch1.queue_declare("del-me", durable=True)
        c2 = amqp.open_elsewhere(w1)
        c2.channel().queue_declare("del-me", durable=True)  # known to the other worker too
        ch1.queue_delete("del-me")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            c2.channel().queue_declare("del-me", passive=True)
        assert e.value.reply_code == 404
        ch2 = c2.channel()
        ch2.queue_declare("del-me", durable=False, arguments={"x-max-length": 3})
        ch1.confirm_delivery()
        ch1.basic_publish("", "del-me", b"to-the-new-queue", mandatory=True)
        method, _, body = ch2.basic_get("del-me", auto_ack=True)
        assert body == b"to-the-new-queue"
    finally:
        amqp.close()


def test_amqp_kill9_of_a_worker_spares_the_other_workers_exclusive_queues(gw):
    """Subscribers' exclusive queues on both workers, bound to one fanout exchange; `kill -9` of
    one worker. Its replacement removes the dead worker's queue but not the live one: a confirmed
    message published before the kill is still there, and so is every one published after through
    either worker (each confirmed, and routed: mandatory). Before, the replacement removed every
    transient queue it found, the live worker's included, with its confirmed messages."""
    proc = gw[0]
    amqp = AmqpConnections(gw)

    def subscriber() -> tuple[object, str, int]:
        c, w = amqp.open()
        ch = c.channel()
        ch.exchange_declare("k9-fan", "fanout", durable=True)
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "k9-fan")
        return ch, q, w

    def publish(body: bytes) -> None:
        """Through a new connection (either worker), confirmed; UnroutableError if routed nowhere."""
        c, _ = amqp.open()
        ch = c.channel()
        ch.confirm_delivery()
        ch.basic_publish("k9-fan", "", body, mandatory=True)
        c.close()

    try:
        live_ch, live_q, live_w = subscriber()
        for _ in range(40):
            _, _, dead_w = subscriber()
            if dead_w != live_w:
                break
        else:
            pytest.fail("40 connections all landed on one worker")
        publish(b"before")
        os.kill(dead_w, signal.SIGKILL)
        assert proc.wait_line(rf"worker \d \(pid {dead_w}\) exited", 10)
        assert proc.wait_line(r"worker \d ready", 30)  # its replacement has started
        sent = [b"before"] + [f"after-{i}".encode() for i in range(12)]
        for body in sent[1:]:
            publish(body)
        got = []
        deadline = time.monotonic() + 20
        while len(got) < len(sent) and time.monotonic() < deadline:
            method, _, body = live_ch.basic_get(live_q, auto_ack=True)
            if method is not None:
                got.append(body)
        twice = sorted(b for b, n in collections.Counter(got).items() if n > 1)
        assert sorted(got) == sorted(sent), {"missing": sorted(set(sent) - set(got)), "twice": twice}
    finally:
        amqp.close()


async def test_kill9_of_a_worker_loses_nothing_acknowledged(gw):
    proc, listeners = gw
    host, p = port(listeners, "mqtt")
    before = workers(proc.pid)
    assert len(before) == 2
    async with aiomqtt.Client(host, p, identifier="k9-keeper", clean_session=False) as keeper:
        await keeper.subscribe("k9w/#", qos=1)  # then offline: the session keeps the messages
    # A publisher on the worker to be killed.
    for _ in range(40):
        pub = aiomqtt.Client(host, p, identifier="k9-pub")
        await pub.__aenter__()
        local = pub._client.socket().getsockname()[1]
        victim = await asyncio.to_thread(wait_for, lambda lp=local: worker_serving(proc.pid, p, lp))
        if victim == before[0]:
            break
        await pub.__aexit__(None, None, None)
    else:
        pytest.fail("40 connections all landed on one worker")
    acked: list[int] = []

    task = asyncio.ensure_future(qos1_flood(pub, "k9w", acked))
    while len(acked) < 200:
        await asyncio.sleep(0.01)
    os.kill(victim, signal.SIGKILL)
    await asyncio.sleep(0.5)
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    with contextlib.suppress(BaseException):
        await pub.__aexit__(None, None, None)
    assert acked, "nothing was acknowledged"
    # The supervisor starts another worker in its place.
    after = await asyncio.to_thread(
        wait_for,
        lambda: (w := workers(proc.pid)) and len(w) == 2 and victim not in w and w,
        30,
        "a new worker",
    )
    assert victim not in after
    assert await asyncio.to_thread(proc.wait_line, rf"worker \d \(pid {victim}\) exited", 10)
    # Every acknowledged message reaches the persistent session, through whichever worker.
    # (at least once: some come twice, so read until each has come or 30 s passed)
    want, seen = set(acked), set()

    async def until_all(keeper: aiomqtt.Client) -> None:
        async for m in keeper.messages:
            seen.add(int(m.payload))
            if want <= seen:
                return

    async with aiomqtt.Client(host, p, identifier="k9-keeper", clean_session=False) as keeper:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(until_all(keeper), 30)
    assert want - seen == set()


def test_a_port_another_program_holds_is_refused_not_shared(tmp_path):
    """Another program listening with SO_REUSEPORT itself: the workers could bind beside it and
    share its connections; the supervisor checks the ports without SO_REUSEPORT and exits 1."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    args = ["start", "--workers", "2", "--data-dir", str(tmp_path / "data"), "--protocols", "mqtt,http"]
    proc = GatewayProc([*args, "--mqtt-port", str(taken), "--http-port", "0"], "workers-busy")
    try:
        assert proc.p.wait(60) == 1
        assert f"mqtt cannot listen on 127.0.0.1:{taken}" in proc.drain()
        assert not workers(proc.pid)
    finally:
        proc.kill()
        holder.close()


def test_a_supervisors_socket_directory_is_removed_once_it_is_gone(tmp_path):
    """After a supervisor's kill -9 its private socket directory stays; the next supervisor removes
    the directories whose pid file names a process that no longer exists, and only those."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale, live, starting = (tmp_path / f"{DIR_PREFIX}{n}" for n in ("stale", "live", "starting"))
    for sd in (stale, live, starting):
        sd.mkdir()
        (sd / "store.sock").touch()
    (stale / PID_FILE).write_text(str(gone.pid))
    (live / PID_FILE).write_text(str(os.getpid()))
    assert remove_stale_dirs(str(tmp_path)) == [stale]
    assert not stale.exists() and live.exists() and starting.exists()
