"""How an MQTT subscriber receives a stored message, for the console's message browser: built by
the same mapping functions the delivery path calls (mapping.py), so the two cannot disagree."""

from __future__ import annotations

from messaging_processor import Message

from .codec import PropertyId
from .mapping import path_of, qos_of, v5_properties


def consumer_view(msg: Message) -> dict[str, object]:
    """The PUBLISH a subscriber gets: topic, the QoS it was published with (a subscriber gets at
    most its subscription's) and the MQTT 5.0 properties by name (user properties as pairs, in
    order; a 3.1.1 subscriber gets none)."""
    out: dict[str, object] = {"topic": path_of(msg), "qos": qos_of(msg)}
    for pid, value in (v5_properties(msg) or {}).items():
        name = PropertyId(pid).name.lower()
        out[name] = [list(kv) for kv in value] if pid == PropertyId.USER_PROPERTY else value
    return out
