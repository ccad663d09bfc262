"""Child process for test_features.test_store_full_when_a_segment_cannot_be_created.

Usage: fsize_writer.py DATA_DIR [sequential|batches]

Opens a store with 64 KiB segments, appends a few messages, then sets RLIMIT_FSIZE just below the
segment size (SIGXFSZ ignored, so writes fail with EFBIG): the current segment fills up and the
next one cannot be created. Prints "A <tag>" per append that returned, "FULL <sequential refusals>
<refused of a concurrent batch>", "ERR <repr>" for any other error, lifts the limit, appends
again and prints "CLOSED" after a clean close. Mode `batches`: appends in concurrent batches of 8
until one is refused, then closes at once (nothing overwrites what the refused batch left behind).
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


async def fill_in_batches(store: Store) -> None:
    """Concurrent batches of 8 until one is refused (it straddles the limit), then close at once."""
    for b in range(200):
        tags = [f"b{b}-{i}" for i in range(8)]
        res = await asyncio.gather(*[append_coro(store, msg(t)) for t in tags], return_exceptions=True)
        for t, r in zip(tags, res, strict=True):
            if not isinstance(r, BaseException):
                out(f"A {t}")
            elif not isinstance(r, StoreFullError):
                out(f"ERR {r!r}")
        if any(isinstance(r, StoreFullError) for r in res):
            out(f"FULL {b}")
            break
    await store.close()
    out("CLOSED")


async def main(data_dir: str, mode: str) -> None:
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
    if mode == "batches":
        await fill_in_batches(store)
        return
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
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "sequential"))
