"""RocketMQ 5 gRPC conformance scenarios driven by the official Python client.

This file runs inside the separate virtualenv ``.venv-conformance`` (rocketmq-python-client from
``requirements.lock``), never inside the gateway's ``.venv``: the client's generated protos clash
with the gateway's in one process. It imports nothing from the project.

    .venv-conformance/bin/python conformance/clients/python/scenarios.py SCENARIO CONFIG_JSON

CONFIG_JSON: ``{"endpoint": "127.0.0.1:8081", "topics": {role: name}, "groups": {role: name},
"timeout": seconds, "params": {...}}``. The script prints exactly one JSON line on stdout,
``{"client": "python", "scenario": ..., "ok": bool, "reason": str, "details": {...}}``, and exits
0 when the scenario passed, 1 when it failed. The client's own log goes to ``$HOME/logs``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
import traceback

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
from rocketmq.v5.log import logger as client_logger

CLIENT = "python"
MIB = 1024 * 1024


class Fail(Exception):
    """The scenario's expectation was not met."""


def check(cond: bool, reason: str) -> None:
    if not cond:
        raise Fail(reason)


class LogCapture(logging.Handler):
    """Keeps the client's own log lines (its error texts carry the server's status codes)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Ctx:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.endpoint = cfg["endpoint"]
        self.topics = cfg.get("topics", {})
        self.groups = cfg.get("groups", {})
        self.params = cfg.get("params", {})
        self.started = time.monotonic()
        # Leave a margin so the script reports a reason before the runner kills it.
        self.deadline = self.started + max(5.0, float(cfg.get("timeout", 60)) - 5.0)
        self.clients: list = []
        self.details: dict = {}
        self.log = LogCapture()
        client_logger.addHandler(self.log)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def config(self) -> ClientConfiguration:
        return ClientConfiguration(
            self.endpoint, Credentials(), request_timeout=int(self.params.get("request_timeout", 3))
        )

    def producer(self, topics=(), checker=None) -> Producer:
        p = Producer(self.config(), tuple(topics), checker)
        p.startup()
        self.clients.append(p)
        return p

    def simple_consumer(self, group: str, topics, await_s: int = 5) -> SimpleConsumer:
        subs = {t: FilterExpression() for t in topics} if not isinstance(topics, dict) else topics
        c = SimpleConsumer(self.config(), group, subs, await_s)
        c.startup()
        self.clients.append(c)
        return c

    def shutdown(self) -> None:
        for c in reversed(self.clients):
            t = threading.Thread(target=_quiet_shutdown, args=(c,), daemon=True)
            t.start()
            t.join(5)


def _quiet_shutdown(client) -> None:
    with contextlib.suppress(Exception):
        client.shutdown()


def text_message(topic: str, body: str, *, tag=None, keys=None, props=None, group=None, deliver_at=None):
    m = Message()
    m.topic = topic
    m.body = body.encode()
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys
    for k, v in (props or {}).items():
        m.add_property(k, v)
    if group:
        m.message_group = group
    if deliver_at is not None:
        m.delivery_timestamp = deliver_at
    return m


def body_of(m) -> str:
    return m.body.decode(errors="replace")


def receive_until(
    ctx: Ctx,
    consumer: SimpleConsumer,
    done,
    *,
    max_num=16,
    invisible=20,
    ack=True,
    on_message=None,
    deadline=None,
) -> list:
    """Receive (and ack) until ``done(received)`` or the deadline; returns the received messages."""
    received: list = []
    end = min(deadline or ctx.deadline, ctx.deadline)
    while not done(received):
        if time.monotonic() > end:
            break
        for m in consumer.receive(max_num, invisible) or []:
            m.conformance_received_at = time.time()
            received.append(m)
            if on_message:
                on_message(m)
            if ack:
                consumer.ack(m)
    return received


def quiet_poll(ctx: Ctx, consumer: SimpleConsumer, await_s: int = 1, invisible=20) -> list:
    """One short receive that should come back empty; acks whatever it gets (and returns it)."""
    old = consumer.await_duration
    consumer.await_duration = await_s
    try:
        got = consumer.receive(16, invisible) or []
        for m in got:
            consumer.ack(m)
        return got
    finally:
        consumer.await_duration = old


# --------------------------------------------------------------------------- scenarios


def sc_normal(ctx: Ctx) -> None:
    """Normal messages: body, tag, keys, user properties survive; tag filter; ack; nothing redelivered."""
    topic = ctx.topics["main"]
    n = int(ctx.params.get("count", 10))
    consumer = ctx.simple_consumer(ctx.groups["all"], [topic])
    tag_consumer = ctx.simple_consumer(ctx.groups["taga"], {topic: FilterExpression("TagA")})
    p = ctx.producer([topic])
    sent = {}
    for i in range(n):
        tag = "TagA" if i % 2 == 0 else "TagB"
        r = p.send(text_message(topic, f"normal-{i}", tag=tag, keys=f"key-{i}", props={"seq": str(i)}))
        check(bool(r.message_id), f"send {i} returned no message id")
        sent[r.message_id] = (i, tag)
    got = receive_until(ctx, consumer, lambda r: len(r) >= n)
    ids = [m.message_id for m in got]
    check(len(got) == n, f"received {len(got)} of {n} messages")
    check(set(ids) == set(sent), f"received ids differ from sent ids: {sorted(set(ids) ^ set(sent))[:4]}")
    for m in got:
        i, tag = sent[m.message_id]
        check(body_of(m) == f"normal-{i}", f"body mismatch for {m.message_id}: {body_of(m)!r}")
        check(m.tag == tag, f"tag mismatch: {m.tag!r} != {tag!r}")
        check(f"key-{i}" in (m.keys or set()), f"keys mismatch: {m.keys!r}")
        check((m.properties or {}).get("seq") == str(i), f"property seq mismatch: {m.properties!r}")
        check(m.delivery_attempt == 1, f"first delivery has delivery_attempt {m.delivery_attempt}")
        check(m.topic == topic, f"topic mismatch {m.topic!r}")
        check(not m.corrupted, "message flagged corrupted (body digest mismatch)")
    tag_a = sorted(i for i, t in sent.values() if t == "TagA")
    got_a = receive_until(ctx, tag_consumer, lambda r: len(r) >= len(tag_a))
    got_a_seq = sorted(int(m.properties["seq"]) for m in got_a)
    check(got_a_seq == tag_a, f"TagA filter delivered seq {got_a_seq}, expected {tag_a}")
    extra = quiet_poll(ctx, consumer) + quiet_poll(ctx, tag_consumer)
    check(not extra, f"acked messages came back: {[body_of(m) for m in extra]}")
    ctx.details.update(sent=n, received=len(got), tag_filtered=len(got_a))


def sc_fifo(ctx: Ctx) -> None:
    """FIFO: messages of one message group are consumed strictly in send order."""
    topic = ctx.topics["main"]
    groups = ["g-a", "g-b", "g-c"]
    per = int(ctx.params.get("per_group", 5))
    consumer = ctx.simple_consumer(ctx.groups["main"], [topic])
    p = ctx.producer([topic])
    for i in range(per):
        for g in groups:
            p.send(text_message(topic, f"{g}:{i}", group=g))
    seen: dict[str, list[int]] = {g: [] for g in groups}

    def on_message(m):
        g, i = body_of(m).split(":")
        check(m.message_group == g, f"message_group {m.message_group!r} != {g!r}")
        seen[g].append(int(i))

    got = receive_until(ctx, consumer, lambda r: len(r) >= per * len(groups), on_message=on_message)
    check(len(got) == per * len(groups), f"received {len(got)} of {per * len(groups)}")
    for g, seq in seen.items():
        check(seq == list(range(per)), f"group {g} consumed out of order: {seq}")
    ctx.details.update(groups=len(groups), per_group=per, order={g: s for g, s in seen.items()})


def sc_delay(ctx: Ctx) -> None:
    """Delay: delivered not before its delivery time (±1 s), a later normal message is not held up."""
    topic = ctx.topics["main"]
    delay_s = int(ctx.params.get("delay_s", 3))
    tolerance = float(ctx.params.get("tolerance_s", 1.0))
    consumer = ctx.simple_consumer(ctx.groups["main"], [topic], await_s=2)
    p = ctx.producer([topic])
    deliver_at = int(time.time()) + delay_s  # the Python client carries whole seconds
    p.send(text_message(topic, "delayed", deliver_at=deliver_at))
    p.send(text_message(topic, "immediate"))
    got = receive_until(ctx, consumer, lambda r: any(body_of(m) == "delayed" for m in r))
    order = [body_of(m) for m in got]
    check("delayed" in order, f"delayed message never arrived (got {order})")
    check(order.index("immediate") < order.index("delayed"), f"normal message was held up: {order}")
    m = next(m for m in got if body_of(m) == "delayed")
    offset = m.conformance_received_at - deliver_at
    ctx.details.update(delay_s=delay_s, offset_s=round(offset, 3), delivery_timestamp=m.delivery_timestamp)
    check(offset >= -tolerance, f"delivered {-offset:.2f}s before its delivery time")
    check(offset <= tolerance, f"delivered {offset:.2f}s after its delivery time")
    check(
        m.delivery_timestamp == deliver_at * 1000,
        f"delivery_timestamp {m.delivery_timestamp} != {deliver_at * 1000}",
    )


class RecordingChecker(TransactionChecker):
    def __init__(self, answers: dict[str, int]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def check(self, message):
        body = body_of(message)
        self.calls.append(body)
        return self.answers.get(body, TransactionResolution.ROLLBACK)


def sc_transaction(ctx: Ctx) -> None:
    """Transactions: commit delivered, rollback never; unresolved → checker asked, its answer applied."""
    topic = ctx.topics["main"]
    checker = RecordingChecker(
        {"tx-check-commit": TransactionResolution.COMMIT, "tx-check-rollback": TransactionResolution.ROLLBACK}
    )
    consumer = ctx.simple_consumer(ctx.groups["main"], [topic], await_s=2)
    p = ctx.producer([topic], checker)
    for kind in ("commit", "rollback", "check-commit", "check-rollback"):
        tx = p.begin_transaction()
        r = p.send(text_message(topic, f"tx-{kind}"), tx)
        check(bool(r.transaction_id), f"half message {kind} got no transaction id")
        if kind == "commit":
            tx.commit()
        elif kind == "rollback":
            tx.rollback()
    want = {"tx-commit", "tx-check-commit"}
    got = receive_until(
        ctx,
        consumer,
        lambda r: (
            want <= {body_of(m) for m in r} and {"tx-check-commit", "tx-check-rollback"} <= set(checker.calls)
        ),
    )
    got += quiet_poll(ctx, consumer)
    bodies = sorted(body_of(m) for m in got)
    ctx.details.update(delivered=bodies, checker_calls=sorted(checker.calls))
    check("tx-commit" in bodies, "committed message not delivered")
    check("tx-rollback" not in bodies, "rolled back message was delivered")
    check("tx-check-commit" in set(checker.calls), "checker was not asked about the unresolved transaction")
    check("tx-check-rollback" in set(checker.calls), "checker not asked about the 2nd unresolved transaction")
    check("tx-check-commit" in bodies, "checker answered COMMIT but the message was not delivered")
    check("tx-check-rollback" not in bodies, "checker answered ROLLBACK but the message was delivered")
    check(not {"tx-commit", "tx-rollback"} & set(checker.calls), "checker asked about a resolved transaction")
    check(bodies.count("tx-commit") == 1 and bodies.count("tx-check-commit") == 1, f"duplicates: {bodies}")


def sc_simple_consumer(ctx: Ctx) -> None:
    """SimpleConsumer: ack; change invisible duration (short → redelivery with attempt 2; long → new
    handle that acks)."""
    topic = ctx.topics["main"]
    consumer = ctx.simple_consumer(ctx.groups["main"], [topic], await_s=3)
    p = ctx.producer([topic])
    for body in ("ack-me", "retry-me", "extend-me"):
        p.send(text_message(topic, body))
    first = receive_until(ctx, consumer, lambda r: len(r) >= 3, invisible=30, ack=False)
    by_body = {body_of(m): m for m in first}
    check(set(by_body) == {"ack-me", "retry-me", "extend-me"}, f"first receive got {sorted(by_body)}")
    check(all(m.delivery_attempt == 1 for m in first), "first delivery attempt is not 1")
    consumer.ack(by_body["ack-me"])
    extend = by_body["extend-me"]
    old_handle = extend.receipt_handle
    consumer.change_invisible_duration(extend, 60)
    check(
        bool(extend.receipt_handle) and extend.receipt_handle != old_handle,
        "change_invisible_duration did not return a new receipt handle",
    )
    consumer.ack(extend)  # with the new handle
    retry = by_body["retry-me"]
    consumer.change_invisible_duration(retry, 1)
    t0 = time.monotonic()
    again = receive_until(ctx, consumer, lambda r: len(r) >= 1, invisible=30, ack=False)
    waited = time.monotonic() - t0
    check(len(again) == 1, f"expected one redelivery, got {[body_of(m) for m in again]}")
    m = again[0]
    check(body_of(m) == "retry-me", f"redelivered {body_of(m)!r}, expected 'retry-me'")
    check(m.message_id == retry.message_id, "redelivered message has another message id")
    check(m.delivery_attempt == 2, f"redelivery has delivery_attempt {m.delivery_attempt}, expected 2")
    consumer.ack(m)
    extra = quiet_poll(ctx, consumer)
    check(not extra, f"acked messages came back: {[body_of(x) for x in extra]}")
    ctx.details.update(redelivered_after_s=round(waited, 2), delivery_attempt=m.delivery_attempt)


class RecordingListener(MessageListener):
    def __init__(self) -> None:
        self.attempts: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def consume(self, message):
        body = body_of(message)
        with self.lock:
            self.attempts.setdefault(body, []).append(message.delivery_attempt)
        if body == "always-fail":
            return ConsumeResult.FAILURE
        if body == "fail-once" and message.delivery_attempt == 1:
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS


def sc_push_consumer(ctx: Ctx) -> None:
    """PushConsumer: SUCCESS acks; FAILURE → redelivery; after max attempts → %DLQ%<group>."""
    topic = ctx.topics["main"]
    group = ctx.groups["main"]
    max_attempts = int(ctx.params.get("max_attempts", 3))
    listener = RecordingListener()
    p = ctx.producer([topic])
    pc = PushConsumer(ctx.config(), group, listener, {topic: FilterExpression()})
    pc.startup()
    ctx.clients.append(pc)
    for body in ("ok", "fail-once", "always-fail"):
        p.send(text_message(topic, body))

    def done():
        a = listener.attempts
        return (
            a.get("ok") and len(a.get("fail-once", [])) >= 2 and len(a.get("always-fail", [])) >= max_attempts
        )

    while not done() and ctx.remaining() > 0:
        time.sleep(0.1)
    with listener.lock:
        attempts = {k: list(v) for k, v in listener.attempts.items()}
    ctx.details["attempts"] = attempts
    check(attempts.get("ok") == [1], f"'ok' deliveries: {attempts.get('ok')}")
    check(attempts.get("fail-once") == [1, 2], f"'fail-once' deliveries: {attempts.get('fail-once')}")
    check(
        attempts.get("always-fail", [])[:max_attempts] == list(range(1, max_attempts + 1)),
        f"'always-fail' deliveries: {attempts.get('always-fail')}",
    )
    dlq_topic = f"%DLQ%{group}"
    dlq = ctx.simple_consumer(ctx.groups["dlq"], [dlq_topic], await_s=2)
    found: list = []
    last_error = None
    while not found and ctx.remaining() > 0:
        try:
            found = receive_until(ctx, dlq, lambda r: len(r) >= 1)
        except Exception as e:  # the DLQ topic may not exist (no route) until the first dead letter
            last_error = e
            time.sleep(0.2)
    check(bool(found), f"nothing arrived in {dlq_topic} (last error: {last_error})")
    bodies = [body_of(m) for m in found]
    ctx.details.update(dlq=bodies, dlq_properties=dict(found[0].properties or {}))
    check(bodies == ["always-fail"], f"{dlq_topic} holds {bodies}, expected ['always-fail']")
    with listener.lock:
        total = len(listener.attempts.get("always-fail", []))
    check(total == max_attempts, f"'always-fail' was delivered {total} times, max attempts {max_attempts}")


def sc_group_split(ctx: Ctx) -> None:
    """Two SimpleConsumers in one group split the messages: no duplicates, together all."""
    topic = ctx.topics["main"]
    n = int(ctx.params.get("count", 20))
    c1 = ctx.simple_consumer(ctx.groups["main"], [topic], await_s=2)
    c2 = ctx.simple_consumer(ctx.groups["main"], [topic], await_s=2)
    p = ctx.producer([topic])
    sent = {p.send(text_message(topic, f"split-{i}")).message_id for i in range(n)}
    results: dict[str, list[str]] = {"c1": [], "c2": []}
    errors: list[str] = []
    lock = threading.Lock()

    def total():
        with lock:
            return len(results["c1"]) + len(results["c2"])

    def worker(name, c):
        try:
            while total() < n and ctx.remaining() > 0:
                for m in c.receive(2, 30) or []:
                    c.ack(m)
                    with lock:
                        results[name].append(m.message_id)
        except Exception as e:
            errors.append(f"{name}: {e}")

    threads = [threading.Thread(target=worker, args=(k, c)) for k, c in (("c1", c1), ("c2", c2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, ctx.remaining()))
    check(not errors, f"receive failed: {errors}")
    a, b = results["c1"], results["c2"]
    ctx.details.update(sent=n, c1=len(a), c2=len(b))
    check(len(a) == len(set(a)) and len(b) == len(set(b)), "a consumer got a message twice")
    check(not set(a) & set(b), f"{len(set(a) & set(b))} messages went to both consumers")
    check(set(a) | set(b) == sent, f"{len(sent - set(a) - set(b))} messages were not received")
    check(len(a) > 0 and len(b) > 0, f"one consumer got nothing (c1={len(a)}, c2={len(b)})")


def sc_topic_not_found(ctx: Ctx) -> None:
    """Sending to a topic that does not exist fails with TOPIC_NOT_FOUND (40402)."""
    topic = ctx.params["missing_topic"]
    p = ctx.producer()
    try:
        r = p.send(text_message(topic, "nowhere"))
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
    else:
        raise Fail(f"send to missing topic succeeded: {r.message_id}")
    # The client reports 'failed to fetch topic:<T> route.' and logs the server's status.
    logged = [line for line in ctx.log.lines if "40402" in line or "TOPIC_NOT_FOUND" in line]
    ctx.details.update(error=err, client_log=logged[:2])
    check(bool(logged) or "40402" in err, f"no TOPIC_NOT_FOUND (40402) in the error ({err}) or client log")


def sc_body_too_large(ctx: Ctx) -> None:
    """A body over the gateway's limit fails with MESSAGE_BODY_TOO_LARGE (41301); one at the limit passes."""
    topic = ctx.topics["main"]
    limit = int(ctx.params.get("max_body_size", 4 * MIB))
    p = ctx.producer([topic])
    # The client adopts the limit the gateway's Settings reply advertises and refuses larger bodies
    # itself; record that, then lift the client's own limit so the request reaches the gateway.
    settled = p._init_settings_event.wait(5)
    advertised = p._Producer__max_body_size if settled else None
    local = None
    try:
        p.send(text_message(topic, "x" * (limit + 1)))
    except Exception as e:
        local = f"{type(e).__name__}: {e}"
    p._Producer__max_body_size = 64 * MIB
    try:
        p.send(text_message(topic, "x" * (limit + 1)))
    except Exception as e:
        err, code = f"{type(e).__name__}: {e}", getattr(e, "code", None)
    else:
        raise Fail(f"a {limit + 1}-byte body was accepted")
    at_limit = p.send(text_message(topic, "y" * limit))
    ctx.details.update(
        advertised_max_body_size=advertised,
        client_side_error=local,
        error=err,
        code=code,
        at_limit_message_id=at_limit.message_id,
    )
    check(code == 41301, f"expected MESSAGE_BODY_TOO_LARGE (41301), got {err}")


