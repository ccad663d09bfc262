"""Store properties every protocol reads the same way.

`mqtt.user_properties` holds a message's user properties as name/value pairs. It is a JSON list of
`[name, value]` pairs, which keeps the order and allows repeated names. The MQTT adapter writes it
for MQTT 5 User Properties. The AMQP exchanges write it for the headers of a publish. Consumers of
other protocols read it as their own user properties or headers.

A message without it (a RocketMQ producer's: its user properties are store properties of their
own) has as application properties, in their stored order, its store properties but the gateway's
(`application_pairs`): those of the protocol mappings (`mqtt.*`, `amqp.*`, `ce.*`), the internal
ones (`__*`) and the RocketMQ system properties the store and the processor keep among them. A
client's `traceparent` is an application property like any other.

`mqtt.topic` holds a message's MQTT-style path. The store keeps `path_hash(path)` as the consume
queue hash of an untagged message, so a `Filter.skip` can pass over the paths a consumer rejects,
and the path is a message's order key when it has no message group (ordering.py). Its name is part
of the store's record format (store/message.py `PATH_PROPERTY`); this module is its home above it.

This module is the one home of the property names more than one protocol reads or writes (the
MQTT-style ones every protocol maps to its own, the CloudEvents attributes the gateway's own events
carry); names only one adapter uses stay in that adapter's mapping. A string of a protocol's prefix
(`mqtt.`, `amqp.`, `ce.`, ...) anywhere else fails tests/architecture/test_property_vocabulary.py.
"""

from __future__ import annotations

import json

from store.message import PATH_PROPERTY, path_hash

P_PATH = PATH_PROPERTY  # `mqtt.topic`: the MQTT-style path; an untagged message's entry hash is its hash
P_USER_PROPERTIES = "mqtt.user_properties"
P_QOS = "mqtt.qos"  # the MQTT QoS a message was published (or is to be delivered) with
P_CONTENT_TYPE = "mqtt.content_type"  # MQTT 5 Content Type
P_CORRELATION = "mqtt.correlation_data"  # MQTT 5 Correlation Data
P_EXPIRY_AT = "mqtt.expiry_at"  # absolute epoch ms (MQTT 5 Message Expiry Interval)

# CloudEvents attributes, as properties `ce.<name>` (adapters/cloudevents/mapping.py)
CE_PREFIX = "ce."
P_CE_ID = "ce.id"
P_CE_SOURCE = "ce.source"
P_CE_TYPE = "ce.type"
P_CE_SUBJECT = "ce.subject"
P_CE_TIME = "ce.time"
P_CE_DATACONTENTTYPE = "ce.datacontenttype"
P_CE_PARTITION_KEY = "ce.partitionkey"  # the CloudEvents partitioning extension
CE_TYPE_MQTT_PUBLISH = "mqtt.publish"  # the CloudEvent type of a message an MQTT client published

# not application properties (`application_pairs`)
_OWN_PREFIXES = ("mqtt.", "amqp.", "ce.", "__")
_SYSTEM = frozenset(
    {
        "TRANSACTION_CHECK_TIMES",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "ORIGIN_TOPIC",
        "ORIGIN_MESSAGE_ID",
        "ORIGIN_QUEUE_ID",
        "ORIGIN_QUEUE_OFFSET",
        "RECONSUME_TIMES",
        "DLQ_REASON",
        "RETRY_TOPIC",
    }
)

__all__ = [
    "CE_PREFIX",
    "CE_TYPE_MQTT_PUBLISH",
    "P_CE_DATACONTENTTYPE",
    "P_CE_ID",
    "P_CE_PARTITION_KEY",
    "P_CE_SOURCE",
    "P_CE_SUBJECT",
    "P_CE_TIME",
    "P_CE_TYPE",
    "P_CONTENT_TYPE",
    "P_CORRELATION",
    "P_EXPIRY_AT",
    "P_PATH",
    "P_QOS",
    "P_USER_PROPERTIES",
    "application_pairs",
    "path_hash",
    "user_property_pairs",
]


def application_pairs(props: dict[str, str]) -> list[tuple[str, str]]:
    """The application properties of a message stored without `mqtt.user_properties`, in order
    (see the module docstring)."""
    return [(k, v) for k, v in props.items() if k not in _SYSTEM and not k.startswith(_OWN_PREFIXES)]


def user_property_pairs(props: dict[str, str]) -> list[tuple[str, str]]:
    """The (name, value) pairs of `props["mqtt.user_properties"]`, in order; [] if absent or
    malformed."""
    raw = props.get(P_USER_PROPERTIES)
    if not raw:
        return []
    try:
        pairs = json.loads(raw)
        return [(str(k), str(v)) for k, v in pairs]
    except (ValueError, TypeError):
        return []
