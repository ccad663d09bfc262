"""MQTT with authentication and the ACL on (issue 23, docs/security.md), over real sockets with
paho-mqtt and aiomqtt (3.1.1 and 5.0) and the raw codec client for exact wire codes.

Policy of every test (fixture `aenv`): devices `alice` and `bob` (role user) may publish to their
own `devices/%u/#` and subscribe to their own `commands/%u/#`; `analytics` may subscribe to
`devices/#`; `auditor` too, but a deny on `devices/secret/#` wins; `root` is an admin.

CONNECT refusals: bad credentials (wrong password or unknown user alike) get Bad User Name or
Password (3.1.1: 4, 5.0: 0x86); no credentials, or a will the user may not publish, Not authorized
(3.1.1: 5, 5.0: 0x87), as Mosquitto answers a client it lets in for nobody."""

from __future__ import annotations

import asyncio
import threading
import uuid
import zlib

import aiomqtt
import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.mqtt.codec import (
    Connack,
    Subscribe,
    Subscription,
    Will,
    encode_publish,
    encode_pubrel,
    encode_subscribe,
)
from adapters.mqtt.codec.packets import Pingresp, Puback, Pubcomp, Pubrec, Suback
from adapters.mqtt.retained import RETAINED_TOPIC
from tests.adapters.mqtt.support import (
    CTX,
    STORE,
    V3,
    V5,
    VERSIONS,
    Env,
    Raw,
    T,
    close_env,
    next_message,
    serve,
)
from tests.support import Core

PASSWORDS = {
    "alice": "alice-pw",
    "bob": "bob-pw",
    "analytics": "an-pw",
    "auditor": "au-pw",
    "root": "root-pw",
}
PINGREQ = b"\xc0\x00"


@pytest.fixture
async def aenv(tmp_path):
    core = await Core.open(str(tmp_path / "data"), auth=True, **STORE)
    env = await serve(core)
    sec = core.security
    for name, pw in PASSWORDS.items():
        await sec.add_user(name, password=pw, role="admin" if name == "root" else "user")
    d = sec.directory
    await d.add_rule("role:user", "topic", "devices/%u/#", ("publish",), False)
    await d.add_rule("role:user", "topic", "commands/%u/#", ("subscribe",), False)
    await d.add_rule("user:analytics", "topic", "devices/#", ("subscribe",), False)
    await d.add_rule("user:auditor", "topic", "devices/#", ("subscribe",), False)
    await d.add_rule("user:auditor", "topic", "devices/secret/#", ("subscribe",), True)
    yield env
    await close_env(env)


def as_user(env: Env, user: str, version=V5, **kw) -> aiomqtt.Client:
    return env.client(version, username=user, password=PASSWORDS[user], **kw)


def code(rc) -> int:
    """A reason code as paho/aiomqtt give it (ReasonCode object or int) as an int."""
    return rc if isinstance(rc, int) else rc.value


async def raw_connect(
    env: Env, version: int, user: str | None, password: str | None, **kw
) -> tuple[Raw, int]:
    raw, ack = await Raw.connect(
        env,
        "raw-" + uuid.uuid4().hex[:8],
        version=version,
        username=user,
        password=password.encode() if password is not None else None,
        **kw,
    )
    assert isinstance(ack, Connack)
    return raw, ack.reason_code


def same_queue_path(path: str, queues: int, prefix: str) -> str:
    """A path under `prefix` that the gateway stores in the same queue as `path` (one queue keeps
    publish order, so receiving it means `path`'s message was handled before)."""
    want = zlib.crc32(path.encode()) % queues
    for i in range(10_000):
        p = f"{prefix}/{i}"
        if zlib.crc32(p.encode()) % queues == want:
            return p
    raise AssertionError("no path found")


async def until(client: aiomqtt.Client, payload: bytes) -> list[tuple[str, bytes, bool]]:
    """(topic, payload, retain) of the messages received up to the one with `payload`."""
    out: list[tuple[str, bytes, bool]] = []

    async def run() -> None:
        async for m in client.messages:
            out.append((str(m.topic), m.payload, m.retain))
            if m.payload == payload:
                return

    await asyncio.wait_for(run(), T)
    return out


async def settled(env: Env, group: str, topic: str) -> None:
    """Wait until `group` has nothing of `topic` left to handle (no event tells it)."""

    async def poll() -> None:
        while await env.processor.backlog(group, topic) != (0, 0):
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), T)


async def queue_count(env: Env, topic: str) -> int:
    return len((await env.processor.query_route(CTX, topic, auto_create=True)).queues)


