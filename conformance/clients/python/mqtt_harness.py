"""What the MQTT scenario scripts of the conformance venv share: paho_scenarios.py (Eclipse Paho) and
../mosquitto/scenarios.py (mosquitto_pub / mosquitto_sub). Runs in ``.venv-conformance``; imports
nothing from the project. The RocketMQ 5 Python client is imported only by the cross-protocol
scenario (``rocketmq_side``).

A script is called as ``<python> SCRIPT SCENARIO CONFIG_JSON`` with CONFIG_JSON ``{"endpoint":
gRPC host:port, "mqtt": {"host", "port"}, "prefix": unique per (run, scenario, client), "topics",
"groups", "timeout", "params"}`` and prints one JSON line ``{"client", "scenario", "ok", "reason",
"details"}``; exit 0 = pass. A scenario name ``<base>_v311`` / ``<base>_v5`` selects the protocol
version (``Ctx.version`` 4 / 5).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field


class Fail(Exception):
    """The scenario's expectation was not met."""


def check(cond: object, reason: str) -> None:
    if not cond:
        raise Fail(reason)


@dataclass
class Received:
    """One PUBLISH a client received. ``props`` holds the 5.0 properties the scripts compare:
    content_type, response_topic, correlation_data (bytes), payload_format (int), expiry (int),
    user_properties (list of [name, value] in wire order)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    props: dict = field(default_factory=dict)

    def short(self) -> str:
        body = self.payload[:24].decode(errors="replace")
        return f"{self.topic} q{self.qos}{' r' if self.retain else ''} {body!r}"


class Inbox:
    """The messages one connection received, in arrival order; waits on a condition variable."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.messages: list[Received] = []
        self.cond = threading.Condition()

    def add(self, m: Received) -> None:
        with self.cond:
            self.messages.append(m)
            self.cond.notify_all()

    def snapshot(self, keep: Callable[[Received], bool] | None = None) -> list[Received]:
        with self.cond:
            return [m for m in self.messages if keep is None or keep(m)]

    def wait_for(self, pred: Callable[[list[Received]], bool], timeout: float) -> bool:
        end = time.monotonic() + max(0.0, timeout)
        with self.cond:
            while not pred(self.messages):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def wait_count(self, n: int, timeout: float) -> bool:
        return self.wait_for(lambda ms: len(ms) >= n, timeout)

    def wait_topic(self, topic: str, timeout: float, n: int = 1) -> bool:
        return self.wait_for(lambda ms: sum(m.topic == topic for m in ms) >= n, timeout)

    def topics(self, keep: Callable[[Received], bool] | None = None) -> list[str]:
        return [m.topic for m in self.snapshot(keep)]


def version_of(scenario: str) -> tuple[str, int | None]:
    """``qos_v311`` -> (``qos``, 4); ``properties_v5`` -> (``properties``, 5); else (name, None)."""
    for suffix, v in (("_v311", 4), ("_v5", 5)):
        if scenario.endswith(suffix):
            return scenario[: -len(suffix)], v
    return scenario, None


class Ctx:
    def __init__(self, cfg: dict, scenario: str) -> None:
        self.cfg = cfg
        self.base, v = version_of(scenario)
        self.params = cfg.get("params", {})
        self.version = int(self.params.get("version") or v or 5)
        self.host = cfg["mqtt"]["host"]
        self.port = int(cfg["mqtt"]["port"])
        self.endpoint = cfg.get("endpoint", "")
        self.prefix = cfg["prefix"]
        self.topics = cfg.get("topics", {})
        self.groups = cfg.get("groups", {})
        self.quiet = float(self.params.get("quiet_s", 0.5))
        self.started = time.monotonic()
        # Leave a margin so the script reports a reason before the runner kills it.
        self.deadline = self.started + max(5.0, float(cfg.get("timeout", 30)) - 5.0)
        versioned = self.params.get("version") or v
        self.details: dict = {
            "mqtt_version": ("5.0" if self.version == 5 else "3.1.1") if versioned else "3.1.1 + 5.0"
        }
        self._cleanups: list[Callable[[], object]] = []

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def wait_s(self, limit: float = 10.0) -> float:
        """A bounded wait for one expected event, never past the scenario's deadline."""
        return max(0.1, min(limit, self.remaining()))

    def topic(self, *levels: str) -> str:
        return "/".join((self.prefix, *levels))

    def own(self, topic: str) -> bool:
        """The topic belongs to this run's scenario (root wildcard subscribers see everything)."""
        p = self.prefix
        return any(topic == root or topic.startswith(root + "/") for root in (p, "$" + p))

    def on_cleanup(self, fn: Callable[[], object]) -> None:
        self._cleanups.append(fn)

    def cleanup(self) -> None:
        for fn in reversed(self._cleanups):
            t = threading.Thread(target=_quiet, args=(fn,), daemon=True)
            t.start()
            t.join(5)


