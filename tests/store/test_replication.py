"""Commit log replication primitives: a primary's log copied chunk by chunk into a replica gives a
byte-identical log and the same queues, reads and lookups; bad chunks are refused without a trace;
truncation (and re-application, from the same or a new primary) converges; everything survives a
reopen and a crash; the epoch log and its divergence rule."""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from store import Message, MessageType, Store, StoreError, codec
from store.epochs import EpochLog, divergence
from store.replication import CorruptChunk, parse_chunk
from tests.store.support import crash_copy, open_store, read_queue, segment_files, wait_until

SEG = 64 * 1024
pytestmark = pytest.mark.timeout(60)


# ----------------------------------------------------------------------------- helpers
async def populate(store: Store, n: int, seed: int, prefix: str = "m") -> None:
    """`n` appends of mixed sizes, topics, queues, tags and keys (batches and single appends),
    plus a delayed and a transactional message (held in %SCHEDULE% / %HALF%)."""
    rng = random.Random(seed)
    if "wide" not in {t.name for t in store.topics()}:
        store.create_topic("wide", queues=8)
    batch: list[Message] = []
    for i in range(n):
        size = rng.choice((0, 10, 300, 1500, 4000)) if rng.random() < 0.85 else rng.randint(8000, 30000)
        topic = rng.choice(("orders", "events", "wide"))
        msg = Message(
            topic,
            bytes([i % 251]) * size,
            tag=rng.choice(("", "a", "b")),
            keys=(f"{prefix}-{i}",) if i % 3 else (f"{prefix}-{i}", f"{prefix}-shared"),
            properties={"i": str(i)} if i % 2 else {},
            message_group=f"g{i % 5}" if topic == "events" and i % 4 == 0 else "",
            queue_id=7 if topic == "wide" and i % 10 == 0 else -1,
        )
        batch.append(msg)
        if len(batch) == 10 or i == n - 1:
            if rng.random() < 0.5:
                await store.append_many(batch)
            else:
                for m in batch:
                    await store.append(m)
            batch = []
    later = int(time.time() * 1000) + 3_600_000
    await store.append(Message("orders", b"later", deliver_at=later, keys=(f"{prefix}-delayed",)))
    await store.append(Message("orders", b"half", msg_type=MessageType.TRANSACTION, keys=(f"{prefix}-half",)))


async def replicate(primary: Store, replica: Store, max_bytes: int, until: int | None = None) -> list[bytes]:
    """Copy chunks until the replica reaches `until` (default: the primary's log end); returns them."""
    target = primary.log_end if until is None else until
    chunks = []
    while replica.log_end < target:
        start = replica.log_end
        chunk = primary.read_log_chunk(start, max_bytes)
        assert chunk, f"no chunk at {start} before {target}"
        assert await replica.apply_log_chunk(start, chunk) == start + len(chunk) == replica.log_end
        chunks.append(chunk)
    return chunks


def log_files(store: Store) -> dict[str, bytes]:
    """Each commit log segment's bytes below the log end, by file name."""
    end = store.log_end
    out = {}
    for path in segment_files(store.config.data_dir):
        base = int(path.name)
        if base < end:
            out[path.name] = path.read_bytes()[: min(SEG, end - base)]
    return out


def queue_state(store: Store) -> dict[tuple[str, int], list[tuple[int, int, int, int]]]:
    """Every queue's entries (topics with at least one message)."""
    out = {}
    for t in store.topics():
        for q in range(t.queues):
            hi = store.max_offset(t.name, q)
            if hi:
                out[(t.name, q)] = list(store.queue_entries(t.name, q, 0, hi, hi)[1])
    return out


def assert_same(primary: Store, replica: Store) -> None:
    assert replica.log_end == primary.log_end
    assert log_files(replica) == log_files(primary)
    assert queue_state(replica) == queue_state(primary)
    for t in primary.topics():
        for q in range(t.queues):
            if primary.max_offset(t.name, q):
                assert replica.max_offset(t.name, q) == primary.max_offset(t.name, q)
                msgs = read_queue(primary, t.name, q)
                assert read_queue(replica, t.name, q) == msgs
                for m in msgs:
                    assert replica.get_by_id(m.message_id) == primary.get_by_id(m.message_id)
                    for k in m.keys:
                        assert replica.get_by_key(k) == primary.get_by_key(k)


