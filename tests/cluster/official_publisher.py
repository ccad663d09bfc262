"""Sends with the official RocketMQ Python client (rocketmq-python-client 5.x, its own retries and
3 s request timeout) until its stdin closes. Run as a subprocess only: its generated protobuf
modules cannot share a process with ours.

    python official_publisher.py ENDPOINT TOPIC PREFIX

Prints one line per send, flushed: `ok BODY` when acknowledged, `failed BODY ERROR` when the
client gave up (a failed body is never sent again: a new body per attempt), then `done`."""

from __future__ import annotations

import sys
import threading

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def main(endpoint: str, topic: str, prefix: str) -> None:
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    producer = Producer(ClientConfiguration(endpoint, Credentials()), (topic,))
    producer.startup()
    i = 0
    try:
        while not stop.is_set():
            body = f"{prefix}{i}"
            m = Message()
            m.topic = topic
            m.body = body.encode()
            try:
                producer.send(m)
                print("ok", body, flush=True)
            except Exception as e:  # noqa: BLE001 - reported, and the next body goes on
                print("failed", body, type(e).__name__, str(e).replace("\n", " ")[:200], flush=True)
                stop.wait(0.1)
            i += 1
            stop.wait(0.005)
    finally:
        producer.shutdown()
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
