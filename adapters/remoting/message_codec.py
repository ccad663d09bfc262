"""Message encodings of the remoting protocol (big-endian):

- the stored-message layout of Apache RocketMQ's `MessageDecoder` (pull and pop bodies,
  CHECK_TRANSACTION_STATE and VIEW_MESSAGE_BY_ID bodies): `encode_message`, `decode_message(s)`;
- the batch body producers send (`MessageBatch` encoding): `encode_batch`, `decode_batch`;
- the properties string `key\\x01value\\x02...`: `encode_properties`, `decode_properties`;
- offset message ids (store host + commit log offset, 32 hex digits for IPv4): `offset_msg_id`,
  `decode_offset_msg_id`; client-side unique ids (UNIQ_KEY): `UniqKeyFactory`, `uniq_key_ip`.

Property values cannot contain the separators \\x01 and \\x02; `encode_properties` replaces them
(and drops keys that would be empty) so that the output always parses."""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import os
import random
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from remoting.codes import SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAGIC_V1 = -626843481  # 0xDAA320A7: topic length int8
MAGIC_V2 = -626843477  # 0xDAA320AB: topic length int16
BATCH_MAGIC = 0

# Well-known property keys (MessageConst).
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_START_DELIVER_TIME = "__STARTDELIVERTIME"  # ONS / ali-ons absolute delivery time, ms
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_POP_CK = "POP_CK"
PROPERTY_FIRST_POP_TIME = "1ST_POP_TIME"
KEY_SEPARATOR = " "

_I = struct.Struct(">i")
_H = struct.Struct(">h")
_Q = struct.Struct(">q")
# totalSize, magic, bodyCRC, queueId, flag, queueOffset, physicalOffset, sysFlag, bornTimestamp
_HEAD = struct.Struct(">iiiiiqqiq")
_BATCH_HEAD = struct.Struct(">iiiii")  # totalSize, magic, bodyCRC, flag, bodyLen


class MessageCodecError(ValueError):
    """A message or batch body that does not decode."""


@dataclass(slots=True)
class MessageExt:
    """A message in the stored-message layout (what a 4.x client decodes from a pull)."""

    topic: str
    body: bytes = b""
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    commitlog_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int | None = None  # None: computed on encode
    store_size: int = 0  # filled by decode

    @property
    def offset_msg_id(self) -> str:
        return offset_msg_id(self.store_host[0], self.store_host[1], self.commitlog_offset)

    @property
    def msg_id(self) -> str:
        """What a Java client's getMsgId() returns: UNIQ_KEY when set, else the offset message id."""
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or self.offset_msg_id

    @property
    def tags(self) -> str:
        return self.properties.get(PROPERTY_TAGS, "")

    @property
    def keys(self) -> str:
        return self.properties.get(PROPERTY_KEYS, "")


# ---------------------------------------------------------------------------------------- properties

_SAFE = str.maketrans({NAME_VALUE_SEPARATOR: " ", PROPERTY_SEPARATOR: " "})


def encode_properties(props: dict[str, str]) -> str:
    """`k\\x01v\\x02` for each pair (the string ends with \\x02, as Java writes it)."""
    parts = []
    for k, v in props.items():
        if not k:
            continue
        if NAME_VALUE_SEPARATOR in k or PROPERTY_SEPARATOR in k:
            k = k.translate(_SAFE)
        v = "" if v is None else str(v)
        if NAME_VALUE_SEPARATOR in v or PROPERTY_SEPARATOR in v:
            v = v.translate(_SAFE)
        parts.append(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}")
    return "".join(parts)


def decode_properties(text: str | bytes | None) -> dict[str, str]:
    """Lenient: a trailing separator may be missing, empty items and items without a name are skipped."""
    if not text:
        return {}
    if isinstance(text, bytes | bytearray | memoryview):
        text = bytes(text).decode("utf-8", "replace")
    out: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        if not item:
            continue
        k, sep, v = item.partition(NAME_VALUE_SEPARATOR)
        if sep and k:
            out[k] = v
    return out


# ---------------------------------------------------------------------------------------- hosts and ids


