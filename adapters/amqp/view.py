"""How an AMQP consumer receives a stored message, for the console's message browser: built by
the same mapping function basic.deliver and basic.get-ok use (`mapping.present`), so the two
cannot disagree."""

from __future__ import annotations

from dataclasses import fields

from messaging_processor import Message

from .codec import decode_properties
from .mapping import present


def consumer_view(msg: Message) -> dict[str, object]:
    """basic.deliver's exchange and routing key and the content header's properties that are set
    (headers as their table; timestamps in epoch seconds)."""
    exchange, routing_key, raw = present(msg)
    try:
        props = decode_properties(raw)
    except ValueError:
        return {"exchange": exchange, "routing_key": routing_key, "properties": None}
    values = {f.name: getattr(props, f.name) for f in fields(props)}
    return {
        "exchange": exchange,
        "routing_key": routing_key,
        "properties": {k: v for k, v in values.items() if v is not None},
    }
