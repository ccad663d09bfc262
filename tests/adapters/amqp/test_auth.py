"""Authentication and the ACL on the AMQP listener (issue 23), with pika and aio-pika over real
sockets, and our codec over a raw socket where no client sends what is needed (AMQPLAIN, exact
frames, pipelining during the password check).

The arrangement (issue 23's acceptance example, in AMQP terms): the admin `ops` declares the
queue `devices`, bound to `amq.topic` with `#`, and the queue `orders`, bound to `amq.direct` with
`public` and `secret`. A message routed to a queue through a named exchange has the ACL path
`<queue>/<routing key>`, so a device publishing to `amq.topic` with the routing key `dev1/temp`
publishes to `devices/dev1/temp`; the rules are `devices/%u/#` publish for role `user`, `devices/#`
subscribe for `analytics`, `orders/#` publish+subscribe for anyone and a deny of `orders/secret/#`
publish for `dev1`."""

from __future__ import annotations

import asyncio
import functools

import aio_pika
import aiormq
import pika
import pytest

from adapters.amqp.codec import (
    PROTOCOL_HEADER,
    BasicAck,
    ChannelClose,
    ChannelCloseOk,
    ChannelOpen,
    ChannelOpenOk,
    ConfirmSelect,
    ConfirmSelectOk,
    ConnectionClose,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    encode_method,
    encode_publish,
    encode_table,
)
from messaging_processor.security import User, passwords
from tests.adapters.amqp.support import Env, Raw, T, close_env, open_env

PW = "s3cret-pw"
REFUSED_PLAIN = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the "
    "broker logfile."
)


@functools.cache
def pw_hash() -> str:
    return passwords.hash_password(PW)


@pytest.fixture
async def env(tmp_path):
    e = await open_env(str(tmp_path / "data"), auth=True)
    d = e.core.security.directory
    h = pw_hash()  # (one argon2 hash for every user: 0.2 s each otherwise)
    await d.put_user(User("ops", "admin", h))
    for name in ("dev1", "dev2", "analytics"):
        await d.put_user(User(name, "user", h))
    await d.put_user(User("roamer", "user", h, vhosts=("/", "/x")))
    await d.add_rule("role:user", "topic", "devices/%u/#", ("publish",), False)
    await d.add_rule("user:analytics", "topic", "devices/#", ("subscribe",), False)
    await d.add_rule("anyone", "topic", "orders/#", ("publish", "subscribe"), False)
    await d.add_rule("user:dev1", "topic", "orders/secret/#", ("publish",), True)
    await d.add_rule("user:dev2", "topic", "work-%u", ("admin", "subscribe"), False)
    conn = await login(e, "ops")
    ch = await conn.channel()
    devices = await ch.declare_queue("devices", durable=True)
    await devices.bind("amq.topic", "#")
    orders = await ch.declare_queue("orders", durable=True)
    for rk in ("public", "secret"):
        await orders.bind("amq.direct", rk)
    await conn.close()
    yield e
    await close_env(e)


async def login(env: Env, user: str, password: str = PW, vhost: str = "") -> aio_pika.abc.AbstractConnection:
    return await aio_pika.connect(f"amqp://{user}:{password}@127.0.0.1:{env.port}/{vhost}", timeout=T)


def blocking(env: Env, user: str, password: str = PW, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            env.port,
            vhost,
            pika.PlainCredentials(user, password),
            connection_attempts=1,
            blocked_connection_timeout=T,
        )
    )


async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    """A consumer callback that is never called."""


async def queue_bodies(env: Env, queue: str, at_least: int = 0) -> list[bytes]:
    """Every message in `queue`, read by the admin with basic.get; first waits (polling, at most T)
    until `at_least` have arrived (messages stored or requeued after the test's last reply)."""
    conn = await login(env, "ops")
    try:
        q = await (await conn.channel()).get_queue(queue)
        out = []
        async with asyncio.timeout(T):
            while True:
                m = await q.get(fail=False, no_ack=True)
                if m is not None:
                    out.append(m.body)
                elif len(out) >= at_least:
                    return out
                else:
                    await asyncio.sleep(0.02)
    finally:
        await conn.close()


