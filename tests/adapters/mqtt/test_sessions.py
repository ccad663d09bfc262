"""Persistent MQTT sessions and the 5.0 features around them, over real sockets: offline messages
(also across a restart of the gateway core on the same data directory), session expiry, clean
start, QoS 2 packet-id state across reconnects and restarts, will delay, no local, subscription
identifiers, message expiry, server keep-alive, the client's maximum packet size."""

from __future__ import annotations

import asyncio
import uuid

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from adapters.mqtt.codec import (
    Connect,
    PropertyId,
    Publish,
    Subscribe,
    Subscription,
    Will,
    encode_connect,
    encode_disconnect,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
    encode_subscribe,
)
from adapters.mqtt.codec.packets import Pubcomp, Pubrec, Pubrel, Suback
from tests.adapters.mqtt.support import (
    V3,
    V5,
    Env,
    Raw,
    T,
    close_env,
    make_cert,
    next_message,
    open_env,
    restart,
)

SEI = PropertyId.SESSION_EXPIRY_INTERVAL


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def v5_session(expiry: int) -> Properties:
    p = Properties(PacketTypes.CONNECT)
    p.SessionExpiryInterval = expiry
    return p


@pytest.fixture
async def renv(tmp_path):
    """Like `env`, but the test may restart it: the fixture closes whatever `holder[0]` is."""
    holder = [await open_env(str(tmp_path / "data"))]
    yield holder
    await close_env(holder[0])


async def drain(client: aiomqtt.Client, n: int, timeout: float = T) -> list[aiomqtt.Message]:
    out = []
    for _ in range(n):
        out.append(await next_message(client, timeout))
    return out


async def no_message(client: aiomqtt.Client, within: float = 0.5) -> None:
    with pytest.raises(TimeoutError):
        await next_message(client, within)


async def publish_all(env: Env, topic: str, payloads: list[bytes], qos: int = 1, **kw) -> None:
    async with env.client(V5) as pub:
        for p in payloads:
            await pub.publish(topic, p, qos=qos, **kw)


# ------------------------------------------------------------------ offline messages


async def test_v311_persistent_session_gets_what_arrived_offline(env):
    cid = uid("dev")
    async with env.client(V3, identifier=cid, clean_session=False) as sub:
        await sub.subscribe("fleet/+/cmd", qos=1)
    await publish_all(env, "fleet/7/cmd", [b"a", b"b", b"c"])
    async with env.client(V3, identifier=cid, clean_session=False) as sub:
        got = await drain(sub, 3)
        assert [m.payload for m in got] == [b"a", b"b", b"c"]
        assert {str(m.topic) for m in got} == {"fleet/7/cmd"}
        # Still subscribed without subscribing again, and only once each.
        await publish_all(env, "fleet/8/cmd", [b"d"])
        assert (await next_message(sub)).payload == b"d"
        await no_message(sub)


async def test_session_present_flag(env):
    cid = uid("sp")
    raw, ack = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 60})
    assert ack.session_present is False
    await raw.close()
    raw, ack = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 60})
    assert ack.session_present is True
    raw.send(encode_disconnect(0, 5))
    await raw.close()
    raw, ack = await Raw.connect(env, cid, 5, clean_start=True)
    assert ack.session_present is False  # clean start discarded it
    await raw.close()


async def test_persistent_session_survives_gateway_restart(renv):
    env = renv[0]
    cid = uid("restart")
    async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(3600)) as sub:
        await sub.subscribe("plant/#", qos=2)
    await publish_all(env, "plant/a/t", [b"before-restart"], qos=2)
    env = renv[0] = await restart(env)
    await publish_all(env, "plant/b/t", [b"after-restart"], qos=1)
    async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(3600)) as sub:
        got = sorted(m.payload for m in await drain(sub, 2))
        assert got == [b"after-restart", b"before-restart"]
        await no_message(sub)


async def test_wildcard_persistent_session_covers_topics_created_while_offline(env):
    cid = uid("wild")
    async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(600)) as sub:
        await sub.subscribe("+/status", qos=1)
    topic = uid("newtopic")
    await publish_all(env, f"{topic}/status", [b"up"])
    async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(600)) as sub:
        m = await next_message(sub)
        assert (str(m.topic), m.payload) == (f"{topic}/status", b"up")