# Helpers for the kill -9 restart test (tests/conformance): not part of the scenario table.


def sc_produce(ctx: Ctx) -> None:
    """Send up to ``count`` messages; append each acknowledged message id to ``out`` as sent."""
    topic = ctx.topics["main"]
    n = int(ctx.params.get("count", 100))
    out = ctx.params["out"]
    p = ctx.producer([topic])
    acked = 0
    with open(out, "a", encoding="utf-8") as f:
        for i in range(n):
            try:
                r = p.send(text_message(topic, f"durable-{i}"))
            except Exception as e:
                ctx.details["stopped_by"] = f"{type(e).__name__}: {e}"
                break
            f.write(r.message_id + "\n")
            f.flush()
            acked += 1
    ctx.details["acked"] = acked


def sc_consume(ctx: Ctx) -> None:
    """Receive and ack until every id listed in the file ``expect`` was seen."""
    topic = ctx.topics["main"]
    with open(ctx.params["expect"], encoding="utf-8") as f:
        want = {line.strip() for line in f if line.strip()}
    consumer = ctx.simple_consumer(ctx.groups["main"], [topic], await_s=2)
    got = receive_until(ctx, consumer, lambda r: want <= {m.message_id for m in r}, max_num=32)
    ids = {m.message_id for m in got}
    missing = want - ids
    ctx.details.update(expected=len(want), received=len(ids), missing=sorted(missing)[:10])
    check(not missing, f"{len(missing)} of {len(want)} acknowledged messages were lost")