async def stored(env: Env, topic: str) -> int:
    return (await env.processor.get_topic(topic)).messages


# ------------------------------------------------------------------ CONNECT


@pytest.mark.parametrize("version", VERSIONS)
async def test_right_credentials_work(aenv, version):
    async with as_user(aenv, "analytics", version) as sub, as_user(aenv, "bob", version) as bob:
        await sub.subscribe("devices/#", qos=1)
        await bob.publish("devices/bob/telemetry", b"21.5", qos=1)
        m = await next_message(sub)
        assert (str(m.topic), m.payload) == ("devices/bob/telemetry", b"21.5")
    assert aenv.processor.metrics.auth_failures == {}


@pytest.mark.parametrize(("level", "bad", "anonymous"), [(4, 4, 5), (5, 0x86, 0x87)])
async def test_refused_logins_get_one_code_whatever_was_wrong(aenv, level, bad, anonymous):
    failures = aenv.processor.metrics.auth_failures
    got = []
    for user, pw in (("alice", "wrong"), ("nobody", "alice-pw"), ("alice", "")):
        raw, rc = await raw_connect(aenv, level, user, pw)
        got.append(rc)
        assert await raw.recv_until_eof() == []  # closed after the CONNACK
    assert got == [bad, bad, bad]  # nothing tells the wrong password from the unknown user
    raw, rc = await raw_connect(aenv, level, None, None)
    assert rc == anonymous
    assert await raw.recv_until_eof() == []
    assert failures[("mqtt", "bad_password")] == 2
    assert failures[("mqtt", "unknown_user")] == 1
    assert failures[("mqtt", "missing_credentials")] == 1
    # the server and other connections are fine
    async with as_user(aenv, "alice", V5 if level == 5 else V3) as ok:
        await ok.publish("devices/alice/x", b"1", qos=1)


@pytest.mark.parametrize("version", VERSIONS)
async def test_aiomqtt_sees_bad_user_name_or_password(aenv, version):
    for user, pw in (("bob", "not-bob-pw"), ("ghost", "bob-pw")):
        with pytest.raises(aiomqtt.MqttCodeError) as e:
            async with aenv.client(version, username=user, password=pw):
                pass
        assert code(e.value.rc) == 0x86  # paho maps the 3.1.1 code 4 to the same reason


@pytest.mark.parametrize("protocol", [paho.MQTTv311, paho.MQTTv5])
async def test_paho_refused_and_accepted(aenv, protocol):
    def connect(user: str, pw: str) -> int:
        done = threading.Event()
        out: list = []
        c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"p-{user}", protocol=protocol)
        c.username_pw_set(user, pw)

        def on_connect(client, userdata, flags, rc, props):
            out.append(code(rc))
            done.set()

        c.on_connect = on_connect
        c.connect("127.0.0.1", aenv.port)
        c.loop_start()
        try:
            assert done.wait(T)
        finally:
            c.disconnect()
            c.loop_stop()
        return out[0]

    assert await asyncio.to_thread(connect, "alice", "wrong") == 0x86
    assert await asyncio.to_thread(connect, "nobody", "x") == 0x86
    assert await asyncio.to_thread(connect, "alice", "alice-pw") == 0


@pytest.mark.parametrize(("level", "refused"), [(4, 5), (5, 0x87)])
async def test_will_topic_checked_at_connect(aenv, level, refused):
    raw, rc = await raw_connect(aenv, level, "alice", "alice-pw", will=Will("devices/bob/status", b"gone"))
    assert rc == refused
    assert await raw.recv_until_eof() == []
    raw, rc = await raw_connect(
        aenv, level, "alice", "alice-pw", will=Will("devices/alice/status", b"gone", 1)
    )
    assert rc == 0
    async with as_user(aenv, "analytics") as sub:
        await sub.subscribe("devices/alice/status", qos=1)
        raw.abort()  # abnormal close: the (allowed) will is published
        m = await next_message(sub)
        assert m.payload == b"gone"
    assert aenv.processor.metrics.acl_denials[("mqtt", "publish")] >= 1


async def test_aiomqtt_will_refused(aenv):
    with pytest.raises(aiomqtt.MqttCodeError) as e:
        async with as_user(aenv, "alice", V5, will=aiomqtt.Will("devices/root/x", b"w")):
            pass
    assert code(e.value.rc) == 0x87


# ------------------------------------------------------------------ SUBSCRIBE