@pytest.fixture
async def pair(make_store, tmp_path):
    """(primary, replica), stores on their own data directories."""

    async def factory(**kw):
        p = await make_store(data_dir=str(tmp_path / "primary"), **kw)
        r = await make_store(data_dir=str(tmp_path / "replica"), **kw)
        return p, r

    return factory


# ----------------------------------------------------------------------------- copying
@pytest.mark.parametrize("flush", ["sync", "async"])
async def test_replica_copies_primary_chunk_by_chunk(pair, flush):
    primary, replica = await pair(flush=flush)
    await populate(primary, 300, seed=1)
    assert primary.log_end > 4 * SEG  # records cross several segments
    chunks = await replicate(primary, replica, max_bytes=6000)
    assert len(chunks) > 50
    assert_same(primary, replica)
    # system topics are indexed as recovery would: same %SCHEDULE% / %HALF% queues
    assert queue_state(replica)[("%SCHEDULE%", 0)] == queue_state(primary)[("%SCHEDULE%", 0)]
    assert replica.get_by_key("m-half")[0].topic == "%HALF%"
    # a record's queue id beyond the default queue count made the topic wide enough
    assert replica.queue_count("wide") == 8 and replica.max_offset("wide", 7) > 0


async def test_chunks_are_whole_records_within_a_segment(pair):
    primary, replica = await pair()
    await populate(primary, 150, seed=2)
    chunks = await replicate(primary, replica, max_bytes=5000)
    start, padded = 0, 0
    for chunk in chunks:
        records = parse_chunk(chunk, start, SEG)  # whole, valid records (raises otherwise)
        seg_end = start - start % SEG + SEG
        assert start + len(chunk) <= seg_end  # never crosses a segment end
        assert len(chunk) <= 5000 or len(records) == 1 or len(records) == 0
        if _ends_with_padding(chunk):
            assert start + len(chunk) == seg_end
            padded += 1
        start += len(chunk)
    assert padded >= 2
    # a padding record alone: the chunk that starts there ends at the segment end
    pad_start = next(s for s, c in _starts(chunks) if c[8] == codec.MAGIC_BLANK)
    assert pad_start + len(primary.read_log_chunk(pad_start, 1)) == pad_start - pad_start % SEG + SEG
    # not a record boundary, beyond the end, or at the end
    with pytest.raises(ValueError):
        primary.read_log_chunk(3, 5000)
    with pytest.raises(ValueError):
        primary.read_log_chunk(primary.log_end + 1, 5000)
    assert primary.read_log_chunk(primary.log_end, 5000) == b""
    # at least one record even when it is larger than max_bytes
    big = await primary.append(Message("orders", b"z" * 20000))
    assert len(primary.read_log_chunk(big.commitlog_offset, 100)) == big.size


def _starts(chunks: list[bytes]):
    start = 0
    for c in chunks:
        yield start, c
        start += len(c)


def _ends_with_padding(chunk: bytes) -> bool:
    pos = 0
    magic = None
    while pos + codec.MIN_RECORD <= len(chunk):
        size = codec.record_size_at(chunk, pos)
        magic = chunk[pos + 8]
        pos += size
    return magic == codec.MAGIC_BLANK


async def test_zero_tail_of_a_segment_travels_as_its_own_chunk(pair):
    """A gap too small for a padding record (fewer than 10 bytes) is zeros, copied as they are."""
    primary, replica = await pair()
    await primary.append(Message("orders", b"a" * 1000))
    mid = "0" * 32
    overhead = len(codec.encode(Message("orders", b""), 0, 0, 0, mid, 0))
    left = SEG - primary.log_end
    await primary.append(Message("orders", b"f" * (left - 5 - overhead), message_id=mid, queue_id=0))
    assert primary.log_end == SEG - 5
    await primary.append(Message("orders", b"next", queue_id=0))
    assert primary.read_log_chunk(SEG - 5, 1000) == bytes(5)
    await replicate(primary, replica, max_bytes=1000)
    assert_same(primary, replica)