SCENARIOS = {
    "normal": sc_normal,
    "fifo": sc_fifo,
    "delay": sc_delay,
    "transaction": sc_transaction,
    "simple_consumer": sc_simple_consumer,
    "push_consumer": sc_push_consumer,
    "group_split": sc_group_split,
    "topic_not_found": sc_topic_not_found,
    "body_too_large": sc_body_too_large,
    "produce": sc_produce,
    "consume": sc_consume,
}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in SCENARIOS:
        print(f"usage: {argv[0]} {{{','.join(SCENARIOS)}}} CONFIG_JSON", file=sys.stderr)
        return 2
    scenario = argv[1]
    ctx = Ctx(json.loads(argv[2]))
    ok, reason = False, ""
    try:
        SCENARIOS[scenario](ctx)
        ok = True
    except Fail as e:
        reason = str(e)
    except Exception as e:
        reason = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    finally:
        ctx.shutdown()
    ctx.details["elapsed_s"] = round(time.monotonic() - ctx.started, 2)
    line = {"client": CLIENT, "scenario": scenario, "ok": ok, "reason": reason, "details": ctx.details}
    sys.stdout.write(json.dumps(line, default=str) + "\n")
    sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    # The client leaves non-daemon threads behind; leave without waiting for them.
    code = main(sys.argv)
    sys.stderr.flush()
    os._exit(code)