async def test_history_before_a_persistent_subscribe_is_not_replayed(env):
    await publish_all(env, "hist/x", [b"old"])
    cid = uid("hist")
    async with env.client(V3, identifier=cid, clean_session=False) as sub:
        await sub.subscribe("hist/#", qos=1)
        await publish_all(env, "hist/x", [b"new"])
        assert (await next_message(sub)).payload == b"new"
        await no_message(sub)


async def test_unacked_message_is_redelivered_on_reconnect(env):
    cid = uid("unacked")
    raw, _ = await Raw.connect(env, cid, 4, clean_start=False)
    raw.send(encode_subscribe(Subscribe(1, [Subscription("job/#", 1)]), 4))
    assert isinstance(await raw.recv(), Suback)
    await publish_all(env, "job/1", [b"work"])
    p = await raw.recv()
    assert isinstance(p, Publish) and p.payload == b"work"
    raw.abort()  # no PUBACK
    raw, ack = await Raw.connect(env, cid, 4, clean_start=False)
    assert ack.session_present
    p = await raw.recv()
    assert isinstance(p, Publish) and p.payload == b"work" and p.qos == 1
    raw.send(bytes((0x40, 2)) + p.packet_id.to_bytes(2, "big"))
    await raw.close()


async def test_session_expiry_discards_the_session(env):
    cid = uid("exp")
    async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(1)) as sub:
        await sub.subscribe("exp/t", qos=1)
    await publish_all(env, "exp/t", [b"lost"])
    st = env.adapter.broker.states[cid]
    await asyncio.wait_for(_until_gone(env, cid), 5)
    raw, ack = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 60})
    assert ack.session_present is False
    assert await env.processor.kv_get("mqtt.sessions", cid) is not None  # the new session
    assert st.discarded
    await raw.close()


async def _until_gone(env: Env, cid: str) -> None:
    while cid in env.adapter.broker.states:
        await asyncio.sleep(0.02)


async def test_disconnect_can_set_session_expiry_to_zero(env):
    cid = uid("zero")
    raw, _ = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 600})
    raw.send(encode_disconnect(0, 5, {SEI: 0}))
    await raw.recv_until_eof()
    await asyncio.wait_for(_until_gone(env, cid), 5)


async def test_extending_a_zero_expiry_at_disconnect_is_a_protocol_error(env):
    raw, _ = await Raw.connect(env, uid("pe"), 5, clean_start=True)
    raw.send(encode_disconnect(0, 5, {SEI: 60}))
    pkts = await raw.recv_until_eof()
    assert pkts and pkts[-1].reason_code == 0x82


# ------------------------------------------------------------------ QoS 2 packet-id state


@pytest.mark.parametrize("restart_between", [False, True], ids=["reconnect", "gateway-restart"])
async def test_inbound_qos2_exactly_once_across_reconnect(renv, restart_between):
    env = renv[0]
    async with env.client(V5) as sub:
        await sub.subscribe("eo/in", qos=2)
        cid = uid("pub")
        raw, _ = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 600})
        raw.send(encode_publish("eo/in", b"once", 2, 9, version=5))
        assert isinstance(await raw.recv(), Pubrec)
        raw.abort()  # the PUBREC might have been lost: the client will send the PUBLISH again
        assert (await next_message(sub)).payload == b"once"
    if restart_between:
        env = renv[0] = await restart(env)
    async with env.client(V5) as sub:
        await sub.subscribe("eo/in", qos=2)
        raw, ack = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 600})
        assert ack.session_present
        raw.send(encode_publish("eo/in", b"once", 2, 9, dup=True, version=5))
        rec = await raw.recv()
        assert isinstance(rec, Pubrec) and rec.packet_id == 9 and rec.reason_code == 0
        raw.send(encode_pubrel(9, 0, 5))
        comp = await raw.recv()
        assert isinstance(comp, Pubcomp) and comp.reason_code == 0
        await no_message(sub)  # the duplicate PUBLISH was not stored again
        # The packet id is free again: a new message with it is a new message.
        raw.send(encode_publish("eo/in", b"twice", 2, 9, version=5))
        assert isinstance(await raw.recv(), Pubrec)
        raw.send(encode_pubrel(9, 0, 5))
        assert isinstance(await raw.recv(), Pubcomp)
        assert (await next_message(sub)).payload == b"twice"
        await raw.close()
    assert await env.processor.kv_scan("mqtt.qos2") == []