@functools.lru_cache(maxsize=4096)
def _pack_host(host: str, port: int) -> tuple[bytes, bool]:
    """(address bytes + port, is IPv6); a name that is not an IP literal packs as 127.0.0.1."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = ipaddress.IPv4Address("127.0.0.1")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.packed + _I.pack(port), ip.version == 6


def _unpack_host(buf: bytes, pos: int, v6: bool) -> tuple[tuple[str, int], int]:
    n = 16 if v6 else 4
    ip = str(ipaddress.ip_address(buf[pos : pos + n]))
    (port,) = _I.unpack_from(buf, pos + n)
    return (ip, port), pos + n + 4


def offset_msg_id(host: str, port: int, commitlog_offset: int) -> str:
    """Store address + commit log offset, uppercase hex (32 digits for IPv4, 56 for IPv6)."""
    addr, _ = _pack_host(host, port)
    return (addr + _Q.pack(commitlog_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """(host, port, commit log offset) of an offset message id; ValueError if it is not one."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ValueError(f"not an offset message id: {msg_id!r}") from None
    if len(raw) == 16:
        (host, port), pos = _unpack_host(raw, 0, False)
    elif len(raw) == 28:
        (host, port), pos = _unpack_host(raw, 0, True)
    else:
        raise ValueError(f"not an offset message id: {msg_id!r}")
    (offset,) = _Q.unpack_from(raw, pos)
    return host, port, offset


# ---------------------------------------------------------------------------------------- stored layout


def body_crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_message(m: MessageExt) -> bytes:
    """One record of the stored-message layout (MessageDecoder.decode reads it back)."""
    born, born_v6 = _pack_host(*m.born_host)
    store, store_v6 = _pack_host(*m.store_host)
    sys_flag = m.sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    if born_v6:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if store_v6:
        sys_flag |= SYSFLAG_STOREHOST_V6
    topic = m.topic.encode()
    props = encode_properties(m.properties).encode()
    if len(props) > 32767:
        raise MessageCodecError(f"properties of {len(props)} bytes exceed 32767")
    v2 = len(topic) > 127
    if len(topic) > 32767:
        raise MessageCodecError("topic too long")
    body = m.body
    size = (
        _HEAD.size
        + len(born)
        + 8
        + len(store)
        + 4
        + 8
        + 4
        + len(body)
        + (2 if v2 else 1)
        + len(topic)
        + 2
        + len(props)
    )
    crc = body_crc(body) if m.body_crc is None else m.body_crc
    return b"".join(
        (
            _HEAD.pack(
                size,
                MAGIC_V2 if v2 else MAGIC_V1,
                crc,
                m.queue_id,
                m.flag,
                m.queue_offset,
                m.commitlog_offset,
                sys_flag,
                m.born_timestamp,
            ),
            born,
            _Q.pack(m.store_timestamp),
            store,
            _I.pack(m.reconsume_times),
            _Q.pack(m.prepared_transaction_offset),
            _I.pack(len(body)),
            body,
            _H.pack(len(topic)) if v2 else bytes((len(topic),)),
            topic,
            _H.pack(len(props)),
            props,
        )
    )


def decode_message(buf: bytes, pos: int = 0) -> tuple[MessageExt, int]:
    """The record at `pos` and the position after it."""
    try:
        size, magic, crc, qid, flag, qoff, clo, sys_flag, born_ts = _HEAD.unpack_from(buf, pos)
        if magic not in (MAGIC_V1, MAGIC_V2):
            raise MessageCodecError(f"bad magic code {magic:#x} at {pos}")
        if size < _HEAD.size or pos + size > len(buf):
            raise MessageCodecError(f"record size {size} at {pos} exceeds the buffer")
        p = pos + _HEAD.size
        born, p = _unpack_host(buf, p, bool(sys_flag & SYSFLAG_BORNHOST_V6))
        (store_ts,) = _Q.unpack_from(buf, p)
        store, p = _unpack_host(buf, p + 8, bool(sys_flag & SYSFLAG_STOREHOST_V6))
        (reconsume,) = _I.unpack_from(buf, p)
        (prepared,) = _Q.unpack_from(buf, p + 4)
        (bl,) = _I.unpack_from(buf, p + 12)
        p += 16
        body = bytes(buf[p : p + bl])
        p += bl
        if magic == MAGIC_V2:
            (tl,) = _H.unpack_from(buf, p)
            p += 2
        else:
            tl = buf[p]
            p += 1
        topic = bytes(buf[p : p + tl]).decode()
        p += tl
        (pl,) = _H.unpack_from(buf, p)
        p += 2
        props = decode_properties(bytes(buf[p : p + pl]))
        p += pl
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise MessageCodecError(f"truncated or malformed message at {pos}: {e}") from None
    if p != pos + size:
        raise MessageCodecError(f"record at {pos} says {size} bytes but holds {p - pos}")
    m = MessageExt(
        topic,
        body,
        props,
        qid,
        flag,
        qoff,
        clo,
        sys_flag,
        born_ts,
        born,
        store_ts,
        store,
        reconsume,
        prepared,
    )
    m.body_crc = crc
    m.store_size = size
    return m, p


