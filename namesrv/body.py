"""REGISTER_BROKER bodies (RocketMQ's RegisterBrokerBody), both forms:

- JSON: `{"topicConfigSerializeWrapper":{"topicConfigTable":{name:{"topicName":..,
  "readQueueNums":..,"writeQueueNums":..,"perm":..,"topicFilterType":..,"topicSysFlag":..,
  "order":..}},"dataVersion":{..}},"filterServerList":[]}`
- compressed (`compressed=true` in the header): deflate of `int32 len + dataVersion JSON,
  int32 topic count, (int32 len + TopicConfig.encode())*, int32 len + filter server list JSON`,
  where TopicConfig.encode() is `name read write perm filterType [attributes JSON]` joined by
  spaces.

The JSON form may carry `logicQueues` ({topic: chain table}, docs/cluster.md "Logic queues across
nodes"): a CLUSTER store node's logic queue tables, as RocketMQ 5 brokers send their static
topics' `topicQueueMappingInfoMap`; other name servers ignore the key."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

from remoting import jsonx
from remoting.codes import PERM_READ_WRITE

from .routeinfo import TopicQueues

_I = struct.Struct(">i")
MAX_INFLATED = 64 * 1024 * 1024


class BodyError(ValueError):
    pass


def _topic_queues(cfg: dict[str, Any]) -> TopicQueues:
    return TopicQueues(
        int(cfg.get("readQueueNums", 0)),
        int(cfg.get("writeQueueNums", 0)),
        int(cfg.get("perm", PERM_READ_WRITE)),
        int(cfg.get("topicSysFlag", 0)),
    )


def decode_register_body(body: bytes, compressed: bool) -> tuple[dict[str, TopicQueues], dict[str, Any]]:
    """(topic -> queues, dataVersion) of a REGISTER_BROKER body; empty for an empty body."""
    if not body:
        return {}, {}
    try:
        if compressed:
            return _decode_compressed(body)
        data = jsonx.loads(body)
        wrapper = data.get("topicConfigSerializeWrapper") or {}
        table = wrapper.get("topicConfigTable") or {}
        topics = {str(name): _topic_queues(cfg or {}) for name, cfg in table.items()}
        return topics, dict(wrapper.get("dataVersion") or {})
    except (ValueError, TypeError, AttributeError, struct.error, zlib.error) as e:
        raise BodyError(f"REGISTER_BROKER body does not decode: {e}") from None


def decode_logic_queues(body: bytes, compressed: bool) -> dict[str, dict[str, Any]]:
    """The `logicQueues` of a JSON REGISTER_BROKER body ({} when absent or compressed)."""
    if not body or compressed:
        return {}
    try:
        tables = jsonx.loads(body).get("logicQueues") or {}
        return {str(t): dict(c) for t, c in tables.items() if isinstance(c, dict) and "epoch" in c}
    except (ValueError, TypeError, AttributeError):
        return {}


def _decode_compressed(body: bytes) -> tuple[dict[str, TopicQueues], dict[str, Any]]:
    z = zlib.decompressobj()
    raw = z.decompress(body, MAX_INFLATED)
    if z.unconsumed_tail:
        raise BodyError("inflated REGISTER_BROKER body is too large")
    pos = 0

    def chunk() -> bytes:
        nonlocal pos
        (n,) = _I.unpack_from(raw, pos)
        pos += 4
        if n < 0 or pos + n > len(raw):
            raise BodyError("truncated compressed body")
        out = raw[pos : pos + n]
        pos += n
        return out

    version = json.loads(chunk() or b"{}")
    (count,) = _I.unpack_from(raw, pos)
    pos += 4
    topics: dict[str, TopicQueues] = {}
    for _ in range(count):
        parts = chunk().decode().split(" ", 5)
        if len(parts) < 4:
            raise BodyError(f"bad TopicConfig encoding {parts!r}")
        topics[parts[0]] = TopicQueues(int(parts[1]), int(parts[2]), int(parts[3]))
    return topics, dict(version or {})


def encode_register_body(
    topics: dict[str, TopicQueues],
    data_version: dict[str, Any] | None = None,
    compressed: bool = False,
    logic_queues: dict[str, dict[str, Any]] | None = None,
) -> bytes:
    """The body a broker (store node) sends; what `decode_register_body` reads back (and
    `decode_logic_queues`, for the JSON form)."""
    version = data_version or {"counter": 0, "timestamp": 0}
    if compressed:
        parts = [jsonx.dumps(version).encode()]
        out = bytearray(_I.pack(len(parts[0])) + parts[0] + _I.pack(len(topics)))
        for name, q in topics.items():
            enc = f"{name} {q.read} {q.write} {q.perm} SINGLE_TAG".encode()
            out += _I.pack(len(enc)) + enc
        out += _I.pack(2) + b"[]"
        return zlib.compress(bytes(out))
    table = {
        name: {
            "order": False,
            "perm": q.perm,
            "readQueueNums": q.read,
            "topicFilterType": "SINGLE_TAG",
            "topicName": name,
            "topicSysFlag": q.sys_flag,
            "writeQueueNums": q.write,
        }
        for name, q in topics.items()
    }
    out: dict[str, Any] = {
        "filterServerList": [],
        "topicConfigSerializeWrapper": {"dataVersion": version, "topicConfigTable": table},
    }
    if logic_queues:
        out["logicQueues"] = logic_queues
    return jsonx.dumps_bytes(out)


def body_crc32(body: bytes) -> int:
    """UtilAll.crc32: CRC-32 masked to a non-negative int."""
    return zlib.crc32(body) & 0x7FFFFFFF