@pytest.mark.parametrize("restart_between", [False, True], ids=["reconnect", "gateway-restart"])
async def test_outbound_qos2_pubrel_resent_after_reconnect(renv, restart_between):
    env = renv[0]
    cid = uid("sub2")
    raw, _ = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 600})
    raw.send(encode_subscribe(Subscribe(1, [Subscription("eo/out", 2)]), 5))
    assert isinstance(await raw.recv(), Suback)
    await publish_all(env, "eo/out", [b"exactly"], qos=2)
    p = await raw.recv()
    assert isinstance(p, Publish) and p.qos == 2 and p.payload == b"exactly"
    raw.send(encode_pubrec(p.packet_id, 0, 5))
    rel = await raw.recv()
    assert isinstance(rel, Pubrel) and rel.packet_id == p.packet_id
    # Wait until the PUBREC is recorded, then lose the connection before PUBCOMP.
    while not await env.processor.kv_scan("mqtt.qos2"):
        await asyncio.sleep(0.01)
    raw.abort()
    if restart_between:
        env = renv[0] = await restart(env)
    raw, ack = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 600})
    assert ack.session_present
    again = await raw.recv()
    assert isinstance(again, Pubrel) and again.packet_id == p.packet_id  # not the PUBLISH again
    raw.send(encode_pubcomp(p.packet_id, 0, 5))
    with pytest.raises(TimeoutError):
        await raw.recv(0.7)  # and the message is not delivered a second time
    await raw.close()


# ------------------------------------------------------------------ wills


async def test_will_delay_cancelled_by_reconnect_and_sent_when_it_ends(env):
    async with env.client(V5) as watcher:
        await watcher.subscribe("wills/#", qos=1)
        cid = uid("willy")
        will = Will("wills/" + cid, b"gone", 1, False, {PropertyId.WILL_DELAY_INTERVAL: 1})
        raw, _ = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 60}, will=will)
        raw.abort()
        raw, _ = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 60}, will=will)
        await no_message(watcher, 1.5)  # reconnected within the delay: no will
        raw.abort()
        m = await next_message(watcher, 5)  # this time the delay passes
        assert (str(m.topic), m.payload) == ("wills/" + cid, b"gone")


async def test_will_sent_when_session_expires_before_will_delay(env):
    async with env.client(V5) as watcher:
        await watcher.subscribe("wills2/#", qos=1)
        will = Will("wills2/x", b"expired", 1, False, {PropertyId.WILL_DELAY_INTERVAL: 3600})
        raw, _ = await Raw.connect(env, uid("w2"), 5, clean_start=False, properties={SEI: 1}, will=will)
        raw.abort()
        m = await next_message(watcher, 5)
        assert m.payload == b"expired"


# ------------------------------------------------------------------ 5.0 subscription options and limits


@pytest.mark.parametrize("persistent", [False, True], ids=["clean", "persistent"])
async def test_no_local(env, persistent):
    props = v5_session(60) if persistent else None
    kw = {"clean_start": not persistent, "properties": props} if persistent else {}
    async with env.client(V5, **kw) as me, env.client(V5) as other:
        await me.subscribe("chat/room", options=SubscribeOptions(qos=1, noLocal=True))
        await other.subscribe("chat/room", qos=1)
        await me.publish("chat/room", b"mine", qos=1)
        assert (await next_message(other)).payload == b"mine"
        await other.publish("chat/room", b"theirs", qos=1)
        assert (await next_message(me)).payload == b"theirs"
        await no_message(me)


@pytest.mark.parametrize("persistent", [False, True], ids=["clean", "persistent"])
async def test_subscription_identifiers(env, persistent):
    cid = uid("sid")
    raw, _ = await Raw.connect(
        env, cid, 5, clean_start=not persistent, properties={SEI: 60} if persistent else {}
    )
    raw.send(
        encode_subscribe(
            Subscribe(1, [Subscription("ids/#", 1)], {PropertyId.SUBSCRIPTION_IDENTIFIER: [7]}), 5
        )
    )
    assert isinstance(await raw.recv(), Suback)
    raw.send(
        encode_subscribe(
            Subscribe(2, [Subscription("ids/+/x", 0)], {PropertyId.SUBSCRIPTION_IDENTIFIER: [300]}), 5
        )
    )
    assert isinstance(await raw.recv(), Suback)
    await publish_all(env, "ids/a/x", [b"both"])
    p = await raw.recv()
    assert isinstance(p, Publish) and p.payload == b"both"
    assert sorted(p.properties[PropertyId.SUBSCRIPTION_IDENTIFIER]) == [7, 300]
    assert p.qos == 1
    await publish_all(env, "ids/b", [b"one"])
    p2 = await raw.recv()
    assert p2.properties[PropertyId.SUBSCRIPTION_IDENTIFIER] == [7]
    await raw.close()


