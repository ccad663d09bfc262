"""Child process of test_compaction's kill -9 test: fills a compacted topic (KEYS keys, ROUNDS
values each, acknowledged before it says FILLED), then compacts over and over, printing COMPACTING
before each pass, until it is killed. With `pause` as third argument, each pass prints SWITCHING
once its new generation is written and waits a second before making it current (a kill then lands
between the two, every time; compaction then runs in this process, where the hook is); without it,
compaction runs in its worker process, which must die with this one."""

from __future__ import annotations

import asyncio
import sys
import time

from store import Message, Store, StoreConfig, compaction

TOPIC = "shadow"
KEYS = 300
ROUNDS = 20
SEG = 256 * 1024


def value(key: int, rnd: int) -> bytes:
    return b"%d:%d:" % (key, rnd) + b"v" * 120


async def main(data_dir: str, fill: bool, in_process: bool) -> None:
    store = await Store.open(
        StoreConfig(
            data_dir=data_dir,
            segment_size=SEG,
            compaction_interval_ms=10**9,
            compaction_process=not in_process,  # (the pause hook below lives in this process)
        )
    )
    if fill:
        store.create_topic(TOPIC, queues=4, compacted=True)
        for rnd in range(ROUNDS):
            await asyncio.gather(
                *(store.append(Message(TOPIC, value(k, rnd), keys=(f"k{k}",))) for k in range(KEYS))
            )
        for _ in range(3):  # close the segment holding the last values
            await store.append(Message("filler", b"f" * (SEG // 3)))
        await store._parts.checkpoints.checkpoint()
        print("FILLED", flush=True)
    while True:
        print("COMPACTING", flush=True)
        await store.compact()
        # more values, so that the next pass has work: the newest stay the last round's + 1000
        await asyncio.gather(
            *(store.append(Message(TOPIC, value(k, ROUNDS + 1000), keys=(f"k{k}",))) for k in range(KEYS))
        )
        for _ in range(3):
            await store.append(Message("filler", b"f" * (SEG // 3)))
        await store._parts.checkpoints.checkpoint()
        print("ROUND", flush=True)


def _pausing(write_current):
    def pause_then_write(directory: str, current: dict) -> None:
        print("SWITCHING", flush=True)
        time.sleep(1)
        write_current(directory, current)

    return pause_then_write


if __name__ == "__main__":
    pause = sys.argv[3:] == ["pause"]
    if pause:
        compaction._write_current = _pausing(compaction._write_current)
    asyncio.run(main(sys.argv[1], sys.argv[2] == "fill", pause))
