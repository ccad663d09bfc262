"""Damaged files: a torn or bit-flipped commit log tail, a torn consumer operations log, truncated or
missing consume queue files. The store must open, drop exactly the damaged tail, keep everything
before it readable, rebuild derived files from the commit log, and keep working."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from store import InvalidReceiptHandle, Message
from store.message import now_ms
from tests.store.support import (
    QUIET,
    append,
    crash_copy,
    flush_progress,
    open_store,
    read_queue,
    segment_files,
    segment_path,
)

pytestmark = pytest.mark.timeout(60)

SEG = 64 * 1024
TOPICS = {"c0": 2, "c1": 1}


async def _open(data_dir, **kw):
    kw.setdefault("segment_size", SEG)
    kw.setdefault("checkpoint_interval_ms", QUIET)
    return await open_store(data_dir=str(data_dir), **kw)


async def _populate(s, n: int = 150) -> list:
    """n appends over the topics (about 2.5 segments); bodies are free of zero bytes."""
    for t, q in TOPICS.items():
        s.create_topic(t, queues=q)
    msgs = []
    for i in range(n):
        topic = "c0" if i % 3 else "c1"
        body = f"m{i:05d}|".encode() + bytes((1 + (i + j) % 250) for j in range(900 + i % 50))
        msgs.append(Message(topic, body, tag=f"t{i % 4}", keys=(f"key-{i}",)))
    out = []
    for k in range(0, n, 10):  # small concurrent batches: offsets follow the order of the calls
        out += await asyncio.gather(*[append(s, m) for m in msgs[k : k + 10]])
    return out


def _layout(s) -> dict:
    """(topic, queue) -> [(queue offset, body), ...] of everything readable."""
    return {
        (t, q): [(m.queue_offset, m.body) for m in read_queue(s, t, q)]
        for t, n in TOPICS.items()
        for q in range(n)
    }


def _assert_layout(got: dict, want: dict) -> None:
    """Equal layouts, or a readable account of what differs per queue."""
    diffs = []
    for key in sorted(set(got) | set(want)):
        g, w = got.get(key, []), want.get(key, [])
        if g != w:
            gi, wi = dict(g), dict(w)
            missing = sorted(set(wi) - set(gi))
            extra = sorted(set(gi) - set(wi))
            changed = sorted(o for o in set(gi) & set(wi) if gi[o] != wi[o])
            diffs.append(
                f"{key}: {len(g)} readable, {len(w)} expected; missing offsets {missing[:8]}"
                f"{'...' if len(missing) > 8 else ''}, unexpected {extra[:8]}, different {changed[:8]}"
            )
    assert not diffs, "\n".join(diffs)


def _expected(results, bodies_by_clo, keep: int) -> dict:
    out = {(t, q): [] for t, n in TOPICS.items() for q in range(n)}
    for r in results[:keep]:
        out[(r.topic, r.queue_id)].append((r.queue_offset, bodies_by_clo[r.commitlog_offset]))
    return out


async def _check_reopened(data_dir, results, bodies, keep: int) -> None:
    """After damage: exactly results[:keep] are readable; the store appends and survives a reopen."""
    s = await _open(data_dir)
    try:
        _assert_layout(_layout(s), _expected(results, bodies, keep))
        for r in results[keep:]:
            assert s.get_by_id(r.message_id) == []
        for r in results[:keep][-5:]:
            assert [m.body for m in s.get_by_id(r.message_id)] == [bodies[r.commitlog_offset]]
        new = [
            await s.append(Message(t, f"new-{t}-{i}".encode(), keys=("new",)))
            for t in TOPICS
            for i in range(4)
        ]
        for r in new:
            assert (
                s.read(r.topic, r.queue_id, r.queue_offset)[0].body
                == f"new-{r.topic}-{new.index(r) % 4}".encode()
            )
    finally:
        await s.close()
    s = await _open(data_dir)
    try:
        layout = _layout(s)
        for (t, q), entries in _expected(results, bodies, keep).items():
            got = layout[(t, q)]
            assert got[: len(entries)] == entries
            assert [o for o, _ in got] == list(range(len(got)))  # contiguous queue offsets
        assert sorted(m.body for m in s.get_by_key("new")) == sorted(
            f"new-{t}-{i}".encode() for t in TOPICS for i in range(4)
        )
        assert sum(len(v) for v in layout.values()) == keep + len(new)
    finally:
        await s.close()


async def _make(tmp_path, crashed: bool):
    """A populated data dir, left by a clean close or (crashed) by a crash after the last append."""
    src = tmp_path / "data"
    s = await _open(src)
    results = await _populate(s)
    bodies = {r.commitlog_offset: s.get_message(r.commitlog_offset).body for r in results}
    if crashed:
        await crash_copy(s, tmp_path / "crashed")
        await s.close()
        return tmp_path / "crashed", results, bodies
    await s.close()
    return src, results, bodies


# ============================================================================ commit log tail
@pytest.mark.parametrize("crashed", [False, True], ids=["closed", "crashed"])
@pytest.mark.parametrize(
    "from_end,cut",
    [(1, 0), (1, 1), (1, 4), (1, 8), (1, 9), (1, 40), (1, -1), (2, 20), (3, -5), ("segment", 0)],
)
async def test_truncated_commitlog_tail(tmp_path, crashed, from_end, cut):
    data, results, bodies = await _make(tmp_path, crashed)
    last_base = results[-1].commitlog_offset - results[-1].commitlog_offset % SEG
    if from_end == "segment":  # the whole last segment's data
        idx = next(i for i, r in enumerate(results) if r.commitlog_offset >= last_base)
    else:
        idx = len(results) - from_end
    victim = results[idx]
    assert victim.commitlog_offset >= last_base, "test setup: the cut must be in the last segment"
    path, pos = segment_path(data, SEG, victim.commitlog_offset)
    pos += cut if cut >= 0 else victim.size + cut
    assert path == segment_files(data)[-1]
    os.truncate(path, pos)
    await _check_reopened(data, results, bodies, keep=idx)


@pytest.mark.parametrize("crashed", [False, True], ids=["closed", "crashed"])
@pytest.mark.parametrize("where", [0, 1, 3, 4, 7, 8, 9, 12, 20, 47, 60, "body", "last"])
async def test_bit_flip_in_tail_record(tmp_path, crashed, where):
    data, results, bodies = await _make(tmp_path, crashed)
    victim = results[-1]
    path, pos = segment_path(data, SEG, victim.commitlog_offset)
    off = {"body": victim.size // 2 + 40, "last": victim.size - 1}.get(where, where)
    with open(path, "r+b") as f:
        f.seek(pos + off)
        b = f.read(1)[0]
        f.seek(pos + off)
        f.write(bytes((b ^ (1 << (off % 8)),)))
    await _check_reopened(data, results, bodies, keep=len(results) - 1)


async def test_garbage_after_the_tail(tmp_path):
    """Bytes past the last record that do not form a valid record (a torn next write) are cut."""
    data, results, bodies = await _make(tmp_path, crashed=True)
    end = results[-1].commitlog_offset + results[-1].size
    path, pos = segment_path(data, SEG, end)
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(b"\x40\x02\x00\x00" + os.urandom(200))  # a size field, then noise
    await _check_reopened(data, results, bodies, keep=len(results))


# ============================================================================ consume queues
def _cq_file(data, topic: str, qid: int) -> Path:
    (f,) = sorted((Path(data) / "consumequeue" / topic / str(qid)).glob("*.cq"))
    return f


async def _check_queues_rebuilt(data, results, bodies) -> None:
    await _check_reopened(data, results, bodies, keep=len(results))
    s = await _open(data)
    try:
        for t, n in TOPICS.items():
            for q in range(n):
                want = [r for r in results if r.topic == t and r.queue_id == q]
                assert s.max_offset(t, q) == len(read_queue(s, t, q)) > want[-1].queue_offset
        # pop sees every message exactly once
        popped = [p.message.body for t in TOPICS for p in await s.pop("g", t, max_messages=1000)]
        assert len(popped) == len(set(popped)) == len(results) + 4 * len(TOPICS)
    finally:
        await s.close()


@pytest.mark.parametrize("keep_entries", [0, 10, 10.5, -1], ids=["empty", "10", "10.5", "all-but-one"])
async def test_truncated_consume_queue_is_rebuilt(tmp_path, keep_entries):
    data, results, bodies = await _make(tmp_path, crashed=False)
    f = _cq_file(data, "c0", 1)
    n = f.stat().st_size // 28
    os.truncate(f, int((n - 1 if keep_entries == -1 else keep_entries) * 28))
    await _check_queues_rebuilt(data, results, bodies)


async def test_deleted_consume_queue_dir_is_rebuilt(tmp_path):
    data, results, bodies = await _make(tmp_path, crashed=False)
    shutil.rmtree(Path(data) / "consumequeue" / "c0")
    await _check_queues_rebuilt(data, results, bodies)


async def test_deleted_consume_queues_after_crash_are_rebuilt(tmp_path):
    data, results, bodies = await _make(tmp_path, crashed=True)
    shutil.rmtree(Path(data) / "consumequeue")
    await _check_queues_rebuilt(data, results, bodies)


# ============================================================================ index
async def test_key_index_survives_retention_then_torn_tail(tmp_path):
    """Retention rewrites the index file; a later recovery that starts inside the written range
    (damaged tail) must still know the keys of every retained message."""
    data = tmp_path / "data"
    s = await _open(data)
    s.create_topic("old", queues=1, retention_ms=1)
    s.create_topic("keep", queues=1)
    for _ in range(70):  # fills the first segment
        await s.append(Message("old", b"o" * 1000))
    keep = [
        await s.append(Message("keep", f"k{i}|".encode() + b"k" * 1000, keys=(f"k-{i}",))) for i in range(150)
    ]
    assert await s.apply_retention(now=now_ms() + 1000) == 1
    keep += [
        await s.append(Message("keep", f"k{i}|".encode() + b"k" * 1000, keys=(f"k-{i}",)))
        for i in range(150, 153)
    ]
    low = s.commitlog.min_offset
    retained = [r for r in keep if r.commitlog_offset >= low]
    assert len(retained) > 60 and retained[0].commitlog_offset // SEG < keep[-1].commitlog_offset // SEG
    await s.close()
    victim = keep[-1]
    path, pos = segment_path(data, SEG, victim.commitlog_offset)
    with open(path, "r+b") as f:
        f.seek(pos + victim.size - 1)
        f.write(b"\xff")
    s = await _open(data)
    try:
        missing = [i for i, r in enumerate(retained[:-1]) if not s.get_by_key(f"k-{keep.index(r)}")]
        assert not missing, f"get_by_key lost {len(missing)} of {len(retained) - 1} retained keys"
        assert all(s.get_by_id(r.message_id) for r in retained[:-1])
        assert s.get_by_key(f"k-{len(keep) - 1}") == []
    finally:
        await s.close()


# ============================================================================ consumer ops log
def _ops_log(data) -> Path:
    (f,) = sorted((Path(data) / "consumers").glob("ops.*.log"))
    return f


# Layout of the log written below: NAME (11 bytes), 12 x POP (39), 6 x ACK (17).
NAME, POP, ACK = 11, 39, 17
FULL = NAME + 12 * POP + 6 * ACK


@pytest.mark.parametrize(
    "cut",
    [FULL, FULL - ACK, FULL - 1, FULL - 9, FULL - 6 * ACK - 5, NAME + 3 * POP + 20, 5],
    ids=["intact", "record-boundary", "last-ack-1", "last-ack-9", "last-pop", "mid-pop", "name"],
)
async def test_torn_consumer_ops_log(tmp_path, cut):
    data = tmp_path / "data"
    s = await _open(data, consumer_log_flush_ms=QUIET)
    s.create_topic("t", queues=1)
    for i in range(12):
        await s.append(Message("t", f"{i}".encode()))
    popped = await s.pop("g", "t", max_messages=12, invisible_time_ms=600_000)
    assert [p.message.queue_offset for p in popped] == list(range(12))
    for p in popped[:6]:
        s.ack(p.receipt_handle)
    await crash_copy(s, tmp_path / "crash1")
    await s.close()

    log = _ops_log(tmp_path / "crash1")
    assert log.stat().st_size == FULL, "test setup: unexpected operations log layout"
    os.truncate(log, cut)
    n_pops = max(0, min(12, (cut - NAME) // POP)) if cut >= NAME else 0
    n_acks = max(0, (cut - NAME - 12 * POP) // ACK) if n_pops == 12 else 0

    s = await _open(tmp_path / "crash1", consumer_log_flush_ms=QUIET)
    assert s.inflight_count("g", "t") == n_pops - n_acks
    assert s.backlog("g", "t") == 12 - n_acks
    for p in popped[:n_acks]:
        with pytest.raises(InvalidReceiptHandle):
            s.ack(p.receipt_handle)
    # more progress after the recovery, then another crash: it must not be lost
    survivors = popped[n_acks:n_pops]
    for p in survivors[:3]:
        s.ack(p.receipt_handle)
    fresh = await s.pop("g", "t", max_messages=12, invisible_time_ms=600_000)
    assert sorted(p.message.queue_offset for p in fresh) == list(range(n_pops, 12))
    for p in fresh:
        s.ack(p.receipt_handle)
    await crash_copy(s, tmp_path / "crash2")
    await s.close()

    s = await _open(tmp_path / "crash2")
    try:
        done = n_acks + len(survivors[:3]) + len(fresh)
        assert s.backlog("g", "t") == 12 - done, "progress logged after recovering a torn log was lost"
        assert s.inflight_count("g", "t") == 12 - done
        for p in survivors[:3] + fresh:
            with pytest.raises(InvalidReceiptHandle):
                s.ack(p.receipt_handle)
        assert await s.pop("g", "t", max_messages=12) == []
    finally:
        await s.close()


async def test_consumer_progress_survives_crash_without_snapshot(tmp_path):
    """Progress only in the operations log (no snapshot since): pops, acks, changes, commits."""
    data = tmp_path / "data"
    s = await _open(data)
    s.create_topic("t", queues=2)
    for i in range(10):
        await s.append(Message("t", f"{i}".encode()))
    popped = await s.pop("g", "t", max_messages=10, invisible_time_ms=600_000)
    for p in popped[:4]:
        s.ack(p.receipt_handle)
    h = s.change_invisible_time(popped[4].receipt_handle, 0)
    s.commit_offset("c", "t", 1, 3)
    await crash_copy(s, tmp_path / "crash")
    await s.close()
    s = await _open(tmp_path / "crash")
    try:
        assert s.committed_offset("c", "t", 1) == 3
        assert s.inflight_count("g", "t") == 6 and s.backlog("g", "t") == 6
        (again,) = await s.pop("g", "t", max_messages=10)
        assert again.message.body == popped[4].message.body and again.reconsume_times == 1
        with pytest.raises(InvalidReceiptHandle):
            s.ack(h)
        for p in popped[5:]:
            s.ack(p.receipt_handle)  # handles issued before the crash still work
        s.ack(again.receipt_handle)
        assert s.backlog("g", "t") == 0
    finally:
        await s.close()


# ============================================================================ progress past a lost tail
@pytest.mark.parametrize("crashed", [False, True], ids=["closed", "crashed"])
async def test_progress_past_a_lost_tail_is_cut_back(tmp_path, crashed):
    """Consumers read records once written, before their fsync, so a machine crash can lose
    records a group has already taken and acked. New records then take those queue offsets:
    the group must be handed them, not skip them. (The cut-back survives a later crash too.)"""
    data = tmp_path / "data"
    s = await _open(data)
    s.create_topic("p", queues=1)
    olds = [await s.append(Message("p", f"old-{i}".encode())) for i in range(10)]
    popped = await s.pop("g", "p", max_messages=10, invisible_time_ms=600_000)
    assert len(popped) == 10
    for p in popped[:8]:
        s.ack(p.receipt_handle)  # 8 acked, 2 still in flight: all past the cut below
    if crashed:
        await crash_copy(s, tmp_path / "crashed")
        data = tmp_path / "crashed"
    else:
        await flush_progress(s)
    await s.close()
    path, pos = segment_path(data, SEG, olds[6].commitlog_offset)
    os.truncate(path, pos)  # records 6..9 never reached the disk

    s = await _open(data)
    try:
        assert s.max_offset("p", 0) == 6 and s.backlog("g", "p") == 0
        news = [await s.append(Message("p", f"new-{i}".encode())) for i in range(3)]
        assert [r.queue_offset for r in news] == [6, 7, 8]
        got = await s.pop("g", "p", max_messages=10, invisible_time_ms=600_000)
        assert [p.message.body for p in got] == [b"new-0", b"new-1", b"new-2"]
        s.ack(got[0].receipt_handle)
        await crash_copy(s, tmp_path / "again")
    finally:
        await s.close()
    s = await _open(tmp_path / "again")
    try:
        assert s.backlog("g", "p") == 2 and s.inflight_count("g", "p") == 2
    finally:
        await s.close()
