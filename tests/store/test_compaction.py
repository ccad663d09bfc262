"""Compacted topics (store/compaction.py): the latest record per key wins, tombstones remove their
key after `tombstone_retention_ms`, records without a key are kept, a key's records stay in one
queue; the kept records outlive commit log retention and restarts, and a kill -9 in the middle of
a compaction leaves the old generation or the new one, never a mix."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from store import Message
from tests.store.compaction_child import KEYS, ROUNDS, TOPIC, value
from tests.store.support import HERE, ROOT

SEG = 64 * 1024


async def _close_segment(store) -> None:
    """Append to another topic until the segment written so far is closed, then checkpoint (entries
    go to their files), so that compaction covers everything appended before."""
    seg = store.commitlog.write_pos // SEG
    while store.commitlog.write_pos // SEG == seg:
        await store.append(Message("filler", b"f" * 20_000))
    await store._parts.checkpoints.checkpoint()


def _all(store, topic: str) -> list[Message]:
    return [m for q in range(store.queue_count(topic)) for m in store.read(topic, q, 0, 10**9, 10**6)]


async def test_latest_value_per_key_wins_and_tombstones_go(make_store):
    store = await make_store(segment_size=SEG, tombstone_retention_ms=60_000)
    store.create_topic("t", queues=3, compacted=True)
    for rnd in range(5):
        for k in range(20):
            await store.append(Message("t", b"%d-%d" % (k, rnd), keys=(f"k{k}",)))
    await store.append(Message("t", b"", keys=("k7",)))  # tombstone
    await store.append(Message("t", b"no key"))  # never removed
    # a key's records share one queue
    for k in range(20):
        assert len({m.queue_id for m in _all(store, "t") if m.keys == (f"k{k}",)}) == 1
    assert store.latest("t", "k3").body == b"3-4"
    assert store.latest("t", "k7") is None
    assert store.latest("t", "k7", tombstones=True).body == b""
    await _close_segment(store)
    stats = await store.compact()
    assert stats.records_in == 102 and stats.records_kept == 21  # 19 values, 1 tombstone, 1 keyless
    bodies = sorted(m.body for m in _all(store, "t"))
    assert bodies == sorted([b"%d-4" % k for k in range(20) if k != 7] + [b"", b"no key"])
    # the tombstone goes once it is older than tombstone_retention_ms
    stats = await store.compact(now=store.latest("t", "k7", tombstones=True).store_timestamp + 60_001)
    assert sorted(m.body for m in _all(store, "t")) == sorted(
        [b"%d-4" % k for k in range(20) if k != 7] + [b"no key"]
    )
    assert [m.keys[0] for m in store.latest_items("t")] == sorted(f"k{k}" for k in range(20) if k != 7)


async def test_a_new_group_reads_current_state_then_changes_and_removed_records_count_as_consumed(make_store):
    store = await make_store(segment_size=SEG)
    store.create_topic("t", queues=1, compacted=True)
    for rnd in range(10):
        await store.append(Message("t", b"v%d" % rnd, keys=("dev",)))
    await _close_segment(store)
    await store.compact()
    await store.append(Message("t", b"v10", keys=("dev",)))
    popped = await store.pop("g", "t", max_messages=32)
    assert [p.message.body for p in popped] == [b"v9", b"v10"]
    assert [p.message.queue_offset for p in popped] == [9, 10]  # offsets are kept
    for p in popped:
        store.ack(p.receipt_handle)
    assert store.backlog("g", "t") == 0


async def test_kept_records_outlive_retention_and_restarts(make_store, tmp_path):
    data = str(tmp_path / "data")
    store = await make_store(data_dir=data, segment_size=SEG, retention_ms=1)
    store.create_topic("t", queues=2, compacted=True)
    for rnd in range(30):
        for k in range(10):
            await store.append(Message("t", b"%d-%d" % (k, rnd) + b"x" * 100, keys=(f"k{k}",)))
    # retention may not delete what compaction has not copied yet
    assert await store.apply_retention(now=2**50) == 0 or store.latest("t", "k1") is not None
    await _close_segment(store)
    await store.compact()
    assert await store.apply_retention(now=2**50) > 0  # the old segments go...
    assert store.commitlog.min_offset > 0
    expect = sorted(b"%d-29" % k + b"x" * 100 for k in range(10))
    assert sorted(m.body for m in _all(store, "t")) == expect  # ...the latest values stay
    await store.close()
    store = await make_store(data_dir=data, segment_size=SEG, retention_ms=1)
    assert sorted(m.body for m in _all(store, "t")) == expect
    assert store.latest("t", "k4").body.startswith(b"4-29")
    # more values, compacted with the previous generation
    for k in range(10):
        await store.append(Message("t", b"new%d" % k, keys=(f"k{k}",)))
    await _close_segment(store)
    await store.compact()
    assert sorted(m.body for m in _all(store, "t")) == sorted(b"new%d" % k for k in range(10))


@pytest.mark.timeout(120)
async def test_kill_9_during_compaction_leaves_a_whole_generation(tmp_path):
    from store import Store, StoreConfig

    data = str(tmp_path / "data")
    child = [sys.executable, str(HERE / "compaction_child.py"), data]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rng = random.Random(27)
    kills_during = 0
    seen_worker = False
    for rnd in range(6):
        pause = rnd % 2 == 1  # odd rounds: killed between writing a generation and switching to it
        args = [*child, "fill" if rnd == 0 else "more"] + (["pause"] if pause else [])
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        rounds = 0
        for line in proc.stdout:
            word = line.strip()
            rounds += word == b"ROUND"
            if pause and word == b"SWITCHING":
                break
            if not pause and word == b"COMPACTING" and (rounds >= 1 or rnd == 0):
                time.sleep(rng.uniform(0, 0.04))  # somewhere inside the pass (tens of milliseconds)
                break
        workers = _children(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills_during += 1
        # the compaction worker process dies with the store's (it would otherwise go on switching
        # generations under the next store)
        deadline = time.monotonic() + 5
        while any(os.path.exists(f"/proc/{w}") and _state(w) != "Z" for w in workers):
            assert time.monotonic() < deadline, f"compaction worker(s) {workers} outlived the store"
            time.sleep(0.02)
        if not pause:
            seen_worker = seen_worker or bool(workers)
        if pause:  # a whole new generation was written but never made current
            assert any(
                n.startswith("gen-") and f"gen-{_current(data, q)}." not in n
                for q in range(4)
                for n in os.listdir(os.path.join(data, "compacted", TOPIC, str(q)))
            )
        store = await Store.open(
            StoreConfig(data_dir=data, segment_size=256 * 1024, compaction_interval_ms=10**9)
        )
        try:
            latest = {m.keys[0]: m.body for m in store.latest_items(TOPIC)}
            assert len(latest) == KEYS
            newest = {k: value(k, ROUNDS + 1000) for k in range(KEYS)}
            oldest_ok = {k: value(k, ROUNDS - 1) for k in range(KEYS)}
            for k in range(KEYS):
                assert latest[f"k{k}"] in (newest[k], oldest_ok[k])
            # every record a read returns is whole, and each key's latest is among them
            bodies = {}
            for q in range(4):
                for m in store.read(TOPIC, q, 0, 10**9, 10**6):
                    bodies[m.keys[0]] = m.body
            assert bodies == latest
            # nothing of an unfinished generation is left behind
            for q in range(4):
                qdir = os.path.join(data, "compacted", TOPIC, str(q))
                if os.path.isdir(qdir):
                    gens = {n.split(".")[0] for n in os.listdir(qdir) if n.startswith("gen-")}
                    assert len(gens) <= 1
        finally:
            await store.close()
    assert kills_during == 6
    assert seen_worker  # the rounds without the pause hook compacted in the worker process


def _current(data: str, q: int) -> int | None:
    import json

    try:
        with open(os.path.join(data, "compacted", TOPIC, str(q), "CURRENT")) as f:
            return json.load(f)["gen"]
    except FileNotFoundError:
        return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:  # the thread ended since the listing
            continue
    return out


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "X"
