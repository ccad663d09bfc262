"""Receives messages with the official RocketMQ 5 Python client (gRPC SimpleConsumer), for the
cross-protocol remoting tests. Runs in a subprocess with the project's .venv (where the 5.x client
is installed): its generated protobuf modules cannot share a process with the gateway's.

    python grpc_receive.py ENDPOINT TOPIC GROUP COUNT

Prints one JSON object: {"got": [{"id", "body", "tag", "keys", "props"}, ...]}."""

from __future__ import annotations

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer


def main() -> None:
    endpoint, topic, group, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    consumer = SimpleConsumer(
        ClientConfiguration(endpoint, Credentials()), group, {topic: FilterExpression("*")}, await_duration=5
    )
    consumer.startup()
    got = []
    deadline = time.time() + 40
    try:
        while len(got) < count and time.time() < deadline:
            for m in consumer.receive(16, 15):
                got.append(
                    {
                        "id": m.message_id,
                        "body": m.body.decode(),
                        "tag": m.tag,
                        "keys": sorted(m.keys),
                        "props": dict(m.properties),
                    }
                )
                consumer.ack(m)
    finally:
        consumer.shutdown()
    print(json.dumps({"got": got}), flush=True)


if __name__ == "__main__":
    main()
