"""The Apache RocketMQ 4.x C++ client (PyPI `rocketmq` 0.4.4: ctypes over a bundled librocketmq.so)
driven by tests/adapters/remoting. Runs in its own virtualenv (.venv-remoting): its import name `rocketmq`
clashes with the official 5.x client in .venv. One mode per run, one JSON object per line on stdout.

    python cpp_client.py produce --namesrv H:P --topic T [--count N] [--tag TAG] [--prefix P]
    python cpp_client.py batch   --namesrv H:P --topic T [--count N] [--prefix P]
    python cpp_client.py consume --namesrv H:P --topic T --group G --expect N [--timeout S] [--retry-first]

Every mode takes --access-key AK --secret-key SK: the client's session credentials (it then signs
each request, ACL 1.0).

consume: with --retry-first the callback raises the first time it sees each body (the C++ client
then sends the message back, and the gateway must redeliver it through the retry topic); exits 0
once --expect distinct bodies were consumed (after a clean shutdown, which persists the offsets),
1 on timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _s(v: object) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v or "")


def _credentials(client, a: argparse.Namespace) -> None:  # noqa: ANN001 - a Producer or PushConsumer
    if a.access_key:
        client.set_session_credentials(a.access_key, a.secret_key, "ALIYUN")


def produce(a: argparse.Namespace) -> int:
    from rocketmq.client import Message, Producer

    p = Producer(a.group or "PG_CPP")
    p.set_namesrv_addr(a.namesrv)
    _credentials(p, a)
    p.start()
    try:
        for i in range(a.count):
            body = f"{a.prefix}-{i}"
            m = Message(a.topic)
            m.set_tags(a.tag)
            m.set_keys(f"key-{i}")
            m.set_property("origin", "cpp")
            m.set_body(body)
            r = p.send_sync(m)
            emit(
                {
                    "event": "sent",
                    "body": body,
                    "msgId": r.msg_id,
                    "status": int(r.status),
                    "offset": r.offset,
                }
            )
    finally:
        p.shutdown()
    return 0


def batch(a: argparse.Namespace) -> int:
    from rocketmq.client import Message, Producer

    p = Producer(a.group or "PG_CPP_BATCH")
    p.set_namesrv_addr(a.namesrv)
    _credentials(p, a)
    p.start()
    try:
        msgs, bodies = [], []
        for i in range(a.count):
            body = f"{a.prefix}-{i}"
            m = Message(a.topic)
            m.set_tags(a.tag)
            m.set_keys(f"key-{i}")
            m.set_property("origin", "cpp-batch")
            m.set_body(body)
            msgs.append(m)
            bodies.append(body)
        r = p.send_batch(msgs)
        emit(
            {
                "event": "batch_sent",
                "bodies": bodies,
                "msgId": r.msg_id,
                "status": int(r.status),
                "offset": r.offset,
            }
        )
    finally:
        p.shutdown()
    return 0


def consume(a: argparse.Namespace) -> int:
    from rocketmq.client import PushConsumer

    lock = threading.Lock()
    seen: set[str] = set()
    done: set[str] = set()
    finished = threading.Event()

    def on_message(msg) -> None:
        body = _s(msg.body)
        with lock:
            first = body not in seen
            seen.add(body)
        retry = a.retry_first and first
        emit(
            {
                "event": "received",
                "body": body,
                "msgId": msg.id,
                "topic": msg.topic,
                "tags": _s(msg.tags),
                "keys": _s(msg.keys),
                "reconsumeTimes": msg.reconsume_times,
                "queueId": msg.queue_id,
                "queueOffset": msg.queue_offset,
                "origin": _s(msg.get_property("origin")) or None,
                "retry": retry,
            }
        )
        if retry:
            raise RuntimeError("retry please")
        with lock:
            done.add(body)
            if len(done) >= a.expect:
                finished.set()

    c = PushConsumer(a.group)
    c.set_namesrv_addr(a.namesrv)
    _credentials(c, a)
    c.set_thread_count(1)
    c.set_message_batch_max_size(1)  # one message per callback: a retry concerns that message only
    c.subscribe(a.topic, on_message, a.tag if a.tag != "TagA" else "*")
    c.start()
    success = finished.wait(a.timeout)
    time.sleep(0.5)  # let the last consume result update the offset table before shutdown persists it
    c.shutdown()
    emit({"event": "done" if success else "timeout", "consumed": len(done)})
    return 0 if success else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("produce", "batch", "consume"))
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", default="")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--tag", default="TagA")
    ap.add_argument("--prefix", default="cpp")
    ap.add_argument("--expect", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--retry-first", action="store_true")
    ap.add_argument("--access-key", default="")
    ap.add_argument("--secret-key", default="")
    a = ap.parse_args()
    try:
        return {"produce": produce, "batch": batch, "consume": consume}[a.mode](a)
    except Exception as e:  # noqa: BLE001 - report, then fail
        emit({"event": "error", "message": f"{type(e).__name__}: {e}"})
        return 2


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # the C++ client's threads may otherwise keep the process alive
