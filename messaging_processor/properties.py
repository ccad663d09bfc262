"""Store properties every protocol reads the same way.

`mqtt.user_properties` holds a message's user properties as name/value pairs. It is a JSON list of
`[name, value]` pairs, which keeps the order and allows repeated names. The MQTT adapter writes it
for MQTT 5 User Properties. The AMQP exchanges write it for the headers of a publish. Consumers of
other protocols read it as their own user properties or headers.

`mqtt.topic` holds a message's MQTT-style path. The store keeps `path_hash(path)` as the consume
queue hash of an untagged message, so a `Filter.skip` can pass over the paths a consumer rejects.
"""

from __future__ import annotations

import json

from store.message import PATH_PROPERTY, path_hash

P_USER_PROPERTIES = "mqtt.user_properties"
P_PATH = PATH_PROPERTY  # `mqtt.topic`: the MQTT-style path; an untagged message's entry hash is its hash

__all__ = ["P_PATH", "P_USER_PROPERTIES", "path_hash", "user_property_pairs"]


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
