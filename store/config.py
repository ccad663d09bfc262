"""Store settings, per-topic and per-group settings, and their SQLite-backed metadata table."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
from dataclasses import asdict, dataclass, field

NAME_RE = re.compile(r"^[%|A-Za-z0-9_.\-]{1,255}$")
SCHEDULE_TOPIC = "%SCHEDULE%"
HALF_TOPIC = "%HALF%"
DLQ_PREFIX = "%DLQ%"
SYSTEM_TIMER_GROUP = "%SYS_TIMER%"
SYSTEM_TXN_GROUP = "%SYS_TXN%"


@dataclass(slots=True)
class RetryPolicy:
    """Back-off for `nack`: initial_ms * multiplier**(attempt-1), capped at max_ms."""

    initial_ms: int = 1000
    multiplier: float = 2.0
    max_ms: int = 60_000

    def delay_ms(self, attempt: int) -> int:
        return int(min(self.initial_ms * self.multiplier ** max(attempt - 1, 0), self.max_ms))


@dataclass(slots=True)
class TopicConfig:
    name: str
    queues: int = 8
    retention_ms: int | None = None  # None: the store default
    retention_bytes: int | None = None  # None: no size limit
    compacted: bool = False  # the latest record per key wins (compaction.py)
    # logic queues (docs/store.md): `queues` take new messages; queues [queues, read_queues) were
    # left out by a shrink and stay readable (sealed) until retention empties them; 0: `queues`
    read_queues: int = 0
    # one [old queue count, [end offset of each old queue]] per change of `queues`: a message
    # group's (or MQTT path's) messages after a change wait for its previous queue (popping.py)
    epochs: list = field(default_factory=list)
    # age limit of this topic's records once their segment is tiered (tiering.py); None: retention_ms
    tier_retention_ms: int | None = None

    def keep_ms(self, default_ms: int, tiered: bool) -> int:
        """How old a record of this topic may get (retention.py): in a tiered segment
        `tier_retention_ms` when set, else `retention_ms`, else the store's `default_ms`."""
        if tiered and self.tier_retention_ms is not None:
            return self.tier_retention_ms
        return self.retention_ms if self.retention_ms is not None else default_ms

    @property
    def readable(self) -> int:
        """Queues that may hold messages: the writable ones plus the sealed ones."""
        return max(self.queues, self.read_queues)

    @classmethod
    def from_dict(cls, d: dict) -> TopicConfig:
        """From `asdict` of this or another version (meta.db, a replica group's state): fields this
        version does not know are left out, so a newer node's settings do not stop an older one."""
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(slots=True)
class GroupConfig:
    name: str
    max_attempts: int = 16
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass(slots=True)
class StoreConfig:
    data_dir: str = "./data"
    flush: str = "sync"  # "sync": append returns after fsync; "async": after write, fsync every interval
    flush_interval_ms: int = 200
    # how `sync` fdatasyncs: "aio" (Linux native AIO, completion on an eventfd), "helper" (a helper
    # process behind a pipe) or "auto" (aio where the kernel supports it, else helper)
    fsync_method: str = "auto"
    segment_size: int = 128 * 1024 * 1024
    default_queues: int = 8
    # consume queue files held open at most (openfiles.py): idle queues hold no descriptor
    max_open_queue_files: int = 1024
    auto_create_topics: bool = True
    max_message_size: int = 4 * 1024 * 1024
    retention_ms: int = 72 * 3600 * 1000
    retention_check_interval_ms: int = 60_000
    min_free_bytes: int = 0
    # disk low-watermark (diskspace.py): client appends are refused while free space is below the
    # smaller of these two when both are set (bytes, fraction of the volume's size); 0 and 0.0: none
    disk_free_limit_bytes: int = 0
    disk_free_limit_ratio: float = 0.0
    checkpoint_interval_ms: int = 1000
    consumer_log_flush_ms: int = 100
    consumer_checkpoint_ops: int = 200_000
    transaction_timeout_ms: int = 6000
    transaction_check_interval_ms: int = 5000
    transaction_max_checks: int = 15
    # compacted topics (compaction.py): how long a tombstone (an empty body) is kept once it is
    # the latest record of its key, and how often compaction runs over closed segments
    tombstone_retention_ms: int = 24 * 3600 * 1000
    compaction_interval_ms: int = 30_000
    # compaction runs in a worker process of its own (False: on the store's IO thread, where its
    # Python code shares the event loop's GIL); at most `compaction_duty` of the time (the rest asleep)
    compaction_process: bool = True
    compaction_duty: float = 1.0
    # tiered storage (tiering.py): closed segments go to this S3-compatible endpoint ("": off) and
    # bucket under `tier_prefix`, once their newest record is `tier_after_ms` old or, when
    # `tier_after_bytes` is set (instead), once beyond the newest that many bytes of local segments
    tier_endpoint: str = ""
    tier_bucket: str = ""
    tier_prefix: str = ""
    tier_after_ms: int = 24 * 3600 * 1000
    tier_after_bytes: int | None = None
    tier_cache_bytes: int = 256 * 1024 * 1024  # local cache of tiered blocks read back
    tier_interval_ms: int = 5000  # how often a tiering pass runs
    tier_part_size: int = 8 * 1024 * 1024  # multipart part size (S3: at least 5 MiB but the last)
    tier_timeout_ms: int = 10_000  # read timeout of one object store request (connect: 2 s at most)
    tier_fetch_threads: int = 2  # threads of the tier's GETs of blocks read back (their own pool)
    # cold reads (cold_reads.py): offset reads of tiered data or of data this far behind the log's
    # end take at most `cold_read_chunk_bytes` a step, `cold_read_buffer_bytes` of them at once
    cold_read_lag_bytes: int = 512 * 1024 * 1024
    cold_read_chunk_bytes: int = 256 * 1024
    cold_read_buffer_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        if self.flush not in ("sync", "async"):
            raise ValueError("flush must be 'sync' or 'async'")
        if self.fsync_method not in ("auto", "aio", "helper"):
            raise ValueError("fsync_method must be 'auto', 'aio' or 'helper'")
        if self.disk_free_limit_bytes < 0 or not 0.0 <= self.disk_free_limit_ratio < 1.0:
            raise ValueError("disk_free_limit_bytes must be >= 0 and disk_free_limit_ratio in [0, 1)")
        if self.tier_endpoint and not self.tier_bucket:
            raise ValueError("tier_bucket is required when tier_endpoint is set")
        if self.tier_part_size < 1 or self.tier_interval_ms < 1 or self.tier_timeout_ms < 1:
            raise ValueError("tier_part_size, tier_interval_ms and tier_timeout_ms must be positive")
        if self.tier_fetch_threads < 1 or self.cold_read_chunk_bytes < 1 or self.cold_read_buffer_bytes < 1:
            raise ValueError("tier_fetch_threads and the cold read sizes must be positive")


