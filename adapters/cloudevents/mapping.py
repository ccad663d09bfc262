"""CloudEvent <-> store message mapping (see docs/cloudevents.md).

An event is stored as one message on the topic of the URL: `body` = the data bytes (`data_base64`
decoded, JSON `data` serialized compactly, text `data` as UTF-8), and every context attribute but
`specversion` (always 1.0) as a property `ce.<name>`:

    ce.id ce.source ce.type ce.subject ce.time ce.dataschema ce.datacontenttype ce.<extension>
    ce._types   extensions that were JSON integers / booleans: "name:i,name:b" (absent: all strings)
    ce._data    how structured mode carried data: text | binary, or json when datacontenttype is
                not a JSON type (absent: binary mode, or JSON data of a JSON type or of none)

The distributed-tracing extension `traceparent` is kept as the property `traceparent` (not
`ce.traceparent`), the W3C trace context every protocol reads; an event is delivered with the
`traceparent` its producer (of any protocol) sent, and with none when it sent none.

The `partitionkey` extension (CloudEvents partitioning) is also the message's key (RocketMQ KEYS,
and what a compacted topic keeps the latest event of). So the event leaves exactly as it came (same
attribute strings, same extension types, same data representation).

A message without `ce.id` entered through another protocol and is presented with synthesized
attributes:

    id               the message id
    source           /gateway/mqtt/<store topic>   (MQTT: has mqtt.topic)
                     /gateway/rocketmq/<topic>     (anything else: gRPC, remoting, ...)
    type             mqtt.publish | org.apache.rocketmq.message
    subject          the MQTT topic path | the RocketMQ tag (absent without a tag)
    time             the born timestamp (store timestamp when unknown), RFC 3339 UTC with ms
    datacontenttype  mqtt.content_type when the MQTT 5 publisher set one (else absent)
    traceparent      the `traceparent` its producer sent (else absent)
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

from messaging_processor import Message
from messaging_processor.properties import (
    CE_PREFIX,
    CE_TYPE_MQTT_PUBLISH,
    P_CE_ID,
    P_CE_PARTITION_KEY,
    P_CONTENT_TYPE,
    P_PATH,
)
from messaging_processor.trace_context import TRACEPARENT

from .event import SPECVERSION, AttrValue, Event, is_json_type

PREFIX = CE_PREFIX
P_ID = P_CE_ID
P_TYPES = "ce._types"
P_DATA = "ce._data"
P_PARTITION_KEY = P_CE_PARTITION_KEY  # the CloudEvents partitioning extension
_FORMS = frozenset({"json", "text", "binary"})

MQTT_TOPIC = P_PATH  # (the shared names: messaging_processor/properties.py)
MQTT_CONTENT_TYPE = P_CONTENT_TYPE
MQTT_TYPE = CE_TYPE_MQTT_PUBLISH
ROCKETMQ_TYPE = "org.apache.rocketmq.message"


def to_message(topic: str, ev: Event) -> Message:
    """The store message of an event (not yet sent)."""
    props: dict[str, str] = {}
    types: list[str] | None = None
    keys = _KEYS
    for name, value in ev.attributes.items():
        key = keys.get(name)
        if key is None:
            if name == "specversion":
                continue
            key = PREFIX + name
            if len(keys) < _KEYS_MAX:
                keys[name] = key
        if value.__class__ is str:
            props[key] = value  # type: ignore[assignment]
        elif isinstance(value, bool | int):
            if types is None:
                types = []
            if isinstance(value, bool):
                props[key] = "true" if value else "false"
                types.append(name + ":b")
            else:
                props[key] = str(value)
                types.append(name + ":i")
        else:
            props[key] = str(value)
    if types:
        props[P_TYPES] = ",".join(types)
    form = ev.data_form
    if form is not None and (form != "json" or not is_json_type(ev.datacontenttype)):
        props[P_DATA] = form  # JSON data of a JSON media type (or none) needs no mark
    pk = props.get(P_PARTITION_KEY)
    # the partitioning extension's key is the message key (RocketMQ KEYS; a compacted topic keeps
    # the latest event per key)
    return Message(topic, ev.data or b"", "", (pk,) if pk else (), props)  # positional: cheaper


# attribute name -> property name, so that the hot path does not build the same strings again
_KEYS: dict[str, str] = {
    n: PREFIX + n for n in ("id", "source", "type", "subject", "time", "datacontenttype")
}
_KEYS[TRACEPARENT] = TRACEPARENT  # the distributed-tracing extension: the shared property
_KEYS_MAX = 4096


def is_cloudevent(msg: Message) -> bool:
    """Whether the message entered as a CloudEvent (or carries CloudEvent properties)."""
    return P_ID in msg.properties


def from_message(msg: Message) -> Event:
    """The CloudEvent a stored message is delivered as (with data)."""
    attrs = attributes_of(msg)
    form = msg.properties.get(P_DATA)
    data: bytes | None = msg.body
    if not data and form is None:
        data = None
    return Event(attrs, data, form if form in _FORMS else None)  # type: ignore[arg-type]


def attributes_of(msg: Message) -> dict[str, AttrValue]:
    """The context attributes of a stored message, synthesized when it did not enter as a CloudEvent."""
    props = msg.properties
    if P_ID not in props:
        return synthesized(msg)
    attrs: dict[str, AttrValue] = {"specversion": SPECVERSION}
    for k, v in props.items():
        if k.startswith(PREFIX) and not k.startswith("ce._"):
            attrs[k[3:]] = v
    if "source" not in attrs or "type" not in attrs:  # a foreign producer set only some ce.* properties
        base = synthesized(msg)
        attrs.setdefault("source", base["source"])
        attrs.setdefault("type", base["type"])
    tp = props.get(TRACEPARENT)
    if tp is not None:
        attrs[TRACEPARENT] = tp
    types = props.get(P_TYPES)
    if types:
        for item in types.split(","):
            name, _, kind = item.partition(":")
            v = attrs.get(name)
            if not isinstance(v, str):
                continue
            if kind == "b":
                attrs[name] = v == "true"
            elif kind == "i":
                with contextlib.suppress(ValueError):
                    attrs[name] = int(v)
    return attrs


def synthesized(msg: Message) -> dict[str, AttrValue]:
    """Attributes of a message that entered through another protocol (see the module docstring)."""
    props = msg.properties
    path = props.get(MQTT_TOPIC)
    attrs: dict[str, AttrValue] = {"specversion": SPECVERSION, "id": msg.message_id or "unknown"}
    if path:
        attrs["source"] = f"/gateway/mqtt/{msg.topic}"
        attrs["type"] = MQTT_TYPE
        attrs["subject"] = path
    else:
        attrs["source"] = f"/gateway/rocketmq/{msg.topic}"
        attrs["type"] = ROCKETMQ_TYPE
        if msg.tag:
            attrs["subject"] = msg.tag
    ts = msg.born_timestamp or msg.store_timestamp
    if ts:
        attrs["time"] = rfc3339_ms(ts)
    ct = props.get(MQTT_CONTENT_TYPE)
    if ct:
        attrs["datacontenttype"] = ct
    tp = props.get(TRACEPARENT)
    if tp is not None:
        attrs[TRACEPARENT] = tp
    return attrs


def rfc3339_ms(epoch_ms: int) -> str:
    t = datetime.fromtimestamp(epoch_ms // 1000, UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"
