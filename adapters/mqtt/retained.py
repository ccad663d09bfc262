"""Retained messages: the records of one compacted store topic, `%MQTT_RETAINED%`, keyed by full
topic path (the store's compaction key of a record without message keys is its `mqtt.topic`).

A retained PUBLISH appends its path's record (body: the payload; properties: the stored MQTT
properties) before the PUBACK; an empty one appends a tombstone (an empty body), which clears the
path, as MQTT's empty retained payload does. Compaction (store/compaction.py) drops older records
of a path in the background, so the topic holds about one record per retained path. On SUBSCRIBE the
latest records matching the filter are read back: the filter walks the index of retained paths
(retained_index.py: path -> queue and offset, built at start from the topic and brought up to date
with the records appended since, by this proxy or any other, before each use), and only the records
it finds are read, by position (runs of consecutive offsets in one read); expired ones are left out
unread. So a `dev/+/state` subscriber costs the retained messages it gets, not all of them.

Earlier versions kept them in the processor's key-value table, namespace `mqtt.retained` (value:
JSON of the properties, a newline, the payload): `start` moves what is left there into the topic,
then deletes it from the table; an interrupted move is re-done at the next start (latest wins)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from messaging_processor import (
    ClientContext,
    ErrorKind,
    Identity,
    Message,
    MessagingProcessor,
    ProcessorError,
)

from .mapping import P_EXPIRY_AT, P_TOPIC, store_topic
from .retained_index import EXPIRY_AT, OFFSET, QUEUE, SIZE, Entry, RetainedIndex, entry

RETAINED_TOPIC = "%MQTT_RETAINED%"
RETAINED_NS = "mqtt.retained"  # the key-value namespace of earlier versions (migrated by `start`)
MIGRATE_BATCH = 256  # retained messages moved per append (and kv delete)
CATCH_UP_BATCH = 1024  # records read at a time when bringing the index up to date
FOLLOW_S = 0.5  # how often the index reads what was appended since (so a first use finds little)
# reads of the retained topic are the proxy's own (the same identity as broker.PROXY_IDENTITY)
log = logging.getLogger("adapters.mqtt")
_CTX = ClientContext("mqtt", client_id="$mqtt-retained", identity=Identity("$mqtt-proxy", None, "internal"))


def decode_kv_retained(value: bytes) -> tuple[dict[str, str], bytes]:
    """(properties, payload) of a retained value as earlier versions kept it in the key-value table."""
    head, _, body = value.partition(b"\n")
    return json.loads(head), body


def retained_record(path: str, payload: bytes, properties: dict[str, str]) -> Message:
    """The record of `path` in the retained topic (an empty payload: the tombstone clearing it)."""
    return Message(RETAINED_TOPIC, payload, properties={**properties, P_TOPIC: path})


class Retained:
    """The retained messages of every path (a compacted topic shared by all proxies), indexed."""

    def __init__(self, processor: MessagingProcessor, max_messages: int = 0, max_bytes: int = 0) -> None:
        self.processor = processor
        self.max_messages = max_messages  # 0: no cap
        self.max_bytes = max_bytes  # payload bytes, 0: no cap
        self.index = RetainedIndex()
        self.positions: dict[int, int] = {}  # queue -> next offset the index has not seen
        self._lock = asyncio.Lock()  # one catch-up at a time
        self._ready = False  # the compacted topic is known to exist
        self._follower: asyncio.Task[None] | None = None

    @property
    def total_bytes(self) -> int:
        """Payload bytes of every retained message (as of the index's last catch-up)."""
        return self.index.total_bytes

    async def _ensure_topic(self) -> None:
        # (a read of a missing `%` topic would create it, not compacted: create it first)
        if not self._ready:
            await self.processor.send_internal(RETAINED_TOPIC, [], compacted=True)
            self._ready = True

    async def start(self) -> None:
        """Create the retained topic if missing, move retained messages still in the key-value
        table into it, and index the retained messages kept by earlier runs."""
        await self._ensure_topic()
        await self.migrate()
        await self.catch_up()
        self._follower = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        """Tail the topic: index what this proxy or another appended, every FOLLOW_S, so that a
        subscription after a burst of retained writes does not index the burst itself."""
        while True:
            await asyncio.sleep(FOLLOW_S)
            try:
                await self.catch_up()
            except Exception as e:  # noqa: BLE001 - the next use (or round) catches up again
                log.debug("mqtt retained index: catch-up failed: %s", e)

    async def close(self) -> None:
        """Stop tailing the topic."""
        t, self._follower = self._follower, None
        if t is not None:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def catch_up(self) -> int:
        """Index the records appended to the retained topic since the last catch-up (by any
        proxy); the number of records read."""
        p = self.processor
        index = self.index
        positions = self.positions
        read = 0
        async with self._lock:
            while True:  # (one tail reads every queue: one store round trip through a worker)
                try:
                    msgs = await p.tail(_CTX, RETAINED_TOPIC, positions, CATCH_UP_BATCH, group=None)
                except ProcessorError as e:
                    if e.kind is ErrorKind.TOPIC_NOT_FOUND:
                        return read
                    raise
                for m in msgs:
                    path = m.properties.get(P_TOPIC)
                    if path is not None:
                        index.apply(path, _entry(m.queue_id, m))
                    positions[m.queue_id] = m.queue_offset + 1
                read += len(msgs)
                if len(msgs) < CATCH_UP_BATCH:
                    break
        return read

    async def migrate(self) -> int:
        """Append the retained messages of the key-value namespace `mqtt.retained` to the retained
        topic, then delete them from the table (batch by batch); the number moved."""
        p = self.processor
        items = await p.kv_scan(RETAINED_NS)
        for i in range(0, len(items), MIGRATE_BATCH):
            batch = items[i : i + MIGRATE_BATCH]
            records = []
            for path, value in batch:
                properties, payload = decode_kv_retained(value)
                records.append(retained_record(path, payload, properties))
            await p.send_internal(RETAINED_TOPIC, records, compacted=True)
            await p.kv_put_many(RETAINED_NS, dict.fromkeys((path for path, _ in batch), None))
        return len(items)

    def admits(self, msg: Message) -> bool:
        """Whether keeping `msg` stays within the caps (a replacement counts its size change only;
        clearing a path always does). Counts what the index knows: every proxy's retained messages
        as of its last catch-up."""
        if not (self.max_messages or self.max_bytes) or not msg.body:
            return True
        index = self.index
        old = index.get(msg.properties[P_TOPIC])
        if old is None and self.max_messages and len(index) >= self.max_messages:
            return False
        grown = index.total_bytes + len(msg.body) - (old[SIZE] if old is not None else 0)
        return not (self.max_bytes and grown > self.max_bytes)

    async def keep(self, msg: Message) -> None:
        """Make `msg` its path's retained message, or clear the path's one if `msg` is empty;
        durable on return (and indexed when there are caps to count it against)."""
        path = msg.properties[P_TOPIC]
        await self._ensure_topic()
        await self.processor.send_internal(RETAINED_TOPIC, [retained_record(path, msg.body, msg.properties)])
        if self.max_messages or self.max_bytes:
            await self.catch_up()

    async def matching(self, filt: str) -> list[tuple[str, Message]]:
        """(path, message) of the unexpired retained messages whose path matches `filt`, by path
        (each message's topic is its path's store topic, as when it was published). Reads the
        records appended since the last call, then only the matching ones."""
        await self._ensure_topic()
        await self.catch_up()
        now = int(time.time() * 1000)
        found = sorted(
            (e[QUEUE], e[OFFSET], path)
            for path, e in self.index.match(filt)
            if not (e[EXPIRY_AT] and e[EXPIRY_AT] <= now)
        )
        by_path: dict[str, Message] = {}
        p = self.processor
        i, n = 0, len(found)
        while i < n:  # one read per run of consecutive offsets of a queue
            q, first, _ = found[i]
            j = i + 1
            while j < n and found[j][0] == q and found[j][1] == first + (j - i):
                j += 1
            wanted = {off: path for _q, off, path in found[i:j]}
            for m in await p.read(_CTX, RETAINED_TOPIC, q, first, first + (j - i), j - i):
                path = wanted.get(m.queue_offset)
                if path is not None and m.body and m.properties.get(P_TOPIC) == path:
                    by_path[path] = m
            i = j
        out = sorted(by_path.items())
        for path, m in out:  # (records read for this call only: given their path's store topic)
            m.topic = store_topic(path)
        return out


def _entry(queue: int, m: Message) -> Entry:
    """The index entry of a record read from the retained topic."""
    exp = m.properties.get(P_EXPIRY_AT)
    return entry(queue, m.queue_offset, len(m.body), m.store_timestamp, int(exp) if exp else 0)
