"""Retained messages kept in the compacted topic `%MQTT_RETAINED%` (adapters/mqtt/retained.py): they
survive a gateway restart, the ones an earlier version left in the key-value table are moved into the
topic at start (again if a move was interrupted), compaction leaves one record per path, and the
retained caps count what earlier runs kept."""

from __future__ import annotations

import json
import uuid

import aiomqtt
import pytest

from adapters.mqtt.caps import MqttCaps
from adapters.mqtt.codec import encode_publish
from adapters.mqtt.codec.packets import Puback
from adapters.mqtt.retained import RETAINED_NS, RETAINED_TOPIC
from messaging_processor import ErrorKind, Message, ProcessorError
from tests.adapters.mqtt.support import CTX, STORE, V5, Env, Raw, close_env, next_message, serve
from tests.support import Core

SEGMENT = 1 << 20  # small commit log segments: a few filler messages close one


@pytest.fixture
async def renv(tmp_path):
    """An MQTT env on small segments that a test may restart: the fixture closes `holder[0]`."""
    holder = [await serve(await Core.open(str(tmp_path / "data"), segment_size=SEGMENT, **STORE))]
    yield holder
    await close_env(holder[0])


async def restart(env: Env, **adapter_kw) -> Env:
    return await serve(await env.core.restart(), env.port, **adapter_kw)


async def retained_of(env: Env, filt: str) -> dict[str, aiomqtt.Message]:
    """What a new subscription to `filt` gets as retained, by path: everything that arrives before a
    live marker published after the SUBACK (retained messages go out right after it)."""
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    got: dict[str, aiomqtt.Message] = {}
    async with env.client(V5) as sub:
        await sub.subscribe(filt, qos=1)
        await sub.subscribe(marker, qos=1)
        await sub.publish(marker, b"end", qos=1)
        while True:
            m = await next_message(sub)
            if str(m.topic) == marker:
                return got
            assert m.retain, f"a live message on {m.topic} before the marker"
            assert str(m.topic) not in got, f"{m.topic} retained twice"
            got[str(m.topic)] = m


async def publish_retained(env: Env, items: list[tuple[str, bytes]]) -> None:
    async with env.client(V5) as pub:
        for path, payload in items:
            await pub.publish(path, payload, qos=1, retain=True)


def payloads(got: dict[str, aiomqtt.Message]) -> dict[str, bytes]:
    return {path: m.payload for path, m in got.items()}


async def records(env: Env) -> list[Message]:
    """Every record the retained topic's queues hold now (compacted ranges included)."""
    p = env.processor
    out: list[Message] = []
    for q in range((await p.get_topic(RETAINED_TOPIC)).queues):
        low, high = await p.queue_offsets(RETAINED_TOPIC, q)
        out += await p.read(CTX, RETAINED_TOPIC, q, low, high, max_messages=10_000)
    return out


async def test_retained_messages_survive_a_restart(renv):
    env = renv[0]
    await publish_retained(
        env, [("site/a", b"one"), ("site/b", b"two"), ("site/c", b"three"), ("site/c", b"")]
    )
    assert payloads(await retained_of(env, "site/#")) == {"site/a": b"one", "site/b": b"two"}
    env = renv[0] = await restart(env)
    assert payloads(await retained_of(env, "site/#")) == {"site/a": b"one", "site/b": b"two"}
    assert payloads(await retained_of(env, "site/b")) == {"site/b": b"two"}
    assert await retained_of(env, "site/c") == {}
    info = await env.processor.get_topic(RETAINED_TOPIC)
    assert info.compacted
    assert RETAINED_TOPIC not in [t.name for t in await env.processor.list_topics()]  # a system topic


def kv_value(path: str, payload: bytes, **props: str) -> bytes:
    """A retained message as earlier versions kept it in the key-value table."""
    properties = {"mqtt.topic": path, "mqtt.qos": "1", "mqtt.retain": "1", **props}
    return json.dumps(properties, separators=(",", ":")).encode() + b"\n" + payload