async def refusal_of(env: Env, mechanism: str, response: bytes) -> ConnectionClose:
    """The connection.close answering a start-ok (then the server closes the socket)."""
    raw = await Raw.open(env)
    raw.send(PROTOCOL_HEADER)
    await raw.recv()
    raw.method(0, ConnectionStartOk({}, mechanism, response))
    events = await raw.recv_until_eof()
    assert len(events) == 1, events
    return events[0].method


# ------------------------------------------------------------------ authentication


async def test_right_credentials_work_with_pika_and_aio_pika(env):
    conn = await login(env, "dev1")
    ch = await conn.channel()  # publisher confirms on by default
    await (await ch.get_exchange("amq.topic")).publish(aio_pika.Message(b"t1"), "dev1/temp")
    await conn.close()

    def with_pika():
        with blocking(env, "dev2") as c:
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("amq.topic", "dev2/temp", b"t2")

    await asyncio.to_thread(with_pika)
    assert await queue_bodies(env, "devices") == [b"t1", b"t2"]


async def test_wrong_password_unknown_user_and_no_credentials_get_the_same_403(env):
    m = env.processor.metrics
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await login(env, "dev1", "wrong")
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await login(env, "nobody", PW)

    def with_pika(user: str, password: str) -> str:
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as e:
            blocking(env, user, password)
        return str(e.value)

    texts = {await asyncio.to_thread(with_pika, u, p) for u, p in (("dev1", "wrong"), ("nobody", PW))}
    assert texts == {f"ConnectionClosedByBroker: (403) '{REFUSED_PLAIN}'"}
    closes = [
        await refusal_of(env, "PLAIN", b"\x00dev1\x00wrong"),
        await refusal_of(env, "PLAIN", b"\x00nobody\x00" + PW.encode()),
        await refusal_of(env, "PLAIN", b"no separators"),
    ]
    assert {(c.reply_code, c.reply_text) for c in closes} == {(403, REFUSED_PLAIN)}
    assert m.auth_failures[("amqp", "bad_password")] == 3
    assert m.auth_failures[("amqp", "unknown_user")] == 3
    assert m.auth_failures[("amqp", "missing_credentials")] == 1
    conn = await login(env, "dev1")  # the listener is fine, and so are the right credentials
    await conn.close()


async def test_amqplain_over_a_real_socket(env):
    # neither pika nor aio-pika sends AMQPLAIN: our codec does, as RabbitMQ's Java client would
    table = encode_table({"LOGIN": "dev1", "PASSWORD": PW})[4:]
    raw = await Raw.connect(env, mechanism="AMQPLAIN", response=table)
    raw.method(1, ChannelOpen())
    assert isinstance((await raw.recv()).method, ChannelOpenOk)
    await raw.close()
    close = await refusal_of(env, "AMQPLAIN", encode_table({"LOGIN": "dev1", "PASSWORD": "x"})[4:])
    assert (close.reply_code, close.reply_text) == (
        403,
        "ACCESS_REFUSED - Login was refused using authentication mechanism AMQPLAIN. For details see "
        "the broker logfile.",
    )
    assert env.processor.metrics.auth_failures[("amqp", "bad_password")] == 1


async def test_frames_sent_during_the_password_check_wait_their_turn(env):
    """A client that does not wait for connection.tune (everything in one write) is served in order
    once argon2 (run in a thread) has verified the password: nothing is lost or reordered."""
    raw = await Raw.open(env)
    raw.send(PROTOCOL_HEADER)
    await raw.recv()
    raw.send(
        b"".join(
            (
                encode_method(0, ConnectionStartOk({}, "PLAIN", b"\x00dev1\x00" + PW.encode())),
                encode_method(0, ConnectionTuneOk(0, 131072, 0)),
                encode_method(0, ConnectionOpen("/")),
                encode_method(1, ChannelOpen()),
                encode_method(1, ConfirmSelect(False)),
                encode_publish(1, "amq.topic", "dev1/early", None, b"early"),
            )
        )
    )
    got = [type((await raw.recv()).method) for _ in range(4)]
    assert got == [ConnectionTune, ConnectionOpenOk, ChannelOpenOk, ConfirmSelectOk]
    ack = (await raw.recv()).method
    assert isinstance(ack, BasicAck) and ack.delivery_tag == 1
    await raw.close()
    assert await queue_bodies(env, "devices") == [b"early"]


