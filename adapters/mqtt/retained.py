"""Retained messages: the records of one compacted store topic, `%MQTT_RETAINED%`, keyed by full
topic path (the store's compaction key of a record without message keys is its `mqtt.topic`).

A retained PUBLISH appends its path's record (body: the payload; properties: the stored MQTT
properties) before the PUBACK; an empty one appends a tombstone (an empty body), which clears the
path, as MQTT's empty retained payload does. Compaction (store/compaction.py) drops older records
of a path in the background, so the topic holds about one record per retained path. On SUBSCRIBE the
latest records matching the filter are read back (exact path: `latest`; a wildcard filter: every
path's `latest_items`, matched with `topic_matches`), expired ones left out.

Earlier versions kept them in the processor's key-value table, namespace `mqtt.retained` (value:
JSON of the properties, a newline, the payload): `start` moves what is left there into the topic,
then deletes it from the table; an interrupted move is re-done at the next start (latest wins)."""

from __future__ import annotations

import json
import time

from messaging_processor import Message, MessagingProcessor

from .codec import topic_matches
from .mapping import P_TOPIC, expired, store_topic

RETAINED_TOPIC = "%MQTT_RETAINED%"
RETAINED_NS = "mqtt.retained"  # the key-value namespace of earlier versions (migrated by `start`)
MIGRATE_BATCH = 256  # retained messages moved per append (and kv delete)


def decode_kv_retained(value: bytes) -> tuple[dict[str, str], bytes]:
    """(properties, payload) of a retained value as earlier versions kept it in the key-value table."""
    head, _, body = value.partition(b"\n")
    return json.loads(head), body


def retained_record(path: str, payload: bytes, properties: dict[str, str]) -> Message:
    """The record of `path` in the retained topic (an empty payload: the tombstone clearing it)."""
    return Message(RETAINED_TOPIC, payload, properties={**properties, P_TOPIC: path})


class Retained:
    """The retained messages of every path (a compacted topic shared by all proxies)."""

    def __init__(self, processor: MessagingProcessor, max_messages: int = 0, max_bytes: int = 0) -> None:
        self.processor = processor
        self.max_messages = max_messages  # 0: no cap
        self.max_bytes = max_bytes  # payload bytes, 0: no cap
        # with a cap: payload size per retained path (read at start; this proxy's view in a cluster)
        self.sizes: dict[str, int] | None = {} if max_messages or max_bytes else None
        self.total_bytes = 0
        self._ready = False  # the compacted topic is known to exist

    async def _ensure_topic(self) -> None:
        # (a read of a missing `%` topic would create it, not compacted: create it first)
        if not self._ready:
            await self.processor.send_internal(RETAINED_TOPIC, [], compacted=True)
            self._ready = True

    async def start(self) -> None:
        """Create the retained topic if missing, move retained messages still in the key-value
        table into it, and with a cap count the retained messages kept by earlier runs."""
        await self._ensure_topic()
        await self.migrate()
        if self.sizes is not None:
            for m in await self.processor.latest_items(RETAINED_TOPIC):
                path = m.properties.get(P_TOPIC)
                if path is not None:
                    self.sizes[path] = len(m.body)
                    self.total_bytes += len(m.body)

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
        clearing a path always does)."""
        sizes = self.sizes
        if sizes is None or not msg.body:
            return True
        old = sizes.get(msg.properties[P_TOPIC])
        if old is None and self.max_messages and len(sizes) >= self.max_messages:
            return False
        grown = self.total_bytes + len(msg.body) - (old or 0)
        return not (self.max_bytes and grown > self.max_bytes)

    async def keep(self, msg: Message) -> None:
        """Make `msg` its path's retained message, or clear the path's one if `msg` is empty;
        durable on return."""
        path = msg.properties[P_TOPIC]
        await self._ensure_topic()
        await self.processor.send_internal(RETAINED_TOPIC, [retained_record(path, msg.body, msg.properties)])
        if self.sizes is not None:
            self.total_bytes -= self.sizes.pop(path, 0)
            if msg.body:
                self.sizes[path] = len(msg.body)
                self.total_bytes += len(msg.body)

    async def matching(self, filt: str) -> list[tuple[str, Message]]:
        """(path, message) of the unexpired retained messages whose path matches `filt` (each
        message's topic is its path's store topic, as when it was published)."""
        await self._ensure_topic()
        p = self.processor
        now = int(time.time() * 1000)
        if "+" in filt or "#" in filt:
            records = [
                m
                for m in await p.latest_items(RETAINED_TOPIC)
                if topic_matches(filt, m.properties.get(P_TOPIC, ""))
            ]
        else:
            m = await p.latest(RETAINED_TOPIC, filt)
            records = [] if m is None else [m]
        out = []
        for m in records:
            if not expired(m.properties, now):
                path = m.properties[P_TOPIC]
                out.append((path, Message(store_topic(path), m.body, properties=m.properties)))
        return out
