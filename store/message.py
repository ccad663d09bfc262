"""The store's message model: one class for what producers hand in and what consumers get back."""

from __future__ import annotations

import enum
import time
import zlib
from dataclasses import dataclass, field
from typing import NamedTuple


class MessageType(enum.IntEnum):
    NORMAL = 0
    FIFO = 1
    DELAY = 2
    TRANSACTION = 3


@dataclass(slots=True)
class Message:
    """A message as stored. Producers fill the first group of fields; the store fills the rest."""

    topic: str
    body: bytes = b""
    tag: str = ""
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    message_group: str = ""
    deliver_at: int = 0  # epoch ms; 0 = deliver now
    message_id: str = ""  # assigned by the store when empty
    born_timestamp: int = 0  # epoch ms; the store uses its clock when 0
    born_host: str = ""
    queue_id: int = -1  # -1: the store picks a queue
    msg_type: MessageType = MessageType.NORMAL
    # Filled by the store:
    store_timestamp: int = 0
    store_host: str = ""
    queue_offset: int = -1
    commitlog_offset: int = -1
    size: int = 0
    reconsume_times: int = 0
    # Not stored: the key whose messages keep their order (one queue), set above the store at send
    # (messaging_processor/ordering.py); "" = none (round robin). A message group outranks it.
    order_key: str = ""


class AppendResult(NamedTuple):
    """Where an appended message landed. For a delayed or half message, `topic` is the real topic."""

    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    store_timestamp: int


@dataclass(slots=True)
class PoppedMessage:
    """A message handed out by `pop`, with the receipt handle that acks it."""

    message: Message
    receipt_handle: str
    invisible_until: int  # epoch ms

    @property
    def reconsume_times(self) -> int:
        return self.message.reconsume_times


def tag_hash(tag: str) -> int:
    """Stable hash of a tag as kept in consume queue entries (0 = no tag)."""
    return zlib.crc32(tag.encode()) + 1 if tag else 0


# The record property that holds a message's path (the MQTT-style `a/b/c`). Its name is part of the
# record format (records on disk carry it); messaging_processor/properties.py is its home above the
# store (`P_PATH`). The store reads a path for entry hashes and compaction keys, never for a queue.
PATH_PROPERTY = "mqtt.topic"
PATH_HASH_BIT = 1 << 62  # set in every path hash, never in a tag hash (at most 2**32)


def path_hash(path: str) -> int:
    """Stable 62-bit hash of a message's path as kept in the consume queue entry of an untagged
    message: the marker bit, crc32 and adler32 (30 bits) of the UTF-8 path. It stays below 2**63,
    so entries still read as signed 64-bit integers (the read API's numpy arrays)."""
    b = path.encode()
    return PATH_HASH_BIT | zlib.crc32(b) << 30 | zlib.adler32(b) & 0x3FFFFFFF


def entry_hash(msg: Message) -> int:
    """A message's consume queue hash: its tag's, else its path's (`mqtt.topic`), else 0."""
    if msg.tag:
        return tag_hash(msg.tag)
    path = msg.properties.get(PATH_PROPERTY) if msg.properties else None
    return path_hash(path) if path else 0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def copy_with(msg: Message, **changes: object) -> Message:
    """A copy of `msg`'s producer fields with some changed (dataclasses.replace is slower)."""
    m = Message(
        msg.topic,
        msg.body,
        msg.tag,
        msg.keys,
        msg.properties,
        msg.message_group,
        msg.deliver_at,
        msg.message_id,
        msg.born_timestamp,
        msg.born_host,
        msg.queue_id,
        msg.msg_type,
    )
    m.order_key = msg.order_key
    for k, v in changes.items():
        setattr(m, k, v)
    return m