async def test_vhost_access_is_per_user(env):
    with pytest.raises(aiormq.exceptions.AMQPError):  # (aiormq: InvalidFrameError, without the text)
        await login(env, "dev1", vhost="%2Fx")

    def with_pika() -> None:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
            blocking(env, "dev1", vhost="/x")
        assert "(530) \"NOT_ALLOWED - access to vhost '/x' refused for user 'dev1'\"" in str(e.value)

    await asyncio.to_thread(with_pika)
    raw = await Raw.open(env)
    raw.send(PROTOCOL_HEADER)
    await raw.recv()
    raw.method(0, ConnectionStartOk({}, "PLAIN", b"\x00dev1\x00" + PW.encode()))
    await raw.recv()
    raw.method(0, ConnectionTuneOk(0, 131072, 0))
    raw.method(0, ConnectionOpen("/x"))
    [close] = await raw.recv_until_eof()
    assert (close.method.reply_code, close.method.reply_text) == (
        530,
        "NOT_ALLOWED - access to vhost '/x' refused for user 'dev1'",
    )
    conn = await login(env, "roamer", vhost="%2Fx")  # allowed on /x
    await conn.close()
    assert env.processor.metrics.acl_denials[("amqp", "connect")] == 3


# ------------------------------------------------------------------ the ACL


async def test_device_publishes_its_own_telemetry_and_cannot_read_anyones(env):
    def scenario() -> None:
        with blocking(env, "dev1") as c:
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("amq.topic", "dev1/temp", b"mine")
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                ch.basic_publish("amq.topic", "dev2/temp", b"forged")
            assert e.value.reply_code == 403
            assert e.value.reply_text == (
                "ACCESS_REFUSED - access to topic 'devices/dev2/temp' in exchange 'amq.topic' in "
                "vhost '/' refused for user 'dev1'"
            )
            ch2 = c.channel()  # the connection is still usable
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                ch2.basic_consume("devices", lambda *a: None)
            assert (e.value.reply_code, e.value.reply_text) == (
                403,
                "ACCESS_REFUSED - access to queue 'devices' in vhost '/' refused for user 'dev1'",
            )
            ch3 = c.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                ch3.basic_get("devices")
            assert e.value.reply_code == 403
            ch4 = c.channel()
            ch4.confirm_delivery()
            ch4.basic_publish("amq.topic", "dev1/humidity", b"mine too")

    await asyncio.to_thread(scenario)
    m = env.processor.metrics
    assert m.acl_denials[("amqp", "publish")] == 1 and m.acl_denials[("amqp", "subscribe")] == 2
    # the analytics user reads all of it (no group rule needed: the queue's group is the adapter's)
    conn = await login(env, "analytics")
    q = await (await conn.channel()).get_queue("devices")
    got = []
    async with q.iterator() as it:
        async for msg in it:
            await msg.ack()
            got.append((msg.routing_key, msg.body))
            if len(got) == 2:
                break
    await conn.close()
    assert got == [("dev1/temp", b"mine"), ("dev1/humidity", b"mine too")]


async def test_aio_pika_refused_publish_and_consume_close_only_the_channel(env):
    conn = await login(env, "dev2")
    keep = await conn.channel()
    ch = await conn.channel()
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as e:
        await (await ch.get_exchange("amq.topic")).publish(aio_pika.Message(b"x"), "dev1/temp")
    assert "access to topic 'devices/dev1/temp'" in str(e.value)
    ch = await conn.channel()
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
        await (await ch.get_queue("devices", ensure=False)).consume(ignore)
    await (await keep.get_exchange("amq.topic")).publish(aio_pika.Message(b"ok"), "dev2/temp")
    assert not conn.is_closed
    await conn.close()
    assert await queue_bodies(env, "devices") == [b"ok"]


async def test_a_refused_publish_is_not_confirmed(env):
    raw = await Raw.connect(env, response=b"\x00dev1\x00" + PW.encode())
    raw.method(1, ChannelOpen())
    await raw.recv()
    raw.method(1, ConfirmSelect(False))
    await raw.recv()
    raw.send(
        b"".join(
            encode_publish(1, "amq.topic", rk, None, body)
            for rk, body in (("dev1/a", b"a"), ("dev2/b", b"b"), ("dev1/c", b"c"))
        )
    )
    close = (await raw.recv()).method
    assert isinstance(close, ChannelClose) and close.reply_code == 403
    raw.method(1, ChannelCloseOk())
    raw.method(2, ChannelOpen())
    assert isinstance((await raw.recv()).method, ChannelOpenOk)  # no basic.ack came before it
    await raw.close()
    assert await queue_bodies(env, "devices", 1) == [b"a"]  # the publish before the refused one only