def _quiet(fn: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        fn()


# The qos scenario: (last topic level, subscription QoS, publish QoS); delivered QoS = the smaller.
QOS_CASES = (("q0", 0, 0), ("q1", 1, 1), ("q2", 2, 2), ("down", 1, 2), ("up", 2, 1))
QOS_EXTRA = (bytes(range(256)), b"", b"\xa5" * 65536)  # binary, empty, 64 KiB


def qos_texts(level: str, sub_qos: int, pub_qos: int, n: int) -> list[bytes]:
    """Text payloads of one qos case (n when sub = pub QoS, else 3); same-QoS cases add QOS_EXTRA."""
    return [f"{level}-{i}".encode() for i in range(n if sub_qos == pub_qos else 3)]


def expect_exact(got: list, want: list, what: str) -> None:
    check(got == want, f"{what}: got {got}, expected {want}")


def run(client: str, scenarios: dict[str, Callable[[Ctx], None]], argv: list[str]) -> None:
    """Run one scenario, print the result line, exit (without waiting for client threads)."""
    scenario = argv[1] if len(argv) == 3 else ""
    base, _ = version_of(scenario)
    if base not in scenarios:
        print(f"usage: {argv[0]} {{{','.join(scenarios)}}}[_v311|_v5] CONFIG_JSON", file=sys.stderr)
        os._exit(2)
    ctx = Ctx(json.loads(argv[2]), scenario)
    ok, reason = False, ""
    try:
        scenarios[base](ctx)
        ok = True
    except Fail as e:
        reason = str(e)
    except Exception as e:
        reason = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    finally:
        ctx.cleanup()
    ctx.details["elapsed_s"] = round(time.monotonic() - ctx.started, 2)
    line = {"client": client, "scenario": scenario, "ok": ok, "reason": reason, "details": ctx.details}
    sys.stdout.write(json.dumps(line, default=str) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)


# --------------------------------------------------------------------------- cross-protocol


class RocketMQSide:
    """The official RocketMQ 5 Python client's half of the cross-protocol scenario."""

    def __init__(self, ctx: Ctx) -> None:
        from rocketmq import ClientConfiguration, Credentials  # the conformance venv has it

        self.ctx = ctx
        self.config = ClientConfiguration(ctx.endpoint, Credentials(), request_timeout=3)

    def consumer(self, group: str, topic: str):
        from rocketmq import FilterExpression, SimpleConsumer

        c = SimpleConsumer(self.config, group, {topic: FilterExpression()}, 2)
        c.startup()
        self.ctx.on_cleanup(c.shutdown)
        return c

    def producer(self, topic: str):
        from rocketmq import Producer

        p = Producer(self.config, (topic,))
        p.startup()
        self.ctx.on_cleanup(p.shutdown)
        return p

    def send(self, producer, topic: str, body: bytes, tag: str | None = None) -> str:
        from rocketmq import Message

        m = Message()
        m.topic = topic
        m.body = body
        if tag:
            m.tag = tag
        return producer.send(m).message_id

    def receive(self, consumer, n: int) -> list:
        """Receive and ack until ``n`` messages (or the deadline)."""
        got: list = []
        while len(got) < n and self.ctx.remaining() > 0:
            for m in consumer.receive(16, 20) or []:
                got.append(m)
                consumer.ack(m)
        return got


def check_from_mqtt(ctx: Ctx, got: list, sent: dict[str, tuple[bytes, int, dict]]) -> None:
    """RocketMQ messages that were MQTT PUBLISHes: ``sent`` maps the MQTT path to (payload, qos,
    expected extra properties). Checks body, store topic, mqtt.topic, mqtt.qos, mqtt.retain and the
    extras."""
    by_path = {}
    for m in got:
        props = dict(m.properties or {})
        by_path.setdefault(props.get("mqtt.topic"), []).append((m, props))
    ctx.details["rocketmq_received"] = {
        p: [(m.body.decode(errors="replace"), props) for m, props in v] for p, v in by_path.items()
    }
    check(len(got) == len(sent), f"RocketMQ consumer got {len(got)} messages, expected {len(sent)}")
    for path, (payload, qos, extra) in sent.items():
        check(
            path in by_path, f"no RocketMQ message with mqtt.topic={path!r} (got {sorted(map(str, by_path))})"
        )
        check(len(by_path[path]) == 1, f"{path}: {len(by_path[path])} copies")
        m, props = by_path[path][0]
        check(m.body == payload, f"{path}: body {m.body!r} != {payload!r}")
        check(
            m.topic == ctx.topics["sensors"], f"{path}: store topic {m.topic!r} != {ctx.topics['sensors']!r}"
        )
        check(props.get("mqtt.qos") == str(qos), f"{path}: mqtt.qos {props.get('mqtt.qos')!r} != {qos}")
        # mqtt.retain is "1" for a retained publish, absent (older gateways: "0") otherwise
        check(props.get("mqtt.retain") != "1", f"{path}: not retained but mqtt.retain = 1")
        for k, v in extra.items():
            check(props.get(k) == v, f"{path}: property {k} = {props.get(k)!r}, expected {v!r}")