@pytest.mark.parametrize(("version", "failure"), [(V3, 0x80), (V5, 0x87)])
async def test_device_publishes_own_telemetry_but_cannot_read_others(aenv, version, failure):
    denials = aenv.processor.metrics.acl_denials
    before = denials[("mqtt", "subscribe")]
    async with (
        as_user(aenv, "alice", version) as alice,
        as_user(aenv, "analytics", version) as analytics,
        as_user(aenv, "bob", version) as bob,
    ):
        granted = await alice.subscribe(
            [
                ("devices/bob/#", 1),
                ("commands/alice/#", 1),
                ("devices/alice/#", 1),
                ("$share/g/devices/bob/#", 1),
            ]
        )
        assert [code(g) for g in granted] == [failure, 1, failure, failure]  # only its commands
        assert denials[("mqtt", "subscribe")] >= before + 3
        await analytics.subscribe("devices/#", qos=1)
        await bob.publish("devices/bob/telemetry", b"bob 1", qos=1)
        await alice.publish("devices/alice/telemetry", b"alice 1", qos=1)
        got = {
            (str(m.topic), m.payload) for m in [await next_message(analytics), await next_message(analytics)]
        }
        assert got == {("devices/bob/telemetry", b"bob 1"), ("devices/alice/telemetry", b"alice 1")}
        await bob.publish("commands/alice/reboot", b"")  # bob may not publish there: dropped
        await alice.publish("commands/alice/led", b"on", qos=1)  # nor alice (subscribe only)
        # alice's own commands arrive when someone allowed publishes them (an admin here)
        async with as_user(aenv, "root", version) as root:
            await root.publish("commands/alice/led", b"off", qos=1)
        m = await next_message(alice)
        assert (str(m.topic), m.payload) == ("commands/alice/led", b"off")


async def test_deny_rule_wins_over_allow(aenv):
    n = await queue_count(aenv, "devices")
    secret = "devices/secret/x"
    after = same_queue_path(secret, n, "devices/bob")
    async with (
        as_user(aenv, "auditor") as auditor,
        as_user(aenv, "analytics") as analytics,
        as_user(aenv, "root") as root,
    ):
        assert [code(g) for g in await auditor.subscribe("devices/#", qos=1)] == [1]  # granted
        assert [code(g) for g in await auditor.subscribe("devices/secret/#", qos=1)] == [0x87]
        await analytics.subscribe("devices/#", qos=1)
        await root.publish(secret, b"classified", qos=1)
        await root.publish(after, b"public", qos=1)
        m = await next_message(auditor)
        assert (str(m.topic), m.payload) == (after, b"public")  # the secret one, before it, was dropped
        # the secret message was stored and reaches a subscriber allowed to read it
        got = [
            (str(m.topic), m.payload) for m in [await next_message(analytics), await next_message(analytics)]
        ]
        assert got == [(secret, b"classified"), (after, b"public")]
        await root.publish("devices/secret/y", b"again", qos=1)
        await root.publish(after, b"public 2", qos=1)
        assert (await next_message(auditor)).payload == b"public 2"
    assert aenv.processor.metrics.acl_denials[("mqtt", "subscribe")] >= 2


@pytest.mark.parametrize("version", VERSIONS)
async def test_retained_on_forbidden_path_not_delivered(aenv, version):
    async with as_user(aenv, "root", version) as root:
        await root.publish("devices/secret/r", b"hidden", qos=1, retain=True)
        await root.publish("devices/bob/r", b"shown", qos=1, retain=True)
        async with as_user(aenv, "auditor", version) as auditor:
            await auditor.subscribe("devices/#", qos=1)
            # every retained value goes out right after the SUBACK, before any later message
            await root.publish("devices/bob/live", b"live", qos=1)
            got = await until(auditor, b"live")
            assert got == [("devices/bob/r", b"shown", True), ("devices/bob/live", b"live", False)]
        async with as_user(aenv, "alice", version) as alice:
            granted = await alice.subscribe([("devices/bob/#", 1), ("commands/alice/#", 1)])
            assert code(granted[0]) >= 0x80
            await root.publish("commands/alice/ping", b"ping", qos=1)
            assert await until(alice, b"ping") == [("commands/alice/ping", b"ping", False)]
    async with as_user(aenv, "analytics", version) as analytics:  # both are there for the allowed
        await analytics.subscribe("devices/#", qos=1)
        got = {(await next_message(analytics)).payload, (await next_message(analytics)).payload}
        assert got == {b"hidden", b"shown"}