async def test_key_value_retained_messages_are_moved_into_the_topic_at_start(renv):
    env = renv[0]
    p = env.processor
    await publish_retained(env, [("old/kept", b"from-topic")])
    await p.kv_put(RETAINED_NS, "old/a", kv_value("old/a", b"alpha", **{"mqtt.content_type": "text/plain"}))
    await p.kv_put(RETAINED_NS, "old/b", kv_value("old/b", b"beta"))
    env = renv[0] = await restart(env)
    p = env.processor
    assert await p.kv_scan(RETAINED_NS) == []
    got = await retained_of(env, "old/#")
    assert payloads(got) == {"old/a": b"alpha", "old/b": b"beta", "old/kept": b"from-topic"}
    assert got["old/a"].properties.ContentType == "text/plain"
    assert (await p.latest(RETAINED_TOPIC, "old/b")).body == b"beta"
    # a move interrupted before the delete: the entry is still in the table; the next start re-does it
    await p.kv_put(RETAINED_NS, "old/b", kv_value("old/b", b"beta"))
    env = renv[0] = await restart(env)
    assert await env.processor.kv_scan(RETAINED_NS) == []
    assert payloads(await retained_of(env, "old/#")) == {
        "old/a": b"alpha",
        "old/b": b"beta",
        "old/kept": b"from-topic",
    }


async def test_compaction_keeps_one_record_per_path(renv):
    env = renv[0]
    p = env.processor
    await publish_retained(env, [(f"meter/{k}", b"v%d" % v) for v in range(25) for k in range(3)])
    await publish_retained(env, [("meter/gone", b"x"), ("meter/gone", b"")])
    assert len(await records(env)) == 77
    for _ in range(4):  # close the segment holding them (compaction covers closed segments only)
        await p.send(CTX, [Message(topic="filler", body=b"f" * 300_000)], auto_create=True)
    stats = await p.compact()
    assert stats.records_kept <= stats.records_in - 73
    kept = await records(env)
    by_path = {m.properties["mqtt.topic"]: m.body for m in kept}
    assert len(kept) == len(by_path) == 4  # one per path; the cleared one's tombstone is kept a while
    assert by_path == {"meter/0": b"v24", "meter/1": b"v24", "meter/2": b"v24", "meter/gone": b""}
    expected = {"meter/0": b"v24", "meter/1": b"v24", "meter/2": b"v24"}
    assert payloads(await retained_of(env, "meter/+")) == expected
    env = renv[0] = await restart(env)
    assert payloads(await retained_of(env, "meter/+")) == expected


async def test_retained_caps_count_what_earlier_runs_kept(renv):
    env = renv[0]
    await publish_retained(env, [("cap/a", b"1"), ("cap/b", b"2"), ("cap/b", b"")])
    env = renv[0] = await restart(env, caps=MqttCaps(max_retained_messages=2))
    raw, _ack = await Raw.connect(env, "cap-publisher", 5)
    codes = []
    for pid, (path, payload) in enumerate([("cap/c", b"3"), ("cap/d", b"4"), ("cap/a", b"1b")], 1):
        raw.send(encode_publish(path, payload, 1, pid, retain=True, version=5))
        ack = await raw.recv()
        assert isinstance(ack, Puback) and ack.packet_id == pid
        codes.append(ack.reason_code)
    await raw.close()
    # the second one admitted, a third one over the cap (quota exceeded), a replacement admitted
    assert codes == [0, 0x97, 0]
    assert payloads(await retained_of(env, "cap/#")) == {"cap/a": b"1b", "cap/c": b"3"}


async def test_only_the_gateway_writes_the_retained_topic(env):
    p = env.processor
    with pytest.raises(ProcessorError) as e:  # producers may not send to a `%` topic
        await p.send(CTX, [Message(RETAINED_TOPIC, b"forged", properties={"mqtt.topic": "x/y"})])
    assert e.value.kind is ErrorKind.ILLEGAL_TOPIC
    with pytest.raises(ProcessorError) as e:  # internal sends go to `%` topics only
        await p.send_internal("devices", [Message("devices", b"x")])
    assert e.value.kind is ErrorKind.ILLEGAL_TOPIC
    assert await retained_of(env, "x/#") == {}
