"""Child process for test_features.test_store_full_when_a_segment_cannot_be_created.

Usage: fsize_writer.py DATA_DIR

Opens a store with 64 KiB segments, appends a few messages, then sets RLIMIT_FSIZE just below the
segment size (SIGXFSZ ignored, so writes fail with EFBIG): the current segment fills up and the
next one cannot be created. Prints "A <tag>" per append that returned, "FULL <sequential refusals>
<refused of a concurrent batch>", "ERR <repr>" for any other error, lifts the limit, appends
again and prints "CLOSED" after a clean close.
"""

from __future__ import annotations

import asyncio
import resource
import signal
import sys

from store import Message, Store, StoreConfig, StoreFullError

SEG = 64 * 1024


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def msg(tag: str) -> Message:
    return Message("full", tag.encode() + b"|" + b"p" * 700)


async def append_coro(store: Store, m: Message):
    return await store.append(m)  # errors raised at call time land in the gather results


async def append(store: Store, tag: str) -> None:
    await store.append(msg(tag))
    out(f"A {tag}")


async def main(data_dir: str) -> None:
    store = await Store.open(
        StoreConfig(
            data_dir=data_dir,
            segment_size=SEG,
            default_queues=2,
            checkpoint_interval_ms=3_600_000,
            retention_check_interval_ms=3_600_000,
        )
    )
    store.create_topic("full", queues=2)
    for i in range(5):
        await append(store, f"pre-{i}")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (SEG - 1, hard))
    refused = 0
    for i in range(1000):
        try:
            await append(store, f"full-{i}")
        except StoreFullError:
            refused += 1
            if refused == 3:
                break
        except Exception as e:  # noqa: BLE001 - reported to the parent
            out(f"ERR {e!r}")
            break
    batch = await asyncio.gather(
        *[append_coro(store, msg(f"batch-{i}")) for i in range(8)], return_exceptions=True
    )
    batch_refused = 0
    for i, r in enumerate(batch):
        if isinstance(r, StoreFullError):
            batch_refused += 1
        elif isinstance(r, BaseException):
            out(f"ERR {r!r}")
        else:
            out(f"A batch-{i}")
    out(f"FULL {refused} {batch_refused}")
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    for i in range(60):
        try:
            await append(store, f"after-{i}")
        except Exception as e:  # noqa: BLE001
            out(f"ERR {e!r}")
            break
    await store.close()
    out("CLOSED")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