async def test_shared_and_persistent_deliveries_enforce_the_subscriber(aenv):
    n = await queue_count(aenv, "devices")
    after = same_queue_path("devices/secret/s", n, "devices/bob")
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    async with as_user(
        aenv, "auditor", V5, identifier="aud-persist", clean_start=False, properties=props
    ) as a:
        await a.subscribe("devices/#", qos=1)
    async with as_user(aenv, "auditor", V3, identifier="aud-shared") as shared, as_user(aenv, "root") as root:
        assert [code(g) for g in await shared.subscribe("$share/audit/devices/#", qos=1)] == [1]
        await root.publish("devices/secret/s", b"classified", qos=1)
        await root.publish(after, b"public", qos=1)
        m = await next_message(shared)
        assert (str(m.topic), m.payload) == (after, b"public")
    # the persistent session got both while offline: only the allowed one is delivered on resume
    async with as_user(
        aenv, "auditor", V5, identifier="aud-persist", clean_start=False, properties=props
    ) as a:
        m = await next_message(a)
        assert (str(m.topic), m.payload) == (after, b"public")


async def test_resumed_session_is_decided_for_the_new_user(aenv):
    """A persistent session subscribed by analytics, resumed by bob (same client id): bob's rights
    apply to what it gets, not the ones the subscription was granted with."""
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    async with as_user(
        aenv, "analytics", V5, identifier="shared-id", clean_start=False, properties=props
    ) as a:
        await a.subscribe("devices/#", qos=1)
    async with as_user(aenv, "root") as root:
        await root.publish("devices/alice/t", b"alice data", qos=1)
    st = aenv.adapter.broker.states["shared-id"]
    async with as_user(aenv, "bob", V5, identifier="shared-id", clean_start=False, properties=props) as b:
        received: list[bytes] = []

        async def collect() -> None:
            async for m in b.messages:
                received.append(m.payload)

        task = asyncio.create_task(collect())
        await settled(aenv, st.group, st.queue)  # the session's loop handled the waiting message
        await b.publish("devices/bob/ok", b"own", qos=1)  # a round trip on the same connection
        task.cancel()
        assert received == []
    async with as_user(
        aenv, "analytics", V5, identifier="shared-id", clean_start=False, properties=props
    ) as a:
        async with as_user(aenv, "root") as root:
            await root.publish("devices/alice/t", b"alice data 2", qos=1)
        assert (await next_message(a)).payload == b"alice data 2"


# ------------------------------------------------------------------ PUBLISH


async def test_denied_publish_v5_gets_puback_0x87(aenv):
    raw, rc = await raw_connect(aenv, 5, "alice", "alice-pw")
    assert rc == 0
    raw.send(encode_publish("devices/bob/t", b"spoof", 1, 1, version=5))
    ack = await raw.recv()
    assert isinstance(ack, Puback) and (ack.packet_id, ack.reason_code) == (1, 0x87)
    raw.send(encode_publish("devices/bob/t", b"spoof", 2, 2, version=5))
    rec = await raw.recv()
    assert isinstance(rec, Pubrec) and (rec.packet_id, rec.reason_code) == (2, 0x87)
    raw.send(encode_publish("devices/bob/r", b"spoof", 1, 3, retain=True, version=5))
    ack = await raw.recv()
    assert isinstance(ack, Puback) and ack.reason_code == 0x87
    raw.send(encode_publish("devices/alice/t", b"mine", 1, 4, version=5))  # the connection stays up
    ack = await raw.recv()
    assert isinstance(ack, Puback) and (ack.packet_id, ack.reason_code) == (4, 0)
    assert await aenv.processor.latest(RETAINED_TOPIC, "devices/bob/r") is None
    assert await stored(aenv, "devices") == 1  # only alice's own message
    assert aenv.processor.metrics.acl_denials[("mqtt", "publish")] >= 3
    await raw.close()


async def test_paho_v5_publish_denied_reason(aenv):
    def run() -> list[int]:
        codes: list[int] = []
        done = threading.Event()
        connected = threading.Event()
        c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="paho-alice", protocol=paho.MQTTv5)
        c.username_pw_set("alice", "alice-pw")
        c.on_connect = lambda *a: connected.set()

        def on_publish(client, userdata, mid, rc, props):
            codes.append(code(rc))
            if len(codes) == 2:
                done.set()

        c.on_publish = on_publish
        c.connect("127.0.0.1", aenv.port)
        c.loop_start()
        try:
            assert connected.wait(T)
            c.publish("devices/bob/t", b"spoof", qos=1).wait_for_publish(T)
            c.publish("devices/alice/t", b"mine", qos=1).wait_for_publish(T)
            assert done.wait(T)
        finally:
            c.disconnect()
            c.loop_stop()
        return codes

    assert await asyncio.to_thread(run) == [0x87, 0]