async def test_pop_and_ack_on_the_replica(pair):
    primary, replica = await pair()
    await populate(primary, 60, seed=3)
    await replicate(primary, replica, max_bytes=8000)
    total = sum(primary.max_offset("orders", q) for q in range(primary.queue_count("orders")))
    popped = await replica.pop("g", "orders", max_messages=total + 5, invisible_time_ms=60_000)
    assert len(popped) == total
    by_offset = {m.commitlog_offset: m for q in range(4) for m in read_queue(primary, "orders", q)}
    for p in popped:
        assert p.message.body == by_offset[p.message.commitlog_offset].body
        replica.ack(p.receipt_handle)
    assert replica.backlog("g", "orders") == 0
    assert primary.backlog("g", "orders") == total  # the primary's consumers are its own


async def test_long_poll_on_the_replica_wakes_on_apply(pair):
    import asyncio

    primary, replica = await pair()
    replica.create_topic("orders")
    waiting = asyncio.ensure_future(replica.pop("g", "orders", wait_ms=5000))
    await primary.append(Message("orders", b"hello", queue_id=0))
    assert await wait_until(lambda: replica._waiters.get("orders"))  # the pop is parked
    t0 = time.monotonic()
    await replicate(primary, replica, max_bytes=1000)
    popped = await waiting
    assert [p.message.body for p in popped] == [b"hello"]
    assert time.monotonic() - t0 < 2


# ----------------------------------------------------------------------------- refusals
async def test_apply_at_a_wrong_start_raises(pair):
    primary, replica = await pair()
    await populate(primary, 20, seed=4)
    await replicate(primary, replica, max_bytes=4000, until=3000)
    end = replica.log_end
    chunk = primary.read_log_chunk(end, 4000)
    for wrong in (0, end - 1, end + 1):
        with pytest.raises(ValueError, match="log ends at"):
            await replica.apply_log_chunk(wrong, chunk)
    assert replica.log_end == end
    await replica.apply_log_chunk(end, chunk)


