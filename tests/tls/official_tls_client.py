"""The official RocketMQ 5 Python client with TLS on: sends one message, receives and acks it.
Run as a subprocess (its protobuf modules cannot share a process with ours); the root CA comes from
gRPC's GRPC_DEFAULT_SSL_ROOTS_FILE_PATH. Prints one JSON object.

    python official_tls_client.py ENDPOINT TOPIC GROUP"""

from __future__ import annotations

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer


def main(endpoint: str, topic: str, group: str) -> dict:
    cfg = ClientConfiguration(endpoint, Credentials())
    producer = Producer(cfg, (topic,), tls_enable=True)
    producer.startup()
    m = Message()
    m.topic = topic
    m.body = b"over tls"
    sent = producer.send(m).message_id
    producer.shutdown()
    consumer = SimpleConsumer(cfg, group, {topic: FilterExpression("*")}, await_duration=5, tls_enable=True)
    consumer.startup()
    got: list[dict] = []
    deadline = time.time() + 30
    while not got and time.time() < deadline:
        for r in consumer.receive(32, 15):
            got.append({"id": r.message_id, "body": r.body.decode()})
            consumer.ack(r)
    consumer.shutdown()
    return {"sent": sent, "got": got}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])), flush=True)
