"""The retained messages' index (adapters/mqtt/retained_index.py): a wildcard subscription reads
only the retained records it gets (counted at the store client), the index follows every change of
the compacted topic (set, replace, clear, expiry, restart, another proxy's writes), and its filter
matching agrees with `topic_matches`."""

from __future__ import annotations

import gc
import random

import pytest

from adapters.mqtt.codec import topic_matches
from adapters.mqtt.retained import RETAINED_TOPIC, retained_record
from adapters.mqtt.retained_index import EXPIRY_AT, Entry, RetainedIndex, entry
from tests.adapters.mqtt.support import V5, close_env, open_env, serve
from tests.adapters.mqtt.test_retained_topic import payloads, publish_retained, retained_of
from tests.support import wait_until


class Counting:
    """Counts the records the store client hands out to reads of the retained topic."""

    def __init__(self, store) -> None:
        self.records = 0
        self.calls = 0
        for name in ("read", "latest", "latest_items"):
            setattr(store, name, self._wrap(getattr(store, name)))

    def _wrap(self, fn):
        async def counted(topic, *args, **kw):
            out = await fn(topic, *args, **kw)
            if topic == RETAINED_TOPIC:
                self.calls += 1
                self.records += len(out) if isinstance(out, list) else out is not None
            return out

        return counted


async def fill(processor, total: int, every: int) -> int:
    """`total` retained records, one path in `every` a `dev/<i>/state` (the rest `other/<i>/x`),
    written straight into the retained topic; the number of `dev/+/state` paths."""
    batch = []
    n = 0
    for i in range(total):
        if i % every == 0:
            path, n = f"dev/{i}/state", n + 1
        else:
            path = f"other/{i}/x"
        batch.append(retained_record(path, b"v%d" % i, {"mqtt.qos": "1", "mqtt.retain": "1"}))
    for i in range(0, total, 1000):
        await processor.send_internal(RETAINED_TOPIC, batch[i : i + 1000])
    return n


async def test_a_wildcard_subscription_reads_only_the_retained_records_it_gets(tmp_path):
    env = await open_env(str(tmp_path / "data"))
    try:
        wanted = await fill(env.processor, 3000, 100)
        await retained_of(env, "dev/+/state")  # the first use indexes the records written above
        count = Counting(env.processor.store)
        got = await retained_of(env, "dev/+/state")
        assert len(got) == wanted == 30
        assert count.records == wanted  # not the 3,000 the topic holds
        count.records = 0
        assert payloads(await retained_of(env, "dev/200/state")) == {"dev/200/state": b"v200"}
        assert count.records == 1
    finally:
        await close_env(env)


async def test_the_index_follows_changes_restarts_and_other_proxies(tmp_path):
    env = await open_env(str(tmp_path / "data"))
    other = None
    try:
        await publish_retained(env, [("s/a", b"1"), ("s/b", b"2"), ("s/c", b"3"), ("s/a/x", b"4")])
        assert payloads(await retained_of(env, "s/#")) == {
            "s/a": b"1",
            "s/b": b"2",
            "s/c": b"3",
            "s/a/x": b"4",
        }
        await publish_retained(env, [("s/b", b"2b"), ("s/c", b"")])  # replace, clear
        assert payloads(await retained_of(env, "s/+")) == {"s/a": b"1", "s/b": b"2b"}
        # a second proxy on the same store (as in CLUSTER mode) sees this one's writes and the reverse
        other = await serve(env.core)
        assert payloads(await retained_of(other, "s/#")) == {"s/a": b"1", "s/b": b"2b", "s/a/x": b"4"}
        await publish_retained(other, [("s/d", b"5"), ("s/a", b"")])
        assert payloads(await retained_of(env, "s/+")) == {"s/b": b"2b", "s/d": b"5"}
        # a retained message that expires is not delivered once expired
        async with env.client(V5) as pub:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.PUBLISH)
            props.MessageExpiryInterval = 1
            await pub.publish("s/e", b"soon", qos=1, retain=True, properties=props)
        assert "s/e" in payloads(await retained_of(env, "s/+"))
        idx = env.adapter.broker.retained.index
        e = idx.get("s/e")
        assert e is not None and e[EXPIRY_AT]
        idx.apply("s/e", (*e[:EXPIRY_AT], 1))  # as if its time had passed (no sleep)
        assert "s/e" not in payloads(await retained_of(env, "s/+"))
        await publish_retained(env, [("s/e", b"")])
    finally:
        await close_env(env)
    env = await open_env(str(tmp_path / "data"))
    try:
        assert payloads(await retained_of(env, "s/#")) == {"s/b": b"2b", "s/d": b"5", "s/a/x": b"4"}
        assert len(env.adapter.broker.retained.index) == 3
    finally:
        await close_env(env)


def _entry(i: int) -> Entry:
    return entry(0, i, 1, i, 0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_index_matching_agrees_with_topic_matches(seed):
    rnd = random.Random(seed)
    words = ["a", "b", "c", "", "$SYS", "dev"]
    paths = {"/".join(rnd.choice(words) for _ in range(rnd.randint(1, 4))) for _ in range(300)}
    paths = {p for p in paths if p}
    index = RetainedIndex()
    for i, p in enumerate(sorted(paths)):
        index.apply(p, _entry(i))
    gone = set(rnd.sample(sorted(paths), 60))
    for p in gone:
        index.apply(p, entry(0, 10_000, 0, 10_000, 0))  # tombstones
    live = paths - gone
    assert len(index) == len(live)
    assert index.total_bytes == len(live)
    filters = ["#", "+", "+/+", "a/#", "a/+", "+/b/#", "$SYS/#", "+/#", "/#", "a//+", "dev/+/c", "a", "a/b"]
    filters += ["/".join(rnd.choice([*words, "+"]) for _ in range(rnd.randint(1, 4))) for _ in range(40)]
    for f in filters:
        got = sorted(p for p, _e in index.match(f))
        assert got == sorted(p for p in live if topic_matches(f, p)), f
    for p in sorted(live):
        index.apply(p, entry(0, 20_000, 0, 20_000, 0))
    assert len(index) == 0 and index.total_bytes == 0 and not list(index.match("#"))


def test_index_leaves_are_not_tracked_by_the_garbage_collector():
    index = RetainedIndex()
    for i in range(100):
        index.apply(f"dev/{i}/state", entry(0, i, 1, i, 0))
    gc.collect()
    leaf = index._root["dev"]["7"]  # the node of dev/7: only its `state` entry
    assert not gc.is_tracked(index.get("dev/7/state")) and not gc.is_tracked(leaf)


async def test_the_index_tails_the_topic_without_a_subscription(tmp_path):
    env = await open_env(str(tmp_path / "data"))
    try:
        await fill(env.processor, 50, 10)  # written past the adapter, as by another proxy
        index = env.adapter.broker.retained.index
        await wait_until(lambda: len(index) == 50)
        count = Counting(env.processor.store)
        assert len(await retained_of(env, "dev/+/state")) == 5
        assert count.records == 5  # the subscription found them indexed
    finally:
        await close_env(env)