def decode_messages(buf: bytes) -> list[MessageExt]:
    """Records back to back (a pull or pop body)."""
    out = []
    pos = 0
    while pos < len(buf):
        m, pos = decode_message(buf, pos)
        out.append(m)
    return out


# ---------------------------------------------------------------------------------------- batch body


@dataclass(slots=True)
class BatchItem:
    """One message of a batch body: producers encode flag, body and properties only."""

    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0


def encode_batch(items: list[BatchItem]) -> bytes:
    out = []
    for it in items:
        props = encode_properties(it.properties).encode()
        size = _BATCH_HEAD.size + len(it.body) + 2 + len(props)
        out += (_BATCH_HEAD.pack(size, BATCH_MAGIC, 0, it.flag, len(it.body)), it.body)
        out += (_H.pack(len(props)), props)
    return b"".join(out)


def iter_batch(body: bytes) -> Iterator[BatchItem]:
    pos, end = 0, len(body)
    while pos < end:
        try:
            size, _magic, _crc, flag, bl = _BATCH_HEAD.unpack_from(body, pos)
            p = pos + _BATCH_HEAD.size
            if bl < 0 or p + bl + 2 > end:
                raise MessageCodecError(f"batch record at {pos} exceeds the body")
            data = bytes(body[p : p + bl])
            p += bl
            (pl,) = _H.unpack_from(body, p)
            p += 2
            if pl < 0 or p + pl > end:
                raise MessageCodecError(f"batch record properties at {pos} exceed the body")
            props = decode_properties(bytes(body[p : p + pl]))
            p += pl
        except struct.error as e:
            raise MessageCodecError(f"truncated batch record at {pos}: {e}") from None
        # Java writes totalSize = the record's length; trust the parsed length, but an absurd
        # totalSize means the body is not a batch.
        if size != p - pos and (size <= 0 or pos + size > end):
            raise MessageCodecError(f"batch record at {pos} has total size {size}")
        yield BatchItem(data, props, flag)
        pos = p


def decode_batch(body: bytes) -> list[BatchItem]:
    return list(iter_batch(body))


# ---------------------------------------------------------------------------------------- UNIQ_KEY


class UniqKeyFactory:
    """Message ids in the layout of Java's MessageClientIDSetter (what producers put in UNIQ_KEY):
    IPv4 (4 bytes) + pid (2) + a per-process random (4) + ms since the start of the month, UTC (4)
    + counter (2), as 32 uppercase hex digits."""

    def __init__(self, ip: str = "127.0.0.1", pid: int | None = None) -> None:
        addr, _ = _pack_host(ip, 0)
        pid = os.getpid() if pid is None else pid
        self._prefix = (addr[:4] + struct.pack(">HI", pid & 0xFFFF, random.getrandbits(32))).hex().upper()
        self._counter = 0
        self._month_start_ms = 0
        self._next_month_ms = 0

    def _month(self, now_ms: int) -> None:
        t = dt.datetime.fromtimestamp(now_ms / 1000, dt.UTC)
        start = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = (start + dt.timedelta(days=32)).replace(day=1)
        self._month_start_ms = int(start.timestamp() * 1000)
        self._next_month_ms = int(nxt.timestamp() * 1000)

    def next(self, now_ms: int | None = None) -> str:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if not self._month_start_ms <= now < self._next_month_ms:
            self._month(now)
        self._counter = (self._counter + 1) & 0xFFFF
        tail = struct.pack(">IH", (now - self._month_start_ms) & 0xFFFFFFFF, self._counter)
        return self._prefix + tail.hex().upper()


def uniq_key_ip(key: str) -> str | None:
    """The producer IPv4 address a 32-digit UNIQ_KEY starts with (None if it is not one)."""
    if len(key) != 32:
        return None
    try:
        return str(ipaddress.IPv4Address(bytes.fromhex(key[:8])))
    except ValueError:
        return None