async def test_message_expiry_drops_expired_offline_messages(env):
    cid = uid("mexp")
    async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(600)) as sub:
        await sub.subscribe("mexp/t", qos=1)
    short = Properties(PacketTypes.PUBLISH)
    short.MessageExpiryInterval = 1
    long = Properties(PacketTypes.PUBLISH)
    long.MessageExpiryInterval = 3600
    async with env.client(V5) as pub:
        await pub.publish("mexp/t", b"short-lived", qos=1, properties=short)
        await pub.publish("mexp/t", b"long-lived", qos=1, properties=long)
    await asyncio.sleep(1.2)  # the expiry interval itself is what is under test
    async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(600)) as sub:
        m = await next_message(sub)
        assert m.payload == b"long-lived"
        assert 3590 <= m.properties.MessageExpiryInterval <= 3600  # the remaining lifetime
        await no_message(sub)


async def test_server_keep_alive_and_limits_in_connack(tmp_path):
    env = await open_env(str(tmp_path / "d"), max_keep_alive=5, max_packet_size=4096)
    try:
        raw, ack = await Raw.connect(env, uid("ka"), 5, keep_alive=600)
        assert ack.properties[PropertyId.SERVER_KEEP_ALIVE] == 5
        assert ack.properties[PropertyId.MAXIMUM_PACKET_SIZE] == 4096
        assert ack.properties[PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE] == 1
        await raw.close()
    finally:
        await close_env(env)


async def test_client_maximum_packet_size_is_respected(env):
    raw, _ = await Raw.connect(env, uid("small"), 5, properties={PropertyId.MAXIMUM_PACKET_SIZE: 200})
    raw.send(encode_subscribe(Subscribe(1, [Subscription("size/t", 1)]), 5))
    assert isinstance(await raw.recv(), Suback)
    await publish_all(env, "size/t", [b"x" * 500, b"small"])
    p = await raw.recv()
    assert isinstance(p, Publish) and p.payload == b"small"  # the big one was skipped
    await raw.close()


async def test_authentication_method_is_refused(env):
    raw = await Raw.open(env, 5)
    raw.send(encode_connect(Connect(uid("auth"), 5, properties={PropertyId.AUTHENTICATION_METHOD: "SCRAM"})))
    ack = await raw.recv()
    assert ack.reason_code == 0x8C


async def test_persistent_shared_subscription_resumes(env):
    cid = uid("sh")
    async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(600)) as sub:
        await sub.subscribe("$share/workers/tasks/#", qos=1)
        await publish_all(env, "tasks/1", [b"t1"])
        assert (await next_message(sub)).payload == b"t1"
    await publish_all(env, "tasks/2", [b"t2"])  # no member online: it waits for the group
    async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(600)) as sub:
        assert (await next_message(sub)).payload == b"t2"


async def test_topic_alias_with_aiomqtt(env):
    async with env.client(V5) as sub, env.client(V5) as pub:
        await sub.subscribe("alias2/#", qos=1)
        first = Properties(PacketTypes.PUBLISH)
        first.TopicAlias = 3
        await pub.publish("alias2/very/long/topic/name", b"one", qos=1, properties=first)
        again = Properties(PacketTypes.PUBLISH)
        again.TopicAlias = 3
        await pub.publish("", b"two", qos=1, properties=again)  # the alias alone names the topic
        got = [(str(m.topic), m.payload) for m in await drain(sub, 2)]
        assert got == [("alias2/very/long/topic/name", b"one"), ("alias2/very/long/topic/name", b"two")]


