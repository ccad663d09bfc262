"""Commit log record format: encode a Message to bytes and back (pure functions, no I/O).

Layout (little endian), see docs/store.md:

    u32 total_size | u32 crc32(of bytes 8..total_size) | u8 magic | u8 msg_type | u16 flags
    i32 queue_id | i64 queue_offset | i64 store_ts | i64 born_ts | i64 deliver_at
    u16 len(topic) u16 len(tag) u16 len(keys) u16 len(group) u16 len(msg_id) u16 len(born_host)
    u32 len(properties) u32 len(body)
    topic tag keys group msg_id born_host properties body

`keys` are joined by U+001F; properties are one compact JSON object of strings (flag 0x0001;
records written before it hold (u16 key length, key, u32 value length, value) pairs, still read).
A blank record (magic BLANK) fills the end of a segment that the next record does not fit in.

A batch record (magic BATCH) holds several message records of one queue, back to back, each a whole
record as above (its own size and CRC, consecutive queue offsets), behind an 12-byte header:

    u32 total_size | u32 crc32(of bytes 8..total_size) | u8 magic | u8 0 | u16 count

Consume queue and index entries point at the inner records, so a reader needs nothing new: only
the code that walks the log record by record (`iter_batch`) looks inside.

`encode`, `decode`, `check` and `decode_checked` are compiled (`_codec_speedups.pyx`, built by `uv
sync` where there is a C compiler) unless `GATEWAY_PURE_PYTHON=1`; this module chooses, once, at
import, for the whole store (appending.py takes the compiled append loop only with it).
The pure-Python functions stay the reference (`py_encode`, ...): the compiled ones give the same
bytes and results, and the tests check both.
"""

from __future__ import annotations

import os
import struct
import zlib
from types import ModuleType

import orjson

from .message import Message, MessageType

MAGIC_MESSAGE = 0xA5
MAGIC_BLANK = 0xB1
MAGIC_BATCH = 0xA7
BATCH_HEAD = struct.Struct("<IIBBH")
BATCH_HEADER_SIZE = BATCH_HEAD.size  # 12
PREFIX = struct.Struct("<II")
HEAD = struct.Struct("<BBHiqqqqHHHHHHII")
HEADER_SIZE = PREFIX.size + HEAD.size
MIN_RECORD = PREFIX.size + 2  # smallest thing a reader can recognise (a blank record)
KEY_SEP = "\x1f"
_H = struct.Struct("<H")
_I = struct.Struct("<I")
_QUEUE_FIELDS = struct.Struct("<iq")  # queue_id, queue_offset, at offset 12 of a record
FLAG_JSON_PROPERTIES = 0x0001  # the property block is a JSON object (every record written since it came)
_dumps = orjson.dumps
_loads = orjson.loads


class CorruptRecord(ValueError):
    """A record whose length or checksum does not hold."""


def decode_properties(buf: bytes | memoryview, flags: int) -> dict[str, str]:
    """The properties of a block; `flags` are the record's (without FLAG_JSON_PROPERTIES: the
    block predates it and holds (u16 length, name, u32 length, value) pairs)."""
    if flags & FLAG_JSON_PROPERTIES:
        return _loads(buf) if buf else {}
    return _decode_pairs(buf)


def _decode_pairs(buf: bytes | memoryview) -> dict[str, str]:
    props: dict[str, str] = {}
    pos, end = 0, len(buf)
    while pos < end:
        (kl,) = _H.unpack_from(buf, pos)
        pos += 2
        k = bytes(buf[pos : pos + kl]).decode()
        pos += kl
        (vl,) = _I.unpack_from(buf, pos)
        pos += 4
        props[k] = bytes(buf[pos : pos + vl]).decode()
        pos += vl
    return props


def encode(
    msg: Message,
    queue_id: int,
    queue_offset: int,
    store_ts: int,
    message_id: str,
    born_ts: int,
    flags: int = 0,
) -> bytes:
    """Encode one message record; the caller supplies its id, birth time and where it lands."""
    topic = msg.topic.encode()
    tag = msg.tag  # the optional fields are mostly empty: skip their encode calls
    tag = tag.encode() if tag else b""
    keys = KEY_SEP.join(msg.keys).encode() if msg.keys else b""
    group = msg.message_group
    group = group.encode() if group else b""
    mid = message_id.encode()
    host = msg.born_host
    host = host.encode() if host else b""
    props = b""
    if msg.properties:
        try:
            props = _dumps(msg.properties)
        except TypeError as e:  # orjson.JSONEncodeError: a lone surrogate (not UTF-8), a non-string
            raise ValueError(f"properties cannot be stored: {e}") from None
        flags |= FLAG_JSON_PROPERTIES
    body = msg.body
    payload = b"".join(
        (
            HEAD.pack(
                MAGIC_MESSAGE,
                msg.msg_type,
                flags,
                queue_id,
                queue_offset,
                store_ts,
                born_ts,
                msg.deliver_at,
                len(topic),
                len(tag),
                len(keys),
                len(group),
                len(mid),
                len(host),
                len(props),
                len(body),
            ),
            topic,
            tag,
            keys,
            group,
            mid,
            host,
            props,
            body,
        )
    )
    return PREFIX.pack(len(payload) + 8, zlib.crc32(payload)) + payload


def encode_blank(size: int) -> bytes:
    """A filler record of exactly `size` bytes (size >= MIN_RECORD)."""
    payload = bytes((MAGIC_BLANK,)) + bytes(size - 9)
    return PREFIX.pack(size, zlib.crc32(payload)) + payload


