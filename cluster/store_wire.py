"""The store node protocol of CLUSTER mode, both sides: the `StoreClient` operations carried in
RocketMQ remoting frames (the `remoting` package) between proxies and store nodes.

Requests use internal codes (`OPS`, 9100-9199). A proxy opens each connection with HELLO: both
sides' protocol version and features (the operations they serve and a few behaviours); a node
from before HELLO (version 0) answers "request code not supported" and is used with
BASE_FEATURES, so a newer proxy never sends an older node what it does not know. Arguments travel
as a JSON object in extField `a` (named as the `StoreClient` method's parameters, shortened:
`max`, `invisible_ms`, `tags`, ...); the body carries messages (APPEND) or a key-value value
(KV_PUT, KV_PUT_IF_ABSENT).
`SERVE` is the node side: how each operation's arguments become a call on the node's store and
its result a reply. Replies: SUCCESS with a JSON body (`{"r": value}`) or encoded messages
(`MESSAGE_REPLIES`); failures are SYSTEM_ERROR with extField `error` = the exception class name
(TopicNotFound, InvalidReceiptHandle, ...) and the message as remark (`error_fields`), so the
proxy re-raises the same store exception (`make_error`) the processor already maps. CANCEL
abandons a pending request of the same connection (a losing long poll). Store node -> proxy:
TXN_CHECK (oneway, body = one encoded message) asks a proxy to run a transaction check.

Encoded messages: `u32 count`, then per message `u16 len + receipt handle, i64 invisible_until,
i64 commitlog_offset, i32 reconsume_times, u32 len + record` where the record is the commit log
record of store/codec.py (every Message field but commitlog_offset / reconsume_times). A TAIL
reply carries the records as the node's commit log holds them (`Store.tail_records`,
`encode_records`): the node neither decodes nor encodes the messages it sends to a subscriber.
`encode_messages` and `decode_popped` are compiled (`_speedups.pyx`, built by `uv sync` where there
is a C compiler) unless `GATEWAY_PURE_PYTHON=1`; `py_encode_messages` and `py_decode_popped` are the
pure-Python references they match byte for byte."""

from __future__ import annotations

import base64
import struct
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from messaging_processor import LocalStoreClient, StoreClient
from messaging_processor.ordering import order_key
from remoting import ResponseCode
from runtime.speedups import load as load_speedups
from store import (
    AppendResult,
    Filter,
    GroupConfig,
    GroupNotFound,
    InvalidReceiptHandle,
    Message,
    MessageTooLarge,
    NotReplicated,
    PoppedMessage,
    RetryPolicy,
    StoreError,
    StoreFullError,
    TopicConfig,
    TopicNotFound,
    TransactionNotFound,
)
from store import codec as record

