"""What a published message costs the persistent sessions it is NOT for (issue 48 item 1).

N persistent sessions (3.1.1, Clean Session 0) each subscribe to their own `dev/<i>/cmd`; M
telemetry messages go to `dev/t/telemetry`, which none of them matches. Counted, per telemetry
message, for those N sessions: the messages the store handed to their readers (`tail`/`read`/`pop`
by the session's group), the reader wake-ups that brought only messages not theirs, the filter
matches that said no, and the trace deliveries recorded for them. With a queue per session
(session_routing.py, the default in one process) each count is 0; without (`session_queues=False`,
what CLUSTER mode and `--workers` proxies still do) each is N per message: each session reads and
filters the whole `dev` store topic.

Run as a script for the figures at several sizes (default 100 and 3,000 sessions; `--topics`: the
sessions read their store topics, as before queues):

    .venv/bin/python -m tests.adapters.mqtt.test_persistent_cost 100 3000
    .venv/bin/python -m tests.adapters.mqtt.test_persistent_cost --cpu 100 1000 3000  # CPU, acks/s

The store topic has one queue here, so a command published after the telemetry reaches a session's
reader only after that reader has passed the telemetry: when every session has its command, every
reader has had its chance to read (and be charged for) the telemetry.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

from adapters.mqtt import fanout
from adapters.mqtt.codec import (
    Publish,
    Subscribe,
    Subscription,
    encode_puback,
    encode_publish,
    encode_subscribe,
)
from adapters.mqtt.codec.packets import Suback
from tests.adapters.mqtt.support import Env, Raw, close_env, serve
from tests.support import Core

SESSIONS = int(os.environ.get("MQTT_COST_SESSIONS", "100"))  # the test's size (the script takes its own)
TELEMETRY = 10  # messages none of the sessions matches


@dataclass
class Cost:
    """Counts for the sessions a message is not for, summed over the telemetry messages."""

    sessions: int
    messages: int
    reads: int = 0  # messages the store handed to a non-matching session's reader
    wakeups: int = 0  # reader calls that returned only messages not for that session
    filter_no: int = 0  # filter matches that said no
    traced: int = 0  # trace deliveries recorded for a non-matching session
    seconds: float = 0.0  # from the first telemetry publish to the last command's arrival
    groups: dict[str, str] = field(default_factory=dict)  # session group -> its filter

    def per_message(self) -> dict[str, float]:
        m = self.messages
        return {
            "reads": self.reads / m,
            "wakeups": self.wakeups / m,
            "filter_no": self.filter_no / m,
            "traced": self.traced / m,
        }


def _instrument(env: Env, cost: Cost) -> None:
    """Count, per session group, what its readers get that is not for it."""
    p = env.processor
    telemetry = "dev/t/telemetry"

    def charge(group: str | None, msgs: list) -> None:
        if group not in cost.groups or not msgs:
            return
        n = sum(1 for m in msgs if m.properties.get("mqtt.topic") == telemetry)
        cost.reads += n
        if n == len(msgs):
            cost.wakeups += 1

    tail = p.tail

    async def counted_tail(ctx, topic, positions, max_messages=128, wait_ms=0, *, group):
        msgs = await tail(ctx, topic, positions, max_messages, wait_ms, group=group)
        charge(group, msgs)
        return msgs

    p.tail = counted_tail  # type: ignore[method-assign]
    tail_now = p.tail_now

    def counted_tail_now(ctx, topic, positions, max_messages, *, group):  # (a reader woken by its watch)
        msgs = tail_now(ctx, topic, positions, max_messages, group=group)
        charge(group, msgs or [])
        return msgs

    p.tail_now = counted_tail_now  # type: ignore[method-assign]

    pop = p.pop

    async def counted_pop(ctx, group, topic, *a, **kw):
        got = await pop(ctx, group, topic, *a, **kw)
        charge(group, [d.message for d in got])
        return got

    p.pop = counted_pop  # type: ignore[method-assign]

    matches = getattr(fanout, "topic_matches", None)
    if matches is not None:

        def counted_matches(filt: str, path: str) -> bool:
            r = matches(filt, path)
            if not r and path == telemetry:
                cost.filter_no += 1
            return r

        fanout.topic_matches = counted_matches  # type: ignore[attr-defined]

    tracer = p.tracer
    if tracer is not None:
        tailed = tracer.tailed

        def counted_tailed(ctx, group, msgs):
            if group in cost.groups:
                cost.traced += sum(1 for m in msgs if m.properties.get("mqtt.topic") == telemetry)
            return tailed(ctx, group, msgs)

        tracer.tailed = counted_tailed  # type: ignore[method-assign]


async def _receive_command(raw: Raw) -> bytes:
    while True:
        pkt = await raw.recv(timeout=120)
        assert pkt is not None, "connection closed before the command came"
        if isinstance(pkt, Publish):
            if pkt.qos:
                raw.send(encode_puback(pkt.packet_id, 0, 4))
            return pkt.payload


async def measure(
    data_dir: str, sessions: int, telemetry: int = TELEMETRY, traced: bool = True, queues: bool = True
) -> Cost:
    """Connect `sessions` persistent sessions on `dev/<i>/cmd`, publish `telemetry` messages to
    `dev/t/telemetry` and one command to each session, and count what the telemetry cost them
    (`queues`: a queue per session, else each reads the store topic)."""
    core = await Core.open(data_dir, default_queues=1, auto_create_topics=True, traced=traced)
    env = await serve(core, session_queues=queues)
    old_matches = getattr(fanout, "topic_matches", None)
    cost = Cost(sessions, telemetry)
    raws: list[Raw] = []
    _instrument(env, cost)  # before the readers start: a long poll in flight is counted too
    try:
        for i in range(sessions):
            raw, _ = await Raw.connect(env, f"cost-{i}", 4, clean_start=False)
            raw.send(encode_subscribe(Subscribe(1, [Subscription(f"dev/{i}/cmd", 1)]), 4))
            assert isinstance(await raw.recv(timeout=60), Suback)
            raws.append(raw)
        states = env.adapter.broker.registry.states
        cost.groups.update({states[f"cost-{i}"].group: f"dev/{i}/cmd" for i in range(sessions)})
        pub, _ = await Raw.connect(env, "cost-publisher", 4)
        t0 = time.perf_counter()
        for k in range(telemetry):
            pub.send(encode_publish("dev/t/telemetry", b"t%d" % k, 1, k + 1))
        for _ in range(telemetry):
            await pub.recv(timeout=60)  # the PUBACKs: stored
        for i in range(sessions):
            pub.send(encode_publish(f"dev/{i}/cmd", b"c%d" % i, 1, (i % 60000) + 100))
        got = await asyncio.gather(*(_receive_command(r) for r in raws))
        cost.seconds = time.perf_counter() - t0
        assert got == [b"c%d" % i for i in range(sessions)]
        await pub.close()
    finally:
        if old_matches is not None:
            fanout.topic_matches = old_matches  # type: ignore[attr-defined]
        for r in raws:
            r.abort()
        await close_env(env)
    return cost


async def cpu_per_message(
    data_dir: str, sessions: int, messages: int = 300, window: int = 20, queues: bool = True
) -> dict[str, float]:
    """Publish `messages` QoS 1 telemetry messages (`window` unacked at a time) past `sessions`
    persistent sessions and take the process CPU (clients included: they are idle but for the
    publisher) until every session's reader has passed them (with queues: none reads them):
    CPU per message and acks per second."""
    core = await Core.open(data_dir, default_queues=1, auto_create_topics=True, traced=True)
    env = await serve(core, session_queues=queues)
    cost = Cost(sessions, messages)
    _instrument(env, cost)
    raws: list[Raw] = []
    try:
        for i in range(sessions):
            raw, _ = await Raw.connect(env, f"cost-{i}", 4, clean_start=False)
            raw.send(encode_subscribe(Subscribe(1, [Subscription(f"dev/{i}/cmd", 1)]), 4))
            assert isinstance(await raw.recv(timeout=60), Suback)
            raws.append(raw)
        states = env.adapter.broker.registry.states
        cost.groups.update({states[f"cost-{i}"].group: f"dev/{i}/cmd" for i in range(sessions)})
        pub, _ = await Raw.connect(env, "cost-publisher", 4)
        c0, t0 = time.process_time(), time.perf_counter()
        sent = acked = 0
        while acked < messages:
            while sent < messages and sent - acked < window:
                sent += 1
                pub.send(encode_publish(f"dev/{sent % 100}/telemetry", b"x" * 64, 1, sent))
            await pub.recv(timeout=120)
            acked += 1
        t_acked = time.perf_counter() - t0
        deadline = time.perf_counter() + 120
        while not queues and cost.reads < sessions * messages and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        cpu = time.process_time() - c0
        await pub.close()
    finally:
        for r in raws:
            r.abort()
        await close_env(env)
    return {"cpu_us": cpu / messages * 1e6, "acks_per_s": messages / t_acked}


async def test_a_message_costs_nothing_for_the_persistent_sessions_it_is_not_for(tmp_path):
    cost = await measure(str(tmp_path / "data"), SESSIONS)
    assert cost.per_message() == {"reads": 0, "wakeups": 0, "filter_no": 0, "traced": 0}


async def test_the_measure_sees_the_cost_of_sessions_that_read_their_store_topics(tmp_path):
    """The instrument itself, on the path without queues: every session's reader is handed,
    filters and traces each telemetry message (so the test above would fail if queues did not
    take that away)."""
    cost = await measure(str(tmp_path / "data"), 20, telemetry=5, queues=False)
    per = cost.per_message()
    assert per == {"reads": 20, "wakeups": per["wakeups"], "filter_no": 20, "traced": 20}
    assert 1 <= per["wakeups"] <= 20


async def _main(sizes: list[int], queues: bool) -> None:
    with open("/proc/loadavg") as f:
        print(f"load {f.read().strip()}")
    print("sessions  per telemetry message: reads  wake-ups  filter-no  traced   seconds")
    for n in sizes:
        with tempfile.TemporaryDirectory() as d:
            c = await measure(os.path.join(d, "data"), n, queues=queues)
        pm = c.per_message()
        print(
            f"{n:>8}  {pm['reads']:>28.1f}  {pm['wakeups']:>8.1f}  {pm['filter_no']:>9.1f}"
            f"  {pm['traced']:>6.1f}  {c.seconds:>8.2f}"
        )


async def _cpu(sizes: list[int], queues: bool) -> None:
    print("sessions  CPU per message (us)  acks/s   (300 QoS 1 telemetry messages, 20 unacked at a time)")
    for n in sizes:
        with tempfile.TemporaryDirectory() as d:
            r = await cpu_per_message(os.path.join(d, "data"), n, queues=queues)
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        print(f"{n:>8}  {r['cpu_us']:>20.0f}  {r['acks_per_s']:>6.0f}   load {load}")


if __name__ == "__main__":
    args = sys.argv[1:]
    use_queues = "--topics" not in args
    args = [a for a in args if a != "--topics"]
    if args and args[0] == "--cpu":
        asyncio.run(_cpu([int(a) for a in args[1:]] or [100, 1000, 3000], use_queues))
    else:
        asyncio.run(_main([int(a) for a in args] or [100, 3000], use_queues))
