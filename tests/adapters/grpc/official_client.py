"""Drives the gateway with the official RocketMQ Python client (rocketmq-python-client 5.x).

Run as a subprocess only: its generated protobuf modules cannot share a process with ours.

    python official_client.py simple|push|transaction|probe|send|receive ENDPOINT TOPIC GROUP [AK SK]

AK SK: the client's `Credentials` (it then signs every request). `probe` sends one message, then
receives with a simple consumer, and reports each step's result or refusal (the exception's type
and code) instead of failing. `send` only sends 3 messages (tag TagA, keys, property seq), `receive`
only receives (and acks) 3 with a SimpleConsumer of GROUP. Prints one JSON object on stdout."""

from __future__ import annotations

import json
import sys
import threading
import time

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

CREDENTIALS = Credentials()


def _message(topic: str, i: int) -> Message:
    m = Message()
    m.topic = topic
    m.body = f"hello-{i}".encode()
    m.tag = "TagA"
    m.keys = f"key-{i}"
    m.add_property("seq", str(i))
    return m


def _view(m) -> dict:  # noqa: ANN001
    return {
        "id": m.message_id,
        "body": m.body.decode(),
        "tag": m.tag,
        "keys": sorted(m.keys),
        "props": dict(m.properties),
        "attempt": m.delivery_attempt,
    }


def simple(endpoint: str, topic: str, group: str) -> dict:
    cfg = ClientConfiguration(endpoint, CREDENTIALS)
    producer = Producer(cfg, (topic,))
    producer.startup()
    sent = [producer.send(_message(topic, i)).message_id for i in range(3)]
    producer.shutdown()
    consumer = SimpleConsumer(cfg, group, {topic: FilterExpression("TagA")}, await_duration=5)
    consumer.startup()
    got, empty_after = [], None
    deadline = time.time() + 30
    while len(got) < 3 and time.time() < deadline:
        for m in consumer.receive(32, 15):
            got.append(_view(m))
            consumer.ack(m)
    empty_after = len(consumer.receive(32, 15))
    consumer.shutdown()
    return {"sent": sent, "got": got, "empty_after": empty_after}


def send(endpoint: str, topic: str, group: str) -> dict:
    producer = Producer(ClientConfiguration(endpoint, CREDENTIALS), (topic,))
    producer.startup()
    sent = [producer.send(_message(topic, i)).message_id for i in range(3)]
    producer.shutdown()
    return {"sent": sent}


def receive(endpoint: str, topic: str, group: str) -> dict:
    cfg = ClientConfiguration(endpoint, CREDENTIALS)
    consumer = SimpleConsumer(cfg, group, {topic: FilterExpression("*")}, await_duration=5)
    consumer.startup()
    got = []
    deadline = time.time() + 30
    while len(got) < 3 and time.time() < deadline:
        for m in consumer.receive(32, 15):
            got.append(_view(m))
            consumer.ack(m)
    consumer.shutdown()
    return {"got": got}


class _Checker(TransactionChecker):
    def check(self, message):  # noqa: ANN001, ANN201
        return TransactionResolution.COMMIT


def transaction(endpoint: str, topic: str, group: str) -> dict:
    cfg = ClientConfiguration(endpoint, CREDENTIALS)
    producer = Producer(cfg, (topic,), checker=_Checker())
    producer.startup()
    tx = producer.begin_transaction()
    receipt = producer.send(_message(topic, 0), tx)
    tx.commit()
    producer.shutdown()
    consumer = SimpleConsumer(cfg, group, {topic: FilterExpression("*")}, await_duration=5)
    consumer.startup()
    got = []
    deadline = time.time() + 30
    while not got and time.time() < deadline:
        for m in consumer.receive(32, 15):
            got.append(_view(m))
            consumer.ack(m)
    consumer.shutdown()
    return {"sent": [receipt.message_id], "got": got}


class _Listener(MessageListener):
    """Fails the first delivery of every message, then succeeds."""

    def __init__(self, want: int) -> None:
        self.seen: dict[str, list[int]] = {}
        self.done = threading.Event()
        self.want = want
        self.lock = threading.Lock()

    def consume(self, message):  # noqa: ANN001, ANN201
        with self.lock:
            self.seen.setdefault(message.message_id, []).append(message.delivery_attempt)
            if message.delivery_attempt < 2:
                return ConsumeResult.FAILURE
            if sum(1 for a in self.seen.values() if 2 in a) >= self.want:
                self.done.set()
            return ConsumeResult.SUCCESS


def push(endpoint: str, topic: str, group: str) -> dict:
    cfg = ClientConfiguration(endpoint, CREDENTIALS)
    producer = Producer(cfg, (topic,))
    producer.startup()
    sent = [producer.send(_message(topic, i)).message_id for i in range(2)]
    producer.shutdown()
    listener = _Listener(len(sent))
    consumer = PushConsumer(cfg, group, listener, {topic: FilterExpression("*")})
    consumer.startup()
    ok = listener.done.wait(40)
    consumer.shutdown()
    return {"sent": sent, "attempts": listener.seen, "done": ok}


def _refusal(e: Exception) -> dict:
    return {"error": type(e).__name__, "code": getattr(e, "code", None), "message": str(e)}


def probe(endpoint: str, topic: str, group: str) -> dict:
    """Send one message, then receive: each step's outcome, a refusal included."""
    cfg = ClientConfiguration(endpoint, CREDENTIALS, request_timeout=5)
    out: dict = {}
    producer = Producer(cfg, (topic,))
    try:
        producer.startup()
        out["send"] = {"id": producer.send(_message(topic, 0)).message_id}
    except Exception as e:  # noqa: BLE001 - reported
        out["send"] = _refusal(e)
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(cfg, group, {topic: FilterExpression("*")}, await_duration=2)
    try:
        consumer.startup()
        got: list[dict] = []
        deadline = time.time() + 15
        while not got and time.time() < deadline:
            for m in consumer.receive(32, 15):
                got.append(_view(m))
                consumer.ack(m)
        out["receive"] = {"got": got}
    except Exception as e:  # noqa: BLE001 - reported
        out["receive"] = _refusal(e)
    finally:
        consumer.shutdown()
    return out


if __name__ == "__main__":
    mode, endpoint, topic, group = sys.argv[1:5]
    if len(sys.argv) > 6:
        CREDENTIALS = Credentials(sys.argv[5], sys.argv[6])
    modes = {
        "simple": simple,
        "push": push,
        "transaction": transaction,
        "probe": probe,
        "send": send,
        "receive": receive,
    }
    result = modes[mode](endpoint, topic, group)
    print(json.dumps(result), flush=True)