async def test_denied_publish_v311_acked_and_dropped(aenv):
    async with as_user(aenv, "analytics", V3) as watcher:
        await watcher.subscribe("devices/#", qos=1)
        raw, rc = await raw_connect(aenv, 4, "alice", "alice-pw")
        assert rc == 0
        raw.send(encode_publish("devices/bob/t", b"spoof 1", 1, 1, version=4))
        ack = await raw.recv()
        assert isinstance(ack, Puback) and (ack.packet_id, ack.reason_code) == (1, 0)  # acked...
        raw.send(encode_publish("devices/bob/t", b"spoof 2", 2, 2, version=4))
        rec = await raw.recv()
        assert isinstance(rec, Pubrec) and rec.packet_id == 2
        raw.send(encode_pubrel(2, version=4))
        comp = await raw.recv()
        assert isinstance(comp, Pubcomp) and comp.packet_id == 2
        raw.send(encode_publish("devices/bob/r", b"spoof 3", 1, 3, retain=True, version=4))
        assert isinstance(await raw.recv(), Puback)
        raw.send(encode_publish("devices/bob/t", b"spoof 4", 0, version=4))
        raw.send(PINGREQ)
        assert isinstance(await raw.recv(), Pingresp)  # ...and the connection stays up
        raw.send(encode_publish("devices/alice/t", b"mine", 1, 5, version=4))
        assert isinstance(await raw.recv(), Puback)
        m = await next_message(watcher)  # ...but nothing was stored: the first one is alice's own
        assert (str(m.topic), m.payload) == ("devices/alice/t", b"mine")
        assert await stored(aenv, "devices") == 1
        assert await aenv.processor.latest(RETAINED_TOPIC, "devices/bob/r") is None
        await raw.close()
    assert aenv.processor.metrics.acl_denials[("mqtt", "publish")] >= 4


async def test_aiomqtt_v311_denied_publish_keeps_connection(aenv):
    async with as_user(aenv, "alice", V3) as alice, as_user(aenv, "analytics", V3) as watcher:
        await watcher.subscribe("devices/#", qos=1)
        await alice.publish("devices/bob/t", b"spoof", qos=1)  # acknowledged
        await alice.publish("devices/bob/t", b"spoof", qos=2)
        await alice.publish("devices/alice/t", b"ok", qos=1)
        m = await next_message(watcher)
        assert m.payload == b"ok"


async def test_raw_subscribe_codes(aenv):
    """Exact SUBACK bytes: 0x80 per refused filter in 3.1.1, 0x87 in 5.0, the others granted."""
    for level, failure in ((4, 0x80), (5, 0x87)):
        raw, rc = await raw_connect(aenv, level, "alice", "alice-pw")
        assert rc == 0
        subs = [
            Subscription("devices/bob/#", 1),
            Subscription("commands/alice/#", 2),
            Subscription("devices/+/telemetry", 0),
        ]
        raw.send(encode_subscribe(Subscribe(7, subs), level))
        ack = await raw.recv()
        assert isinstance(ack, Suback) and ack.reason_codes == [failure, 2, failure]
        await raw.close()


@pytest.mark.parametrize("version", VERSIONS)
async def test_wildcard_granted_but_each_path_checked(aenv, version):
    """`#` may match alice's commands, so it is granted; each delivered path is then checked."""
    n = await queue_count(aenv, "commands")
    after = same_queue_path("commands/bob/x", n, "commands/alice")
    async with as_user(aenv, "alice", version) as alice, as_user(aenv, "root") as root:
        assert [code(g) for g in await alice.subscribe("#", qos=1)] == [1]
        await root.publish("commands/bob/x", b"not for alice", qos=1)
        await root.publish(after, b"for alice", qos=1)
        m = await next_message(alice)
        assert (str(m.topic), m.payload) == (after, b"for alice")


async def test_auth_off_accepts_anyone(env):
    """Without security every CONNECT is accepted and nothing is checked (as before issue 23)."""
    raw, rc = await raw_connect(env, 5, "whoever", "whatever", will=Will("any/where", b"x"))
    assert rc == 0
    raw.send(encode_subscribe(Subscribe(1, [Subscription("#", 1)]), 5))
    ack = await raw.recv()
    assert isinstance(ack, Suback) and ack.reason_codes == [1]
    await raw.close()
    assert env.processor.security is None
