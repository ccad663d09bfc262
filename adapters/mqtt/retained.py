"""Retained messages: one per full topic path in the processor's key-value table, namespace
`mqtt.retained` (value: JSON of the stored properties, a newline, the payload).

A retained PUBLISH replaces the path's value before the PUBACK; an empty one deletes it. On
SUBSCRIBE the values matching the filter are read back (exact path: one get; a wildcard filter:
a scan of the key prefix before its first wildcard), expired ones left out."""

from __future__ import annotations

import json
import time

from messaging_processor import Message, MessagingProcessor

from .codec import topic_matches
from .mapping import P_TOPIC, expired, store_topic

RETAINED_NS = "mqtt.retained"


def encode_retained(msg: Message) -> bytes:
    """Value of a retained message: JSON of the stored properties, a newline, the payload."""
    return json.dumps(msg.properties, separators=(",", ":")).encode() + b"\n" + msg.body


def decode_retained(path: str, value: bytes) -> Message:
    head, _, body = value.partition(b"\n")
    return Message(store_topic(path), body, properties=json.loads(head))


class Retained:
    """The retained messages of every path (stored in `processor.kv`, shared by all proxies)."""

    def __init__(self, processor: MessagingProcessor, max_messages: int = 0, max_bytes: int = 0) -> None:
        self.processor = processor
        self.max_messages = max_messages  # 0: no cap
        self.max_bytes = max_bytes  # payload bytes, 0: no cap
        # with a cap: payload size per retained path (read at start; this proxy's view in a cluster)
        self.sizes: dict[str, int] | None = {} if max_messages or max_bytes else None
        self.total_bytes = 0

    async def start(self) -> None:
        """With a cap: count the retained messages kept by earlier runs."""
        if self.sizes is not None:
            for key, value in await self.processor.kv_scan(RETAINED_NS):
                self.sizes[key] = n = len(value) - value.index(b"\n") - 1
                self.total_bytes += n

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
        """Make `msg` its path's retained message, or clear the path's one if `msg` is empty."""
        path = msg.properties[P_TOPIC]
        if msg.body:
            await self.processor.kv_put(RETAINED_NS, path, encode_retained(msg))
        else:
            await self.processor.kv_delete(RETAINED_NS, path)
        if self.sizes is not None:
            self.total_bytes -= self.sizes.pop(path, 0)
            if msg.body:
                self.sizes[path] = len(msg.body)
                self.total_bytes += len(msg.body)

    async def matching(self, filt: str) -> list[tuple[str, Message]]:
        """(path, message) of the unexpired retained messages whose path matches `filt`."""
        levels = filt.split("/")
        prefix_levels = []
        for lv in levels:
            if lv in ("+", "#"):
                break
            prefix_levels.append(lv)
        p = self.processor
        now = int(time.time() * 1000)
        if len(prefix_levels) == len(levels):
            value = await p.kv_get(RETAINED_NS, filt)
            if value is None:
                return []
            m = decode_retained(filt, value)
            return [] if expired(m.properties, now) else [(filt, m)]
        prefix = "/".join(prefix_levels) + "/" if prefix_levels else ""
        if levels[len(prefix_levels)] == "#" and prefix:
            prefix = prefix[:-1]  # "a/#" also matches "a"
        out = []
        for key, value in await p.kv_scan(RETAINED_NS, prefix):
            if topic_matches(filt, key):
                m = decode_retained(key, value)
                if not expired(m.properties, now):
                    out.append((key, m))
        return out
