"""Sans-IO wire format of the store node protocol (CLUSTER mode): the `StoreClient` operations
carried in RocketMQ remoting frames (adapters/remoting/codec) between proxies and store nodes.

Requests use internal codes (`OPS`, 9100-9199). Arguments travel as a JSON object in the body,
except APPEND (body = encoded messages). Replies: SUCCESS with a JSON body (`{"r": value}`) or
encoded messages; failures are SYSTEM_ERROR with extField `error` = the exception class name
(TopicNotFound, InvalidReceiptHandle, ...) and the message as remark, so the proxy re-raises the
same store exception the processor already maps. Store node -> proxy: TXN_CHECK (oneway, body =
one encoded message) asks a proxy to run a transaction check.

Encoded messages: `u32 count`, then per message `u16 len + receipt handle, i64 invisible_until,
i64 commitlog_offset, i32 reconsume_times, u32 len + record` where the record is the commit log
record of store/codec.py (every Message field but commitlog_offset / reconsume_times)."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from store import (
    AppendResult,
    Filter,
    GroupConfig,
    GroupNotFound,
    InvalidReceiptHandle,
    Message,
    MessageTooLarge,
    PoppedMessage,
    RetryPolicy,
    StoreError,
    StoreFullError,
    TopicConfig,
    TopicNotFound,
    TransactionNotFound,
)
from store import codec as record

OPS: dict[str, int] = {
    name: 9100 + i
    for i, name in enumerate(
        (
            "append",
            "pop",
            "ack",
            "change_invisible_time",
            "nack",
            "forward_to_dlq",
            "end_transaction",
            "get_topic",
            "create_topic",
            "delete_topic",
            "list_topics",
            "get_group",
            "create_group",
            "delete_group",
            "list_groups",
            "subscriptions",
            "min_offset",
            "max_offset",
            "read",
            "search_offset",
            "commit_offset",
            "committed_offset",
            "backlog",
            "inflight_count",
            "get_by_id",
            "get_message",
            "kv_put",
            "kv_put_many",
            "kv_get",
            "kv_delete",
            "kv_scan",
            "stats",
            "ping",
            "kv_put_if_absent",
        )
    )
}
OP_NAMES = {code: name for name, code in OPS.items()}
CANCEL = 9198  # oneway: extField `opaque` = a pending request of this connection to abandon
TXN_CHECK = 9199  # store node -> proxy, oneway: body = one encoded message (a half message)
# Operations whose reply body is encoded messages instead of JSON.
MESSAGE_REPLIES = frozenset({"pop", "read", "get_by_id", "get_message"})

_ERRORS: dict[str, type[BaseException]] = {
    c.__name__: c
    for c in (
        TopicNotFound,
        GroupNotFound,
        InvalidReceiptHandle,
        MessageTooLarge,
        TransactionNotFound,
        StoreFullError,
        StoreError,
        ValueError,
        KeyError,
    )
}

_H = struct.Struct(">H")
_I = struct.Struct(">I")
_ENTRY = struct.Struct(">qqi")  # invisible_until, commitlog_offset, reconsume_times


class WireError(ValueError):
    """A malformed store protocol payload."""


def dumps(obj: Any) -> str:
    """Arguments and replies: compact standard JSON (C-accelerated; no fastjson quirks needed)."""
    return json.dumps(obj, separators=(",", ":"))


def loads(data: str | bytes) -> Any:
    return json.loads(data)


def reply_body(result: Any) -> bytes:
    return dumps({"r": result}).encode()


def reply_value(body: bytes) -> Any:
    return json.loads(body)["r"]


# ----------------------------------------------------------------------------- errors
def error_fields(exc: BaseException) -> tuple[str, str]:
    """(class name, message) of an exception to send; unknown classes travel as StoreError."""
    for cls in type(exc).__mro__:
        if cls.__name__ in _ERRORS:
            name = cls.__name__
            break
    else:
        name = "StoreError"
    msg = exc.args[0] if isinstance(exc, KeyError | StoreError) and exc.args else str(exc)
    return name, str(msg)


def make_error(name: str, message: str) -> BaseException:
    """The exception a remote failure stands for (StoreError for unknown names)."""
    cls = _ERRORS.get(name, StoreError)
    if cls is StoreFullError:
        return StoreFullError(message)
    return cls(message)


# ----------------------------------------------------------------------------- filters, configs
def filter_json(f: Filter) -> list[str] | None:
    """The part of a filter a store node applies: its tags (predicates run on the proxy)."""
    return None if f.tags is None else sorted(f.tags)


def filter_from_json(tags: list[str] | None) -> Filter:
    return Filter() if tags is None else Filter(tags=frozenset(tags))


def topic_json(t: TopicConfig | None) -> dict[str, Any] | None:
    return None if t is None else asdict(t)


def topic_from_json(d: dict[str, Any] | None) -> TopicConfig | None:
    return None if d is None else TopicConfig(**d)


def group_json(g: GroupConfig | None) -> dict[str, Any] | None:
    return None if g is None else asdict(g)


def group_from_json(d: dict[str, Any] | None) -> GroupConfig | None:
    if d is None:
        return None
    return GroupConfig(d["name"], d["max_attempts"], RetryPolicy(**d["retry"]))


def result_json(r: AppendResult | None) -> list[Any] | None:
    return None if r is None else list(r)


def result_from_json(v: list[Any] | None) -> AppendResult | None:
    return None if v is None else AppendResult(*v)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


# ----------------------------------------------------------------------------- messages
def _record(m: Message) -> bytes:
    return record.encode(m, m.queue_id, m.queue_offset, m.store_timestamp, m.message_id, m.born_timestamp)


def encode_messages(items: Iterable[Message | PoppedMessage]) -> bytes:
    """Messages (or popped messages with their handles) as one body."""
    parts: list[bytes] = []
    n = 0
    for it in items:
        if isinstance(it, PoppedMessage):
            m, handle, until = it.message, it.receipt_handle.encode(), it.invisible_until
        else:
            m, handle, until = it, b"", 0
        rec = _record(m)
        parts += (
            _H.pack(len(handle)),
            handle,
            _ENTRY.pack(until, m.commitlog_offset, m.reconsume_times),
            _I.pack(len(rec)),
            rec,
        )
        n += 1
    return _I.pack(n) + b"".join(parts)


def decode_popped(body: bytes) -> list[PoppedMessage]:
    """What `encode_messages` wrote (plain messages come back with an empty handle)."""
    try:
        (n,) = _I.unpack_from(body, 0)
        pos = 4
        out: list[PoppedMessage] = []
        for _ in range(n):
            (hl,) = _H.unpack_from(body, pos)
            pos += 2
            handle = body[pos : pos + hl].decode()
            pos += hl
            until, clo, reconsume = _ENTRY.unpack_from(body, pos)
            pos += _ENTRY.size
            (rl,) = _I.unpack_from(body, pos)
            pos += 4
            if pos + rl > len(body):
                raise WireError("truncated message record")
            m = record.decode(body, pos, clo)
            m.reconsume_times = reconsume
            pos += rl
            out.append(PoppedMessage(m, handle, until))
        return out
    except (struct.error, UnicodeDecodeError, IndexError) as e:
        raise WireError(f"malformed message list: {e}") from None


def decode_messages(body: bytes) -> list[Message]:
    return [p.message for p in decode_popped(body)]