async def test_corrupt_chunk_is_refused_and_leaves_the_replica_unchanged(pair):
    primary, replica = await pair()
    await populate(primary, 80, seed=5)
    await replicate(primary, replica, max_bytes=6000, until=2 * SEG)
    end = replica.log_end
    chunk = primary.read_log_chunk(end, 6000)
    replica.commitlog.settle()  # the next segment, preallocated in the background, is in the listing
    before = (
        log_files(replica),
        queue_state(replica),
        os.listdir(os.path.join(replica.config.data_dir, "commitlog")),
    )
    for pos in (0, 2, 5, 9, 40, len(chunk) // 2, len(chunk) - 1):  # size, CRC, magic, header, body
        bad = bytearray(chunk)
        bad[pos] ^= 0x41
        with pytest.raises(CorruptChunk):
            await replica.apply_log_chunk(end, bytes(bad))
        after = (
            log_files(replica),
            queue_state(replica),
            os.listdir(os.path.join(replica.config.data_dir, "commitlog")),
        )
        assert after == before
        assert replica.log_end == end
    with pytest.raises(CorruptChunk):  # cut mid-record
        await replica.apply_log_chunk(end, chunk[:-1])
    # the same chunk again (a retry after a lost answer): its queue offsets are taken already
    assert parse_chunk(chunk, end, SEG)
    await replica.apply_log_chunk(end, chunk)
    with pytest.raises(CorruptChunk, match="offset"):
        await replica.apply_log_chunk(end + len(chunk), chunk)
    assert replica.log_end == end + len(chunk)
    await replicate(primary, replica, max_bytes=6000)
    assert_same(primary, replica)


# ----------------------------------------------------------------------------- truncation
async def _boundary_in_segment(store: Store, segment: int) -> int:
    """A record's commit log offset in the middle of a segment."""
    offs = sorted(e[0] for entries in queue_state(store).values() for e in entries)
    return next(o for o in offs if o > segment * SEG + SEG // 2)


async def test_truncate_then_reapply_converges(pair):
    primary, replica = await pair()
    await populate(primary, 250, seed=6)
    await replicate(primary, replica, max_bytes=7000)
    cut = await _boundary_in_segment(replica, 1)
    gone = [
        m for t, q in queue_state(replica) for m in read_queue(replica, t, q) if m.commitlog_offset >= cut
    ]
    kept_before = {k: [e for e in v if e[0] < cut] for k, v in queue_state(replica).items()}
    await replica.truncate_log(cut)
    assert replica.log_end == cut
    assert {k: v for k, v in queue_state(replica).items()} == {k: v for k, v in kept_before.items() if v}
    assert [p.name for p in segment_files(replica.config.data_dir)] == [f"{0:020d}", f"{SEG:020d}"]
    data = (segment_files(replica.config.data_dir)[1]).read_bytes()
    assert data[cut - SEG :] == bytes(2 * SEG - cut)  # the rest of the segment is zeroed
    for m in gone:
        assert all(x.commitlog_offset < cut for x in replica.get_by_id(m.message_id))
    with pytest.raises(ValueError):  # not a record boundary
        await replica.truncate_log(cut - 1)
    with pytest.raises(ValueError):  # past the end
        await replica.truncate_log(cut + 1)
    await replicate(primary, replica, max_bytes=7000)
    assert_same(primary, replica)


async def test_truncate_to_a_new_primarys_history(pair, make_store, tmp_path):
    """A replica rejoins after a failover: it holds records the new primary never got; it cuts them
    (found by the epoch rule) and copies the new primary's different records in their place."""
    old, replica = await pair()
    await populate(old, 200, seed=7, prefix="old")
    old.epochs.start(1, 0)
    replica.epochs.start(1, 0)
    await replicate(old, replica, max_bytes=6000)
    # the new primary had replicated less of the old one, then was elected (epoch 2) and took writes
    new = await make_store(data_dir=str(tmp_path / "new"))
    new.epochs.start(1, 0)
    await replicate(old, new, max_bytes=6000, until=SEG + 1)
    new.epochs.start(2, new.log_end)
    promoted_at = new.log_end
    await populate(new, 120, seed=8, prefix="new")
    agree = divergence(replica.epochs.entries, new.epochs.entries, replica.log_end, new.log_end)
    assert agree == promoted_at < replica.log_end
    await replica.truncate_log(agree)
    assert replica.epochs.entries == [(1, 0)]
    replica.epochs.start(2, promoted_at)
    await replicate(new, replica, max_bytes=6000)
    assert_same(new, replica)
    assert replica.get_by_key("new-5") and replica.get_by_key("old-199") == []
    assert replica.epochs.entries == new.epochs.entries


async def test_truncate_after_a_different_chunk_was_applied(pair, make_store, tmp_path):
    """The same offsets, other bytes: a chunk of another primary applied, cut, then the right one."""
    primary, replica = await pair()
    other = await make_store(data_dir=str(tmp_path / "other"))
    await primary.append(Message("orders", b"common", queue_id=0))
    await replicate(primary, other, max_bytes=100_000)  # the two share their first record
    await primary.append(Message("orders", b"primary's", queue_id=1, keys=("p",)))
    await other.append(Message("orders", b"other's, longer", queue_id=1, keys=("o",)))
    await other.append(Message("events", b"only there", keys=("o2",)))
    await replicate(other, replica, max_bytes=100_000)
    fork = replica.get_by_key("o")[0].commitlog_offset
    assert fork == primary.get_by_key("p")[0].commitlog_offset
    await replica.truncate_log(fork)
    assert replica.get_by_key("o") == replica.get_by_key("o2") == []
    assert replica.max_offset("orders", 1) == 0 and replica.max_offset("events", 0) == 0
    await replicate(primary, replica, max_bytes=100_000)
    assert_same(primary, replica)


# ----------------------------------------------------------------------------- reopen and crash
async def test_reopen_after_apply_and_after_truncate(pair, tmp_path):
    primary, replica = await pair()
    await populate(primary, 200, seed=9)
    await replicate(primary, replica, max_bytes=5000)
    rdir = replica.config.data_dir
    await crash_copy(replica, tmp_path / "crashed")  # no checkpoint since the last apply
    crashed = await open_store(data_dir=str(tmp_path / "crashed"))
    try:
        assert_same(primary, crashed)
    finally:
        await crashed.close()
    await replica.close()
    replica = await open_store(data_dir=rdir)
    try:
        assert_same(primary, replica)
        cut = await _boundary_in_segment(replica, 2)
        await replica.truncate_log(cut)
        state = (replica.log_end, log_files(replica), queue_state(replica))
        await crash_copy(replica, tmp_path / "crashed2")
        crashed = await open_store(data_dir=str(tmp_path / "crashed2"))
        try:
            assert (crashed.log_end, log_files(crashed), queue_state(crashed)) == state
        finally:
            await crashed.close()
    finally:
        await replica.close()
    replica = await open_store(data_dir=rdir)
    try:
        assert (replica.log_end, log_files(replica), queue_state(replica)) == state
        await replicate(primary, replica, max_bytes=5000)
        assert_same(primary, replica)
    finally:
        await replica.close()


# ----------------------------------------------------------------------------- epochs
def test_epoch_log_persists(tmp_path):
    log = EpochLog(str(tmp_path))
    assert log.entries == [] and log.current is None
    log.start(1, 0)
    log.start(2, 500)
    log.start(4, 500)  # an epoch with no records of its own
    log.start(5, 900)
    with pytest.raises(ValueError):
        log.start(5, 1000)  # the epoch does not increase
    with pytest.raises(ValueError):
        log.start(6, 800)  # before the last start
    reopened = EpochLog(str(tmp_path))
    assert reopened.entries == [(1, 0), (2, 500), (4, 500), (5, 900)]
    assert reopened.current == (5, 900)
    assert [reopened.end_offset_of(e, 1200) for e in (1, 2, 4, 5)] == [500, 500, 900, 1200]
    with pytest.raises(KeyError):
        reopened.end_offset_of(3, 1200)
    reopened.truncate_from(600)
    assert EpochLog(str(tmp_path)).entries == [(1, 0), (2, 500), (4, 500)]
    reopened.truncate_from(500)
    assert EpochLog(str(tmp_path)).entries == [(1, 0)]
    assert json.loads((tmp_path / "epochs.json").read_text()) == {"epochs": [[1, 0]]}
    assert not (tmp_path / "epochs.json.tmp").exists()


def test_divergence():
    # same history: all of the shorter log
    assert divergence([(1, 0), (2, 100)], [(1, 0), (2, 100)], 300, 300) == 300
    assert divergence([(1, 0), (2, 100)], [(1, 0), (2, 100)], 250, 300) == 250
    # the replica went on in epoch 1 after the new primary (epoch 2 from 300) had stopped copying
    assert divergence([(1, 0)], [(1, 0), (2, 300)], 500, 800) == 300
    # the replica is behind: all of it agrees
    assert divergence([(1, 0), (2, 300)], [(1, 0), (2, 300), (3, 600)], 400, 900) == 400
    assert divergence([(1, 0)], [(1, 0), (2, 300), (3, 600)], 200, 900) == 200
    # the replica is ahead of the primary in the same epoch
    assert divergence([(1, 0), (3, 100)], [(1, 0), (3, 100)], 700, 400) == 400
    # an epoch the other never saw lies between: the last common one decides
    assert divergence([(1, 0), (2, 100), (4, 200)], [(1, 0), (3, 150)], 900, 900) == 100
    # no common epoch (or the same number from another start): nothing agrees
    assert divergence([(2, 0)], [(1, 0)], 500, 500) == 0
    assert divergence([(1, 50)], [(1, 0)], 500, 500) == 0
    assert divergence([], [(1, 0)], 0, 500) == 0


# ----------------------------------------------------------------------------- lost disk
FAR = 10 * 24 * 3600 * 1000  # ms: retention applied this far in the future deletes every old segment


def assert_same_retained(primary: Store, replica: Store) -> None:
    """Same log end and start, same bytes in every segment both hold (below the log end), and every
    queue of the primary with the same min and max offsets and messages on the replica."""
    assert replica.log_end == primary.log_end
    assert replica.log_start == primary.log_start
    mine, theirs = log_files(replica), log_files(primary)
    common = mine.keys() & theirs.keys()
    assert common and min(common) == f"{primary.log_start:020d}"
    assert {k: mine[k] for k in common} == {k: theirs[k] for k in common}
    for t in primary.topics():
        for q in range(t.queues):
            lo, hi = primary.min_offset(t.name, q), primary.max_offset(t.name, q)
            assert (replica.min_offset(t.name, q), replica.max_offset(t.name, q)) == (lo, hi), (t.name, q)
            msgs = read_queue(primary, t.name, q)
            assert read_queue(replica, t.name, q) == msgs
            for m in msgs[:: max(len(msgs) // 5, 1)]:
                assert replica.get_by_id(m.message_id) == primary.get_by_id(m.message_id)


async def _primary_after_retention(primary: Store) -> int:
    """Fill `primary` over several segments, a topic `old` only at first (its entries all go), and
    delete its first segments; returns its log start."""
    primary.create_topic("old", queues=2)
    for i in range(6):
        await primary.append(Message("old", b"o" * 500, queue_id=i % 2))
    await populate(primary, 300, seed=21)
    assert await primary.apply_retention(now=int(time.time() * 1000) + FAR) > 0
    start = primary.log_start
    assert start > 0 and start % SEG == 0
    assert primary.min_offset("old", 0) == primary.max_offset("old", 0) == 3  # nothing left of it
    assert any(primary.min_offset(t.name, q) > 0 for t in primary.topics() for q in range(t.queues))
    return start


async def test_empty_replica_rebases_at_the_primarys_log_start(pair, tmp_path):
    primary, replica = await pair()
    start = await _primary_after_retention(primary)
    with pytest.raises(KeyError):  # what a new replica would ask for first is gone
        primary.read_log_chunk(0, 5000)
    with pytest.raises(ValueError):
        await replica.reset_empty_log(start + 100)  # not a segment base
    await replica.reset_empty_log(start, primary.queue_bases(start))
    assert replica.log_end == replica.log_start == start
    assert replica.max_offset("old", 1) == 3  # queues whose entries all went start where they ended
    await replicate(primary, replica, max_bytes=5000)
    assert_same_retained(primary, replica)
    # later appends, to queues new and old, are copied as usual (their offsets follow on)
    await primary.append(Message("old", b"back", queue_id=1))
    await populate(primary, 50, seed=22, prefix="n")
    await replicate(primary, replica, max_bytes=7000)
    assert_same_retained(primary, replica)
    assert read_queue(replica, "old", 1)[0].queue_offset == 3
    # a crash right now, and a clean reopen, come back the same
    await crash_copy(replica, tmp_path / "crashed")
    crashed = await open_store(data_dir=str(tmp_path / "crashed"))
    try:
        assert_same_retained(primary, crashed)
    finally:
        await crashed.close()
    rdir = replica.config.data_dir
    await replica.close()
    replica = await open_store(data_dir=rdir)
    try:
        assert_same_retained(primary, replica)
        await populate(primary, 30, seed=23, prefix="r")
        await replicate(primary, replica, max_bytes=5000)
        assert_same_retained(primary, replica)
    finally:
        await replica.close()


async def test_reset_then_reopen_before_any_record(pair, tmp_path):
    primary, replica = await pair()
    start = await _primary_after_retention(primary)
    replica.preallocate()  # as a server does: an empty segment 0 is there
    await replica.reset_empty_log(start, primary.queue_bases(start))
    rdir = replica.config.data_dir
    await crash_copy(replica, tmp_path / "crashed")
    await replica.close()
    for d in (rdir, str(tmp_path / "crashed")):
        reopened = await open_store(data_dir=d)
        try:
            assert reopened.log_end == reopened.log_start == start
            assert [p.name for p in segment_files(d)] == [f"{start:020d}"]
            assert reopened.max_offset("old", 0) == 3
            await replicate(primary, reopened, max_bytes=6000)
            assert_same_retained(primary, reopened)
        finally:
            await reopened.close()


async def test_reset_refuses_a_store_that_holds_records(pair):
    _primary, replica = await pair()
    await populate(replica, 5, seed=3)
    state = (replica.log_start, replica.log_end, log_files(replica), queue_state(replica))
    with pytest.raises(StoreError, match="holds records"):
        await replica.reset_empty_log(4 * SEG)
    assert (replica.log_start, replica.log_end, log_files(replica), queue_state(replica)) == state


async def test_replica_deletes_segments_below_the_primarys_start(pair):
    primary, replica = await pair()
    await populate(primary, 300, seed=31)
    await replicate(primary, replica, max_bytes=8000)
    before = replica.log_start
    assert await primary.apply_retention(now=int(time.time() * 1000) + FAR) > 0
    start = primary.log_start
    assert await replica.delete_log_before(start) == (start - before) // SEG
    assert_same_retained(primary, replica)
    assert await replica.delete_log_before(start) == 0  # nothing more below it
    await populate(primary, 30, seed=32, prefix="x")
    await replicate(primary, replica, max_bytes=8000)
    assert_same_retained(primary, replica)
