"""The two calls the 4.x remoting adapter added to the messaging processor: `get_message_at` (find a
message from its commit log offset alone) and `send_to_system_topic` (retry and dead-letter copies)."""

from __future__ import annotations

import pytest

from messaging_processor import ClientContext, ErrorKind, Message, MessageType, ProcessorError
from tests.support import Core

CTX = ClientContext("test", client_id="other-protocol")


@pytest.fixture
async def env(tmp_path):
    """The core the 4.x adapter's tests run on (tests/adapters/remoting/support.py), no adapter."""
    core = await Core.open(
        str(tmp_path / "data"), processor_kw={"auto_create_topics": True}, default_queues=2
    )
    yield core
    await core.close()


async def test_get_message_at(env):
    (r,) = await env.processor.send(CTX, [Message("t", b"x", "tag")], auto_create=True)
    m = await env.processor.get_message_at(r.commitlog_offset)
    assert (m.body, m.tag, m.commitlog_offset) == (b"x", "tag", r.commitlog_offset)
    for bad in (r.commitlog_offset + 1, 10**12, -1):
        with pytest.raises(ProcessorError) as e:
            await env.processor.get_message_at(bad)
        assert e.value.kind is ErrorKind.MESSAGE_NOT_FOUND


async def test_send_to_system_topic(env):
    p = env.processor
    r = await p.send_to_system_topic(CTX, Message("%RETRY%g", b"again", properties={"RETRY_TOPIC": "t"}))
    assert r.topic == "%RETRY%g" and (await p.get_topic("%RETRY%g")).queues >= 1
    assert (await p.get_message_at(r.commitlog_offset)).properties == {"RETRY_TOPIC": "t"}
    d = await p.send_to_system_topic(CTX, Message("%DLQ%g", b"dead"))
    assert d.topic == "%DLQ%g" and p.metrics.dlq[("test", "%DLQ%g")] == 1
    later = Message("%RETRY%g", b"later", deliver_at=2**42, msg_type=MessageType.DELAY)
    await p.send_to_system_topic(CTX, later)
    assert env.store.max_offset("%RETRY%g", r.queue_id) == r.queue_offset + 1  # not yet delivered
    for topic, kind in (("plain", ErrorKind.ILLEGAL_TOPIC), ("%RETRY%bad topic", ErrorKind.ILLEGAL_TOPIC)):
        with pytest.raises(ProcessorError) as e:
            await p.send_to_system_topic(CTX, Message(topic, b"x"))
        assert e.value.kind is kind
    with pytest.raises(ProcessorError) as e:
        await p.send_to_system_topic(CTX, Message("%DLQ%g", b"x" * (p.limits.max_body_size + 1)))
    assert e.value.kind is ErrorKind.BODY_TOO_LARGE
    with pytest.raises(ProcessorError) as e:
        await p.send(CTX, [Message("%RETRY%g", b"x")])  # producers still cannot
    assert e.value.kind is ErrorKind.ILLEGAL_TOPIC