# The operations of version 0, the protocol before HELLO (codes 9100 + position): what a node of
# that version serves. A new operation is appended to ADDED_OPS (its code follows on), listed in
# FEATURES, and used by a proxy only on nodes whose HELLO offers it (`NodeClient.supports`).
V0_OPS: tuple[str, ...] = (
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
    "latest",
    "latest_items",
    "compact",
    "resize_topic",
    "get_by_key",
    "ack_many",
    "tail",
)
# operations of later versions, in order: version 2 adds logic queues and draining (feature
# `logic_queues`: chain_fence, set_draining, node_state, and the `chain` argument of pop and tail)
ADDED_OPS: tuple[str, ...] = ("chain_fence", "set_draining", "node_state")
OPS: dict[str, int] = {name: 9100 + i for i, name in enumerate(V0_OPS + ADDED_OPS)}
OP_NAMES = {code: name for name, code in OPS.items()}
# HELLO, proxy -> node, once per connection: extFields `version` and `features` (comma separated)
# of the proxy; the node answers with its own as a JSON body (`hello_reply`). A node of version 0
# answers REQUEST_CODE_NOT_SUPPORTED: the proxy then uses BASE_FEATURES with it.
HELLO = 9197
VERSION = 3
BASE_FEATURES = frozenset(V0_OPS)  # what a node of version 0 serves: its operations
# version 1: HELLO itself; `not_replicated`: a write stored on the primary but not replicated in
# time is the error NotReplicated (version 0 nodes send StoreError for it)
# version 2: `logic_queues` (docs/cluster.md, "Logic queues across nodes")
# version 3: `watch` (WATCH / WATCHED: a caught-up reader parks without a long poll)
FEATURES = frozenset(OPS) | {"hello", "not_replicated", "logic_queues", "watch"}
NODE_OPS = frozenset(ADDED_OPS)  # served by the node itself (cluster/fence.py), not by SERVE
OLD_NOT_REPLICATED = "not replicated to the SyncStateSet within"  # a version 0 node's remark for it
# WATCH, proxy -> node, oneway: extFields `topic` and `a` (JSON: the reader's next offset per local
# queue); the node answers WATCHED (node -> proxy, oneway, extField `topic`) once, when the topic has
# a record past those offsets (at once if it has one already), is deleted, or cannot be watched
WATCH = 9195
WATCHED = 9196
CANCEL = 9198  # oneway: extField `opaque` = a pending request of this connection to abandon
TXN_CHECK = 9199  # store node -> proxy, oneway: body = one encoded message (a half message)
# Operations whose reply body is encoded messages instead of JSON.
MESSAGE_REPLIES = frozenset(
    {"pop", "read", "get_by_id", "get_by_key", "get_message", "latest", "latest_items", "tail"}
)
# Operations that append to the commit log (a primary then wakes its replicas' pulls).
WRITES = frozenset({"append", "forward_to_dlq", "end_transaction", "nack"})
# Operations a replica serves (they change nothing); every other one needs the primary.
READS = frozenset(
    {
        "get_topic",
        "list_topics",
        "get_group",
        "list_groups",
        "subscriptions",
        "min_offset",
        "max_offset",
        "read",
        "search_offset",
        "committed_offset",
        "backlog",
        "inflight_count",
        "get_by_id",
        "get_by_key",
        "get_message",
        "kv_get",
        "kv_scan",
        "stats",
        "ping",
        "latest",
        "latest_items",
        "node_state",
    }
)
READ_CODES = frozenset(OPS[n] for n in READS) | {CANCEL}


class QueueSealed(StoreError):
    """An append to a physical queue whose logical queue continues on another node (reload the
    chain table and send it there)."""


class StaleChain(StoreError):
    """A pop or tail read made with an older chain table than the node took part in."""


class NodeDraining(StoreError):
    """The store node drains: it takes no new writes from proxies."""