def encode_batch_head(inner: bytes, count: int) -> bytes:
    """The header of a batch record whose inner records, concatenated, are `inner`."""
    head = bytes((MAGIC_BATCH, 0)) + _H.pack(count)
    return PREFIX.pack(len(inner) + BATCH_HEADER_SIZE, zlib.crc32(inner, zlib.crc32(head))) + head


def iter_batch(buf: bytes | memoryview, pos: int, size: int) -> list[tuple[int, int]]:
    """(position, size) of each inner record of the (checked) batch record at `pos`; CorruptRecord
    when an inner record does not hold or they do not fill the batch exactly."""
    out: list[tuple[int, int]] = []
    p, end = pos + BATCH_HEADER_SIZE, pos + size
    while p < end:
        n, magic = check(buf, p, end)
        if magic != MAGIC_MESSAGE:
            raise CorruptRecord("a batch holds a record that is not a message")
        out.append((p, n))
        p += n
    (count,) = _H.unpack_from(buf, pos + 10)
    if len(out) != count:
        raise CorruptRecord(f"batch says {count} records, holds {len(out)}")
    return out


def record_size_at(buf: bytes | memoryview, pos: int) -> int:
    return _I.unpack_from(buf, pos)[0]


def check(buf: bytes | memoryview, pos: int, limit: int) -> tuple[int, int]:
    """Validate the record at `pos`; return (size, magic). Raise CorruptRecord when it does not hold."""
    if limit - pos < MIN_RECORD:
        raise CorruptRecord("short")
    size, crc = PREFIX.unpack_from(buf, pos)
    if size < MIN_RECORD or pos + size > limit:
        raise CorruptRecord(f"bad size {size}")
    if zlib.crc32(buf[pos + 8 : pos + size]) != crc:
        raise CorruptRecord("crc mismatch")
    magic = buf[pos + 8]
    if magic == MAGIC_BLANK:
        return size, magic
    if magic == MAGIC_BATCH:
        if size < BATCH_HEADER_SIZE + HEADER_SIZE:
            raise CorruptRecord(f"batch of {size} bytes")
        return size, magic
    if magic != MAGIC_MESSAGE or size < HEADER_SIZE:
        raise CorruptRecord(f"bad magic {magic}")
    return size, magic


def queue_fields(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(queue_id, queue_offset) of the record at pos, without decoding the rest."""
    return _QUEUE_FIELDS.unpack_from(buf, pos + 12)


def decode_checked(buf: bytes | memoryview, commitlog_offset: int) -> Message:
    """`check`, then `decode`, the one record `buf` holds (CorruptRecord when it does not hold)."""
    check(buf, 0, len(buf))
    return decode(buf, 0, commitlog_offset)


def decode(buf: bytes | memoryview, pos: int = 0, commitlog_offset: int = -1) -> Message:
    """Decode the message record at `pos` (already length- and CRC-checked, or trusted)."""
    (size,) = _I.unpack_from(buf, pos)
    (_magic, mtype, flags, qid, qoff, store_ts, born_ts, deliver_at, lt, lg, lk, lgr, lm, lh, lp, lb) = (
        HEAD.unpack_from(buf, pos + 8)
    )
    p = pos + HEADER_SIZE
    raw = bytes(buf[p : pos + size])
    o = lt
    topic = raw[:o].decode()
    tag = raw[o : o + lg].decode() if lg else ""  # the optional fields are mostly empty
    o += lg
    keys = tuple(raw[o : o + lk].decode().split(KEY_SEP)) if lk else ()
    o += lk
    group = raw[o : o + lgr].decode() if lgr else ""
    o += lgr
    mid = raw[o : o + lm].decode()
    o += lm
    host = raw[o : o + lh].decode() if lh else ""
    o += lh
    props = decode_properties(raw[o : o + lp], flags) if lp else {}
    o += lp
    # positional, in field order (see Message): cheaper than keywords on this hot path
    return Message(
        topic,
        raw[o : o + lb],
        tag,
        keys,
        props,
        group,
        deliver_at,
        mid,
        born_ts,
        host,
        qid,
        _MESSAGE_TYPES[mtype] if mtype < len(_MESSAGE_TYPES) else MessageType(mtype),
        store_ts,
        "",
        qoff,
        commitlog_offset,
        size,
    )


_MESSAGE_TYPES = tuple(MessageType)  # by value: 0, 1, 2, 3


PURE_PYTHON_ENV = "GATEWAY_PURE_PYTHON"  # set (and not "0"): the pure-Python functions, compiled or not


def _load_speedups() -> ModuleType | None:
    """The compiled codec (`store._codec_speedups`), or None: disabled by GATEWAY_PURE_PYTHON, or not
    built."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    try:
        from . import _codec_speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _codec_speedups


py_encode, py_decode, py_check, py_decode_checked = encode, decode, check, decode_checked


def bind_speedups(module: ModuleType) -> None:
    """Hand the compiled codec the types and pure functions it returns and falls back to."""
    module.bind_codec(
        Message, CorruptRecord, _MESSAGE_TYPES, py_encode, py_decode, py_check, decode_properties, _dumps
    )


speedups = _load_speedups()  # appending.py follows it: one switch for the whole store
if speedups is not None:
    bind_speedups(speedups)
    encode, decode, check, decode_checked = (  # noqa: F811 - the compiled twins of the above
        speedups.encode,
        speedups.decode,
        speedups.check,
        speedups.decode_checked,
    )