async def test_a_deny_rule_wins_over_an_allow(env):
    conn = await login(env, "dev1")
    ch = await conn.channel()
    await (await ch.get_exchange("amq.direct")).publish(aio_pika.Message(b"p1"), "public")
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
        await (await ch.get_exchange("amq.direct")).publish(aio_pika.Message(b"s1"), "secret")
    await conn.close()
    conn = await login(env, "dev2")  # the deny is dev1's only
    direct = await (await conn.channel()).get_exchange("amq.direct")
    await direct.publish(aio_pika.Message(b"s2"), "secret")
    await conn.close()
    assert await queue_bodies(env, "orders") == [b"p1", b"s2"]


async def test_declare_delete_and_bind_need_admin(env):
    def scenario() -> list[str]:
        texts = []
        with blocking(env, "dev1") as c:
            for op in (
                lambda ch: ch.queue_declare("mine"),
                lambda ch: ch.queue_declare("devices", durable=True),  # even an existing one
                lambda ch: ch.exchange_declare("ex1", "topic"),
                lambda ch: ch.queue_bind("devices", "amq.fanout"),
                lambda ch: ch.queue_delete("orders"),
                lambda ch: ch.exchange_delete("ex-nothing"),
                lambda ch: ch.queue_purge("devices"),  # (RabbitMQ: read on the queue)
            ):
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                    op(c.channel())
                assert e.value.reply_code == 403
                texts.append(e.value.reply_text)
            c.channel().queue_declare("devices", passive=True)  # passive: no permission needed
        with blocking(env, "dev2") as c:  # a user with admin on its own `work-%u`
            ch = c.channel()
            ch.queue_declare("work-dev2")
            ch.queue_delete("work-dev2")
        with blocking(env, "ops") as c:
            ch = c.channel()
            ch.exchange_declare("ex1", "topic")
            ch.queue_declare("mine")
            ch.queue_bind("mine", "ex1", "#")
            ch.queue_delete("mine")
            ch.exchange_delete("ex1")
        return texts

    texts = await asyncio.to_thread(scenario)
    assert texts[0] == "ACCESS_REFUSED - access to queue 'mine' in vhost '/' refused for user 'dev1'"
    assert texts[2] == "ACCESS_REFUSED - access to exchange 'ex1' in vhost '/' refused for user 'dev1'"
    assert "queue 'devices'" in texts[3] and "queue 'orders'" in texts[4]
    assert texts[6] == "ACCESS_REFUSED - access to queue 'devices' in vhost '/' refused for user 'dev1'"
    m = env.processor.metrics
    assert m.acl_denials[("amqp", "admin")] == 6 and m.acl_denials[("amqp", "subscribe")] == 1


async def test_a_consumer_is_cancelled_when_its_rule_goes_away(env):
    d = env.core.security.directory
    rule = next(r for r in d.rules.values() if r.subject == "user:analytics")
    loop = asyncio.get_running_loop()

    def until(conn: pika.BlockingConnection, done) -> None:
        deadline = loop.time() + T
        while not done() and loop.time() < deadline:
            conn.process_data_events(time_limit=0.05)

    def scenario() -> tuple[list[bytes], list]:
        got: list[bytes] = []
        cancels: list = []
        with blocking(env, "analytics") as c, blocking(env, "dev1") as p:
            pub = p.channel()
            pub.confirm_delivery()
            ch = c.channel()
            ch.add_on_cancel_callback(cancels.append)
            ch.basic_consume(
                "devices", lambda ch, m, props, body: (got.append(body), ch.basic_ack(m.delivery_tag))
            )
            pub.basic_publish("amq.topic", "dev1/t", b"before")
            until(c, lambda: got)
            asyncio.run_coroutine_threadsafe(d.delete_rule(rule.id), loop).result(T)
            pub.basic_publish("amq.topic", "dev1/t", b"after")
            until(c, lambda: cancels)
            assert ch.is_open  # the consumer is cancelled, its channel stays open
        return got, cancels

    got, cancels = await asyncio.to_thread(scenario)
    assert got == [b"before"] and len(cancels) == 1
    assert await queue_bodies(env, "devices", 1) == [b"after"]  # requeued, not lost
