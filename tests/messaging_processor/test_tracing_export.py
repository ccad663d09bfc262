"""What the TraceRecorder hands its exporters (the OTLP sink, gateway/otlp.py): every lifecycle event
of every message as a full row with the message's trace context, for messages sent without one
(context derived from the id, or made here for a non-hex id) as for those whose client sent one."""

from __future__ import annotations

import pytest

from messaging_processor import ClientContext, Message, MessagingProcessor
from messaging_processor.store_client import LocalStoreClient
from messaging_processor.tracing import (
    GATEWAY_TRACEPARENT,
    TRACEPARENT,
    derived_traceparent,
    recorder_for,
    traceparent_of,
    valid_traceparent,
)
from store import Store, StoreConfig

pytestmark = pytest.mark.timeout(60)

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PRODUCER = ClientContext("mqtt", client_id="dev-1")
CONSUMER = ClientContext("amqp", client_id="app-1")
PULLER = ClientContext("remoting", client_id="pull-1")


@pytest.fixture
async def exported(tmp_path):
    """A processor over a real store whose recorder has a sink; the rows it was handed."""
    store = await Store.open(StoreConfig(data_dir=str(tmp_path / "data"), segment_size=1 << 20))
    client = LocalStoreClient(store)
    tracer = recorder_for(client, 3_600_000)
    rows: list[list] = []
    tracer.sinks.append(rows.extend)
    processor = MessagingProcessor(client, auto_create_topics=True, tracer=tracer)
    await processor.start()
    yield processor, rows
    await processor.close()
    await store.close()


def events_of(rows: list[list], message_id: str) -> list[tuple[str, str | None]]:
    """(event, traceparent) of the rows naming `message_id`, in the order handed over."""
    return [(r[0], r[11]) for r in rows if r[10] == message_id]


async def test_every_event_of_a_message_sent_without_a_context_is_exported_with_it(exported) -> None:
    processor, rows = exported
    await processor.create_group("g", 5)
    [plain] = await processor.send(PRODUCER, [Message("work", b"a")])
    [odd] = await processor.send(PRODUCER, [Message("work", b"b", message_id="order-17")])
    [client] = await processor.send(PRODUCER, [Message("work", b"c", properties={TRACEPARENT: TP})])
    got = await processor.pop(CONSUMER, "g", "work", max_messages=3, invisible_time_ms=60_000)
    assert len(got) == 3
    for d in got:
        h = await processor.change_invisible_time(CONSUMER, d.receipt_handle, 30_000)
        await processor.ack(CONSUMER, h)
    [nacked] = await processor.send(PRODUCER, [Message("work", b"d")])
    [d] = await processor.pop(CONSUMER, "g", "work")
    await processor.nack(CONSUMER, d.receipt_handle)
    await processor.tracer.flush()
    tp = derived_traceparent(nacked.message_id)
    assert events_of(rows, nacked.message_id) == [
        ("received", tp), ("stored", tp), ("delivered", tp), ("nacked", tp),
    ]  # fmt: skip
    want = ["received", "stored", "delivered", "invisible_time_changed", "acked"]
    [stored_odd] = await processor.get_message_by_id(odd.message_id)
    made = stored_odd.properties[GATEWAY_TRACEPARENT]
    contexts = {plain.message_id: derived_traceparent(plain.message_id), odd.message_id: made}
    contexts[client.message_id] = TP
    for mid, tp in contexts.items():
        assert valid_traceparent(tp)
        got_events = events_of(rows, mid)
        assert [e for e, _ in got_events] == want, got_events
        assert {t for _, t in got_events} == {tp}  # one trace: the message's own context


async def test_dead_letter_redrive_and_pull_consumer_events_are_exported(exported) -> None:
    processor, rows = exported
    await processor.create_group("g-dlq", 3)
    [r] = await processor.send(PRODUCER, [Message("jobs", b"poison")])
    [d] = await processor.pop(CONSUMER, "g-dlq", "jobs")
    await processor.forward_to_dlq(CONSUMER, d.receipt_handle, "poison")
    [(_dead, new_id)] = await processor.redrive("g-dlq")
    await processor.tracer.flush()
    tp = derived_traceparent(r.message_id)
    assert events_of(rows, r.message_id) == [
        ("received", tp), ("stored", tp), ("delivered", tp), ("dead_lettered", tp), ("redriven", tp),
    ]  # fmt: skip
    [copy] = await processor.get_message_by_id(new_id)
    assert TRACEPARENT not in copy.properties and traceparent_of(copy) == tp
    assert events_of(rows, new_id) == [("received", tp), ("stored", tp)]  # the copy continues the trace

    # a pull consumer (reads by offset, commits its offset): delivered, then acked at the commit
    [p] = await processor.send(PRODUCER, [Message("pulled", b"x")])
    read = await processor.read(PULLER, "pulled", p.queue_id, 0, group="pg")
    assert [m.message_id for m in read] == [p.message_id]
    await processor.commit_offset(PULLER, "pg", "pulled", p.queue_id, p.queue_offset + 1)
    await processor.tracer.flush()
    tp = derived_traceparent(p.message_id)
    want = [("received", tp), ("stored", tp), ("delivered", tp), ("acked", tp)]
    assert events_of(rows, p.message_id) == want
    t = await processor.tracer.trace(p.message_id)  # the stored record says the same
    assert [e["event"] for e in t["events"]] == ["received", "stored", "delivered", "acked"]


async def test_an_ack_of_a_delivery_popped_before_a_restart_is_exported_with_its_context(tmp_path) -> None:
    store = await Store.open(StoreConfig(data_dir=str(tmp_path / "data"), segment_size=1 << 20))
    client = LocalStoreClient(store)
    try:
        before = MessagingProcessor(client, auto_create_topics=True, tracer=recorder_for(client, 3_600_000))
        await before.start()
        [r] = await before.send(PRODUCER, [Message("late", b"x")])
        [d] = await before.pop(CONSUMER, "g", "late")
        await before.close()
        # a new recorder (the gateway restarted) never saw that delivery: only the handle names it
        tracer = recorder_for(client, 3_600_000)
        rows: list[list] = []
        tracer.sinks.append(rows.extend)
        after = MessagingProcessor(client, auto_create_topics=True, tracer=tracer)
        await after.start()
        await after.ack(CONSUMER, d.receipt_handle)
        await tracer.flush()
        assert events_of(rows, r.message_id) == [("acked", derived_traceparent(r.message_id))]
        [row] = rows
        assert (row[12], row[6], row[7], row[13]) == ("late", r.queue_id, r.queue_offset, r.commitlog_offset)
        await after.close()
    finally:
        await store.close()