def check_name(kind: str, name: str) -> None:
    if not NAME_RE.match(name):
        raise ValueError(f"invalid {kind} name {name!r}: 1-255 of letters, digits, % | _ . -")


class Metadata:
    """Topics and groups, kept in SQLite (small, transactional, rarely written).

    Writes made in one turn of the event loop share one transaction, committed (one fsync) at the
    end of the turn: a storm of new persistent sessions, each with its queue topic and consumer
    group, costs one fsync per turn instead of two per device. `durable()` waits for the commit of
    what was written so far; the store's async API (LocalStoreClient) awaits it before a topic or
    group change is answered. Without a running loop a write commits at once."""

    def __init__(self, data_dir: str) -> None:
        self.db = sqlite3.connect(os.path.join(data_dir, "meta.db"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS topics (name TEXT PRIMARY KEY, conf TEXT NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS groups_ (name TEXT PRIMARY KEY, conf TEXT NOT NULL)")
        self._open = False  # a transaction is open, its commit scheduled
        self._committed: asyncio.Future[None] | None = None  # resolved by that commit

    def _write(self, sql: str, args: tuple) -> None:
        if not self._open:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.db.execute(sql, args)  # (no loop: autocommit)
                return
            self.db.execute("BEGIN")
            self._open = True
            loop.call_soon(self.commit)
        self.db.execute(sql, args)

    def commit(self) -> None:
        """Commit the open transaction (if any) and wake those waiting for it."""
        f, self._committed = self._committed, None
        try:
            if self._open:
                self._open = False
                self.db.execute("COMMIT")
        except sqlite3.Error as e:
            if f is not None and not f.done():
                f.set_exception(e)
            raise
        if f is not None and not f.done():
            f.set_result(None)

    async def durable(self) -> None:
        """Return once every write made so far is committed."""
        if not self._open:
            return
        if self._committed is None:
            self._committed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._committed)

    def load_topics(self) -> dict[str, TopicConfig]:
        rows = self.db.execute("SELECT name, conf FROM topics")
        return {n: TopicConfig.from_dict(json.loads(c)) for n, c in rows}

    def load_groups(self) -> dict[str, GroupConfig]:
        out = {}
        for n, c in self.db.execute("SELECT name, conf FROM groups_"):
            d = json.loads(c)
            d["retry"] = RetryPolicy(**d["retry"])
            out[n] = GroupConfig(**d)
        return out

    def save_topic(self, t: TopicConfig) -> None:
        self._write("INSERT OR REPLACE INTO topics VALUES (?, ?)", (t.name, json.dumps(asdict(t))))

    def delete_topic(self, name: str) -> None:
        self._write("DELETE FROM topics WHERE name = ?", (name,))

    def save_group(self, g: GroupConfig) -> None:
        self._write("INSERT OR REPLACE INTO groups_ VALUES (?, ?)", (g.name, json.dumps(asdict(g))))

    def delete_group(self, name: str) -> None:
        self._write("DELETE FROM groups_ WHERE name = ?", (name,))

    def close(self) -> None:
        self.commit()
        self.db.close()
