"""Child process for test_crash.py: append and consume as fast as possible until SIGKILLed.

Usage: crash_writer.py DATA_DIR ROUND [sync|async]

Prints (each line flushed, so the parent sees exactly what returned before the kill):
  READY                     the store is open
  P <tag> <queue> <offset>  an append of message <tag> returned (acknowledged) at that position
  C <tag> <reconsume>       group "cg" popped message <tag>
  A <tag>                   ... and its ack is durable (acked, then the progress log was flushed)
  D <tag> <deliver_at>      an append of delayed message <tag> returned
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys
import time

from store import Message, Store, StoreConfig

TOPIC = "crash"
GROUP = "cg"
PRODUCERS = 16
SEG = 256 * 1024


def body_for(tag: str) -> bytes:
    """A deterministic body whose content can be verified after recovery (100 .. 1600 bytes)."""
    h = hashlib.sha256(tag.encode()).digest()
    n = 100 + int.from_bytes(h[:2], "little") % 1500
    return tag.encode() + b"|" + (h * (n // 32 + 1))[:n]


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def produce(store: Store, rnd: int, worker: int) -> None:
    i = 0
    while True:
        tag = f"{rnd}-{worker}-{i}"
        res = await store.append(Message(TOPIC, body_for(tag), keys=(tag,), tag=f"w{worker % 3}"))
        out(f"P {tag} {res.queue_id} {res.queue_offset}")
        i += 1


async def produce_delayed(store: Store, rnd: int, rng: random.Random) -> None:
    """Delayed messages (due within 400 ms) to the same topic: delivered by the store's timer."""
    i = 0
    while True:
        tag = f"d{rnd}-{i}"
        deliver_at = int(time.time() * 1000) + rng.randint(0, 400)
        await store.append(Message(TOPIC, body_for(tag), keys=(tag,), deliver_at=deliver_at))
        out(f"D {tag} {deliver_at}")
        i += 1
        await asyncio.sleep(rng.uniform(0, 0.01))


async def consume(store: Store, rng: random.Random) -> None:
    while True:
        popped = await store.pop(GROUP, TOPIC, max_messages=16, invisible_time_ms=1500, wait_ms=50)
        acked = []
        for p in popped:
            tag = p.message.body.split(b"|", 1)[0].decode()
            out(f"C {tag} {p.reconsume_times}")
            if rng.random() < 0.8:  # the rest is redelivered later (maybe after a crash)
                store.ack(p.receipt_handle)
                acked.append(tag)
        if acked:
            # the ack is durable now (normally every consumer_log_flush_ms)
            await store._parts.checkpoints.flush_progress()
            for tag in acked:
                out(f"A {tag}")
        await asyncio.sleep(rng.uniform(0, 0.02))


async def main(data_dir: str, rnd: int, flush: str) -> None:
    flush, _, method = flush.partition("-")  # "sync-helper": sync through the fsync helper process
    store = await Store.open(
        StoreConfig(
            data_dir=data_dir,
            flush=flush,
            fsync_method=method or "auto",
            segment_size=SEG,
            default_queues=4,
            checkpoint_interval_ms=100,
            consumer_log_flush_ms=30,
            consumer_checkpoint_ops=500,
            retention_check_interval_ms=3_600_000,
        )
    )
    store.create_topic(TOPIC, queues=4)
    store.create_group(GROUP, max_attempts=1000)
    out("READY")
    rng = random.Random(rnd)
    tasks = [asyncio.create_task(produce(store, rnd, w)) for w in range(PRODUCERS)]
    tasks.append(asyncio.create_task(consume(store, rng)))
    tasks.append(asyncio.create_task(produce_delayed(store, rnd, random.Random(rnd + 1000))))
    deadline = time.monotonic() + 10  # the parent kills us long before; never run away
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        for t in tasks:
            if t.done():
                t.result()  # re-raise a crash of a worker
    out("TIMEOUT")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "sync"))