async def test_tls_listener(tmp_path):
    import ssl

    cert, key = make_cert(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    env = await open_env(str(tmp_path / "d"), ssl=server_ctx, tls_port=0)
    try:
        tls_port = int(env.adapter.extra_listeners["mqtts"].rsplit(":", 1)[1])
        client_ctx = ssl.create_default_context(cafile=cert)
        tls = aiomqtt.Client("127.0.0.1", tls_port, tls_context=client_ctx)
        async with tls as sub, env.client(V5) as pub:
            await sub.subscribe("secure/#", qos=1)
            await pub.publish("secure/a", b"over-tls", qos=1)  # plain listener in, TLS listener out
            assert (await next_message(sub)).payload == b"over-tls"
        with pytest.raises(aiomqtt.MqttError):  # a client that does not trust the certificate
            async with aiomqtt.Client("127.0.0.1", tls_port, tls_context=ssl.create_default_context()):
                pass
    finally:
        await close_env(env)


async def test_a_session_moves_between_proxies_sharing_the_stores(tmp_path):
    """CLUSTER mode shape: two MQTT listeners (two proxies' brokers) over one processor and store,
    as CLUSTER mode runs them (no session queues: gateway/server.py). A persistent session left on
    proxy A resumes on proxy B with its subscriptions and the messages published meanwhile; proxy
    A's stale copy then neither expires the live session nor serves an out-of-date one when the
    client comes back to A. (One LOCAL process owns its sessions alone and reads no record.)"""
    from adapters.mqtt import MqttAdapter

    env = await open_env(str(tmp_path / "data"), session_queues=False)
    other = MqttAdapter(env.processor, "127.0.0.1", 0, topic_scan_interval=0.1, session_queues=False)
    await other.start()
    try:
        b = Env(env.core, other)
        cid = uid("moving")
        # A's expiry must outlast the move to B (a publish and a connect; seconds on a stalled machine)
        async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(3)) as sub:
            await sub.subscribe("fleet/#", qos=1)
        await publish_all(env, "fleet/1", [b"while-offline"])
        async with b.client(V5, identifier=cid, clean_start=False, properties=v5_session(60)) as sub:
            assert (await next_message(sub)).payload == b"while-offline"
            await sub.subscribe("depot/#", qos=1)
        stale = env.adapter.broker.states.get(cid)
        await asyncio.wait_for(_until_gone(env, cid), 10)  # A's 3 s expiry passes: A forgets its copy
        assert stale is not None and stale.discarded
        assert await env.processor.kv_get("mqtt.sessions", cid) is not None  # the live session stays
        await publish_all(env, "depot/9", [b"to-the-new-subscription"])
        raw, ack = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 60})
        assert ack.session_present
        p = await raw.recv()
        assert isinstance(p, Publish) and (p.topic, p.payload) == ("depot/9", b"to-the-new-subscription")
        raw.send(bytes((0x40, 2)) + p.packet_id.to_bytes(2, "big"))
        await raw.close()
    finally:
        await other.stop(1.0)
        await close_env(env)


# ------------------------------------------------------------------ delivery by offset


async def _persistent_raw(env, cid: str, filt: str, qos: int):
    """A raw persistent session subscribed to `filt`, its group and its queue (the store topic it
    reads: session_routing.py)."""
    raw, _ = await Raw.connect(env, cid, 4, clean_start=False)
    raw.send(encode_subscribe(Subscribe(1, [Subscription(filt, qos)]), 4))
    assert isinstance(await raw.recv(), Suback)
    st = env.adapter.broker.registry.states[cid]
    assert st.queue is not None and st.queue_made
    return raw, st.group, st.queue


def _committed(env, group: str, topic: str) -> int:
    """The group's committed offsets on `topic`, summed over its queues (never committed: 0)."""
    n = env.store.topic(topic, False).queues
    return sum(max(env.store.committed_offset(group, topic, q), 0) for q in range(n))


async def _until(cond, timeout: float = T) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.02)


async def test_a_qos1_persistent_session_reads_by_offset_and_commits_what_the_client_acked(env):
    """No pop state while a message waits for its PUBACK (nothing in flight in the store); the
    group's committed offset moves past a message once the client acked it."""
    cid = uid("byoff")
    raw, group, queue = await _persistent_raw(env, cid, "offs/#", 1)
    q0 = _committed(env, group, queue)
    await publish_all(env, "offs/a", [b"one"])
    p = await raw.recv()
    assert isinstance(p, Publish) and p.payload == b"one"
    assert env.store.inflight_count(group, queue) == 0  # a pop would hold it in flight
    assert _committed(env, group, queue) == q0  # not acked: not committed
    raw.send(bytes((0x40, 2)) + p.packet_id.to_bytes(2, "big"))
    await _until(lambda: _committed(env, group, queue) == q0 + 1)
    await raw.close()


