"""Commit log record format: encode a Message to bytes and back (pure functions, no I/O).

Layout (little endian), see docs/store.md:

    u32 total_size | u32 crc32(of bytes 8..total_size) | u8 magic | u8 msg_type | u16 flags
    i32 queue_id | i64 queue_offset | i64 store_ts | i64 born_ts | i64 deliver_at
    u16 len(topic) u16 len(tag) u16 len(keys) u16 len(group) u16 len(msg_id) u16 len(born_host)
    u32 len(properties) u32 len(body)
    topic tag keys group msg_id born_host properties body

`keys` are joined by U+001F; properties are (u16 key length, key, u32 value length, value) pairs.
A blank record (magic BLANK) fills the end of a segment that the next record does not fit in.
"""

from __future__ import annotations

import struct
import zlib

from .message import Message, MessageType

MAGIC_MESSAGE = 0xA5
MAGIC_BLANK = 0xB1
PREFIX = struct.Struct("<II")
HEAD = struct.Struct("<BBHiqqqqHHHHHHII")
HEADER_SIZE = PREFIX.size + HEAD.size
MIN_RECORD = PREFIX.size + 2  # smallest thing a reader can recognise (a blank record)
KEY_SEP = "\x1f"
_H = struct.Struct("<H")
_I = struct.Struct("<I")
_QUEUE_FIELDS = struct.Struct("<iq")  # queue_id, queue_offset, at offset 12 of a record


class CorruptRecord(ValueError):
    """A record whose length or checksum does not hold."""


_props_cache: dict[tuple, bytes] = {}  # small property sets repeat (same path, same QoS): encode once


def encode_properties(props: dict[str, str]) -> bytes:
    if not props:
        return b""
    if len(props) <= 4:
        key = tuple(props.items())
        data = _props_cache.get(key)
        if data is None:
            data = _encode_properties(props)
            if len(_props_cache) >= 8192:
                _props_cache.clear()
            _props_cache[key] = data
        return data
    return _encode_properties(props)


_key_cache: dict[str, bytes] = {}  # property names repeat: their length-prefixed bytes, encoded once
# Many property values repeat too (a CloudEvent's source, type and content type; an MQTT topic):
# name -> {value: the encoded pair}. A name whose cache fills up _PAIRS_MAX times (an id, a time)
# stops being cached.
_pairs: dict[str, dict[str, bytes]] = {}
_pair_fills: dict[str, int] = {}
_PAIRS_MAX = 256
_PAIR_FILLS_MAX = 4
_PAIR_VALUE_MAX = 128
_NOT_CACHED: dict[str, bytes] = {}  # the `_pairs` entry of a name that is not cached


def _encode_properties(props: dict[str, str]) -> bytes:
    parts: list[bytes] = []
    add = parts.append
    pairs = _pairs
    for k, v in props.items():
        vals = pairs.get(k)
        if vals is not None:
            pair = vals.get(v)
            if pair is not None:
                add(pair)
                continue
        kp = _key_cache.get(k)
        if kp is None:
            kb = k.encode()
            kp = _H.pack(len(kb)) + kb
            if len(_key_cache) < 4096:
                _key_cache[k] = kp
        vb = v.encode()
        pair = kp + _I.pack(len(vb)) + vb
        add(pair)
        if vals is not _NOT_CACHED and len(v) <= _PAIR_VALUE_MAX:
            _remember_pair(k, v, vals, pair)
    return b"".join(parts)


def _remember_pair(k: str, v: str, vals: dict[str, bytes] | None, pair: bytes) -> None:
    if vals is None:
        if len(_pairs) >= 4096:
            return
        vals = _pairs[k] = {}
    elif len(vals) >= _PAIRS_MAX:
        vals.clear()
        fills = _pair_fills.get(k, 0) + 1
        _pair_fills[k] = fills
        if fills >= _PAIR_FILLS_MAX:  # the values of this name rarely repeat
            _pairs[k] = _NOT_CACHED
            return
    vals[v] = pair


def decode_properties(buf: bytes | memoryview) -> dict[str, str]:
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
    props = encode_properties(msg.properties) if msg.properties else b""
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
    if magic != MAGIC_MESSAGE or size < HEADER_SIZE:
        raise CorruptRecord(f"bad magic {magic}")
    return size, magic


def queue_fields(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(queue_id, queue_offset) of the record at pos, without decoding the rest."""
    return _QUEUE_FIELDS.unpack_from(buf, pos + 12)


def decode(buf: bytes | memoryview, pos: int = 0, commitlog_offset: int = -1) -> Message:
    """Decode the message record at `pos` (already length- and CRC-checked, or trusted)."""
    (size,) = _I.unpack_from(buf, pos)
    (_magic, mtype, _flags, qid, qoff, store_ts, born_ts, deliver_at, lt, lg, lk, lgr, lm, lh, lp, lb) = (
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
    props = _decode_properties_cached(raw[o : o + lp]) if lp else {}
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
_props_decoded: dict[bytes, dict[str, str]] = {}  # small property blocks repeat: decode once


def _decode_properties_cached(data: bytes) -> dict[str, str]:
    """decode_properties, from a cache for small blocks (a copy: callers may change it)."""
    if len(data) > 256:
        return decode_properties(data)
    d = _props_decoded.get(data)
    if d is None:
        d = decode_properties(data)
        if len(_props_decoded) >= 8192:
            _props_decoded.clear()
        _props_decoded[data] = d
    return d.copy()
