"""How a CloudEvents consumer (push subscription or pull) receives a stored message, for the
console's message browser: built by the same mapping function both delivery paths call
(`mapping.from_message`), so the two cannot disagree."""

from __future__ import annotations

from messaging_processor import Message

from .mapping import from_message


def consumer_view(msg: Message) -> dict[str, object]:
    """The event's context attributes (with their JSON types) as a consumer gets them; the data is
    the message body."""
    return dict(from_message(msg).attributes)