async def test_a_qos2_subscription_keeps_pop_and_ack(env):
    cid = uid("q2pop")
    raw, group, queue = await _persistent_raw(env, cid, "popq/#", 2)
    await publish_all(env, "popq/a", [b"one"], qos=2)
    p = await raw.recv()
    assert isinstance(p, Publish) and p.qos == 2
    assert env.store.inflight_count(group, queue) == 1  # popped, acked at PUBREC
    raw.send(encode_pubrec(p.packet_id, 0, 4))
    await _until(lambda: env.store.inflight_count(group, queue) == 0)
    await raw.close()


async def test_offset_delivery_resumes_at_the_first_message_not_acked(env):
    """Acked out of order, then a clean disconnect: the next connection gets the messages the
    client did not ack, in order, and none acked before the first of them (the final commit stops
    there; an acked one after it may come again: at least once); acking them commits everything."""
    cid = uid("resume")
    raw, group, queue = await _persistent_raw(env, cid, "res/#", 1)
    await publish_all(env, "res/a", [b"0", b"1", b"2", b"3"])
    got = [await raw.recv() for _ in range(4)]
    assert [p.payload for p in got] == [b"0", b"1", b"2", b"3"]
    for p in (got[0], got[2]):  # 1 and 3 not acked
        raw.send(bytes((0x40, 2)) + p.packet_id.to_bytes(2, "big"))
    await _until(lambda: _committed(env, group, queue) == 1)
    raw.send(encode_disconnect(0, 4))
    await raw.close()
    await _until(lambda: cid not in env.adapter.broker.registry.sessions)
    raw, ack = await Raw.connect(env, cid, 4, clean_start=False)
    assert ack.session_present
    again = [await raw.recv()]
    while again[-1].payload != b"3":
        again.append(await raw.recv())
    assert [p.payload for p in again] in ([b"1", b"2", b"3"], [b"1", b"3"])
    for p in again:
        raw.send(bytes((0x40, 2)) + p.packet_id.to_bytes(2, "big"))
    await _until(lambda: _committed(env, group, queue) == 4)
    await raw.close()


async def test_adding_a_qos2_subscription_moves_the_session_to_pop_without_losing_messages(env):
    cid = uid("switch")
    raw, group, queue = await _persistent_raw(env, cid, "sw/a", 1)
    await publish_all(env, "sw/a", [b"before"])
    p = await raw.recv()
    raw.send(bytes((0x40, 2)) + p.packet_id.to_bytes(2, "big"))
    raw.send(encode_subscribe(Subscribe(2, [Subscription("sw/b", 2)]), 4))
    assert isinstance(await raw.recv(), Suback)
    await publish_all(env, "sw/a", [b"after"])
    p = await raw.recv()
    assert isinstance(p, Publish) and p.payload == b"after"
    assert env.store.inflight_count(group, queue) == 1  # popped now
    raw.send(bytes((0x40, 2)) + p.packet_id.to_bytes(2, "big"))
    await _until(lambda: env.store.inflight_count(group, queue) == 0)
    await raw.close()


async def test_one_local_process_resumes_a_session_without_reading_its_record(env, monkeypatch):
    """Issue 48 item 3: a LOCAL gateway owns its persistent sessions alone, so a reconnect reads no
    saved record (no store round trip per resume); the session is resumed all the same."""
    cid = uid("sole")
    async with env.client(V5, identifier=cid, clean_start=False, properties=v5_session(60)) as c:
        await c.subscribe("sole/#", qos=1)
    reads: list[str] = []
    kv_get = env.processor.kv_get

    async def counted(ns: str, key: str):
        reads.append(key)
        return await kv_get(ns, key)

    monkeypatch.setattr(env.processor, "kv_get", counted)
    await publish_all(env, "sole/1", [b"kept"])
    raw, ack = await Raw.connect(env, cid, 5, clean_start=False, properties={SEI: 60})
    assert ack.session_present
    p = await raw.recv()
    assert isinstance(p, Publish) and p.payload == b"kept"
    await raw.close()
    assert cid not in reads