_ERRORS: dict[str, type[BaseException]] = {
    c.__name__: c
    for c in (
        TopicNotFound,
        GroupNotFound,
        InvalidReceiptHandle,
        MessageTooLarge,
        TransactionNotFound,
        StoreFullError,
        NotReplicated,
        QueueSealed,
        StaleChain,
        NodeDraining,
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


def _dump_bytes(obj: Any) -> bytes:
    """Compact standard JSON by orjson (2-4x the stdlib's speed on the node's hot path: every send's
    reply). WireError for what has no exact JSON here (an integer beyond 64 bits: orjson would
    read it back as a float, so it is refused rather than sent)."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as e:
        raise WireError(f"cannot encode for the store protocol: {e}") from None


def dumps(obj: Any) -> str:
    """Arguments and replies: compact standard JSON."""
    return _dump_bytes(obj).decode()


def loads(data: str | bytes) -> Any:
    return orjson.loads(data)


def reply_body(result: Any) -> bytes:
    return _dump_bytes({"r": result})


def reply_value(body: bytes) -> Any:
    return loads(body)["r"]


# ----------------------------------------------------------------------------- versions
@dataclass(frozen=True)
class NodeInfo:
    """What a node said at HELLO (version 0: nothing, its base operations)."""

    version: int
    features: frozenset[str]
    name: str | None = None  # the node's own name (a replica group member's, not the group's)
    group: str | None = None

    def supports(self, feature: str) -> bool:
        return feature in self.features


BASE = NodeInfo(0, BASE_FEATURES)


def hello_fields() -> dict[str, str]:
    """The proxy's HELLO: its version and features."""
    return {"version": str(VERSION), "features": ",".join(sorted(FEATURES))}


def hello_reply(name: str, group: str | None) -> bytes:
    """The node's answer to HELLO."""
    return _dump_bytes({"version": VERSION, "features": sorted(FEATURES), "name": name, "group": group})


def parse_hello(code: int, remark: str | None, body: bytes) -> NodeInfo:
    """A node's answer to HELLO; BASE for a node that does not know the request (version 0);
    ConnectionRefusedError for a refusal (the cluster secret missing, say)."""
    if code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:  # a node from before HELLO
        return BASE
    if code != ResponseCode.SUCCESS:
        raise ConnectionRefusedError(f"the store node refused HELLO: {remark} (code {code})")
    d = loads(body)
    return NodeInfo(int(d["version"]), frozenset(d["features"]), d.get("name"), d.get("group"))


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


# the topic fields of version 0: a newer field is sent only when it is set, so that a proxy of
# that release (which builds TopicConfig(**fields)) reads the topics of a newer node
V0_TOPIC_FIELDS = frozenset(
    {"name", "queues", "retention_ms", "retention_bytes", "compacted", "read_queues", "epochs"}
)


def topic_json(t: TopicConfig | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {k: v for k, v in asdict(t).items() if k in V0_TOPIC_FIELDS or v is not None}


def topic_from_json(d: dict[str, Any] | None) -> TopicConfig | None:
    return None if d is None else TopicConfig.from_dict(d)


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


_RAW_ENTRY = struct.Struct(">HqqiI")  # an empty handle, invisible_until 0, offset, reconsume 0, length


def encode_records(records: Iterable[tuple[int, bytes]]) -> bytes:
    """(commit log offset, record as stored) pairs as one body of encoded messages: the bytes
    `encode_messages` writes for the decoded messages (when the record is in the current format),
    without decoding or encoding them."""
    parts: list[bytes] = []
    pack = _RAW_ENTRY.pack
    for clo, rec in records:
        parts += (pack(0, 0, clo, 0, len(rec)), rec)
    return _I.pack(len(parts) // 2) + b"".join(parts)


class EncodedMessages(bytes):
    """A reply body of encoded messages made already (a TAIL's records)."""


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


py_encode_messages, py_decode_popped = encode_messages, decode_popped
speedups = load_speedups("cluster._speedups")
if speedups is not None:
    speedups.bind(
        py_encode_messages,
        py_decode_popped,
        record.encode,
        record.decode,
        PoppedMessage,
        WireError,
        (struct.error, UnicodeDecodeError, IndexError),
    )
    encode_messages = speedups.encode_messages  # noqa: F811 - the compiled twins of the above
    decode_popped = speedups.decode_popped  # noqa: F811


# ----------------------------------------------------------------------------- the node side
Op = Callable[[LocalStoreClient, dict[str, Any], bytes], Awaitable[Any]]  # a node serves its own store


def _filter(a: dict[str, Any]) -> Filter:
    return filter_from_json(a.get("tags"))


async def _append(c: StoreClient, a: dict[str, Any], body: bytes) -> Any:
    msgs = decode_messages(body)
    for m in msgs:  # the node assigns what a fresh message must not carry
        m.commitlog_offset, m.queue_offset, m.store_timestamp, m.size = -1, -1, 0, 0
        m.order_key = order_key(m)  # (not on the record wire: the proxy's rule again, from group and path)
    if len(msgs) == 1:
        return [result_json(await c.append(msgs[0]))]
    return [result_json(r) for r in await c.append_many(msgs)]


async def _ack_many(c: StoreClient, a: dict[str, Any], body: bytes) -> Any:
    return [None if e is None else list(error_fields(e)) for e in await c.ack_many(a["handles"])]


async def _kv_put_many(c: StoreClient, a: dict[str, Any], body: bytes) -> Any:
    items = {k: (None if v is None else unb64(v)) for k, v in a["items"].items()}
    await c.kv_put_many(a["ns"], items)


async def _kv_get(c: StoreClient, a: dict[str, Any], body: bytes) -> Any:
    v = await c.kv_get(a["ns"], a["key"])
    return None if v is None else b64(v)


async def _kv_put_if_absent(c: StoreClient, a: dict[str, Any], body: bytes) -> Any:
    v = await c.kv_put_if_absent(a["ns"], a["key"], body)
    return None if v is None else b64(v)


async def _kv_scan(c: StoreClient, a: dict[str, Any], body: bytes) -> Any:
    return [[k, b64(v)] for k, v in await c.kv_scan(a["ns"], a["prefix"])]


SERVE: dict[str, Op] = {
    "append": _append,
    "pop": lambda c, a, b: c.pop(
        a["group"], a["topic"], a["max"], a["invisible_ms"], _filter(a), a["wait_ms"]
    ),
    "ack": lambda c, a, b: c.ack(a["handle"]),
    "change_invisible_time": lambda c, a, b: c.change_invisible_time(a["handle"], a["invisible_ms"]),
    "nack": lambda c, a, b: c.nack(a["handle"]),
    "forward_to_dlq": lambda c, a, b: _then(c.forward_to_dlq(a["handle"], a["reason"]), result_json),
    "end_transaction": lambda c, a, b: _then(c.end_transaction(a["tid"], a["commit"]), result_json),
    "get_topic": lambda c, a, b: _then(c.get_topic(a["name"]), topic_json),
    "create_topic": lambda c, a, b: _then(
        c.create_topic(
            a["name"], a["queues"], a["retention_ms"], a["retention_bytes"], a.get("compacted", False)
        ),
        topic_json,
    ),
    "resize_topic": lambda c, a, b: _then(c.resize_topic(a["name"], a["queues"]), topic_json),
    "delete_topic": lambda c, a, b: c.delete_topic(a["name"]),
    "list_topics": lambda c, a, b: _then(c.list_topics(), lambda ts: [topic_json(t) for t in ts]),
    "get_group": lambda c, a, b: _then(c.get_group(a["name"]), group_json),
    "create_group": lambda c, a, b: _then(
        c.create_group(a["name"], a["max_attempts"], _retry(a)),
        group_json,
    ),
    "delete_group": lambda c, a, b: c.delete_group(a["name"]),
    "list_groups": lambda c, a, b: _then(c.list_groups(), lambda gs: [group_json(g) for g in gs]),
    "subscriptions": lambda c, a, b: _then(c.subscriptions(), lambda s: [list(x) for x in s]),
    "min_offset": lambda c, a, b: c.min_offset(a["topic"], a["queue_id"]),
    "max_offset": lambda c, a, b: c.max_offset(a["topic"], a["queue_id"]),
    "read": lambda c, a, b: c.read(a["topic"], a["queue_id"], a["start"], a["end"], a["max"], _filter(a)),
    "search_offset": lambda c, a, b: c.search_offset(a["topic"], a["queue_id"], a["timestamp_ms"]),
    "commit_offset": lambda c, a, b: c.commit_offset(a["group"], a["topic"], a["queue_id"], a["offset"]),
    "committed_offset": lambda c, a, b: c.committed_offset(a["group"], a["topic"], a["queue_id"]),
    "backlog": lambda c, a, b: c.backlog(a["group"], a["topic"]),
    "inflight_count": lambda c, a, b: c.inflight_count(a["group"], a["topic"]),
    "get_by_id": lambda c, a, b: c.get_by_id(a["id"]),
    "get_by_key": lambda c, a, b: c.get_by_key(a["key"]),
    "ack_many": _ack_many,
    "tail": lambda c, a, b: _then(
        c.store.tail_records(
            a["topic"], {int(q): o for q, o in a["positions"].items()}, a["max"], a["wait_ms"]
        ),
        lambda records: EncodedMessages(encode_records(records)),
    ),
    "get_message": lambda c, a, b: _then(c.get_message(a["offset"]), lambda m: [m]),
    "latest": lambda c, a, b: _then(c.latest(a["topic"], a["key"], True), lambda m: [] if m is None else [m]),
    "latest_items": lambda c, a, b: c.latest_items(a["topic"], True),
    "compact": lambda c, a, b: _then(c.compact(), asdict),
    "kv_put": lambda c, a, b: c.kv_put(a["ns"], a["key"], b),
    "kv_put_many": _kv_put_many,
    "kv_put_if_absent": _kv_put_if_absent,
    "kv_get": _kv_get,
    "kv_delete": lambda c, a, b: c.kv_delete(a["ns"], a["key"]),
    "kv_scan": _kv_scan,
    "stats": lambda c, a, b: _now({k: v for k, v in c.stats().items() if k != "flush_latency_ms"}),
    "ping": lambda c, a, b: _now(True),
}


def _retry(a: dict[str, Any]) -> Any:
    r = a.get("retry")
    return None if r is None else RetryPolicy(**r)


async def _then(aw: Awaitable[Any], fn: Callable[[Any], Any]) -> Any:
    return fn(await aw)


async def _now(v: Any) -> Any:
    return v
