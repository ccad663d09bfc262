"""How a RocketMQ 5 (gRPC) consumer receives a stored message, for the console's message browser:
built by the same conversion the delivery path uses (`convert`), so the two cannot disagree."""

from __future__ import annotations

from messaging_processor import Message

from .convert import message_to_proto


def consumer_view(msg: Message) -> dict[str, object]:
    """Topic, tag, keys, message group, message id and user properties of the delivered message
    (and its trace context when it has one)."""
    pm = message_to_proto(msg)
    sp = pm.system_properties
    out: dict[str, object] = {"topic": pm.topic.name, "message_id": sp.message_id}
    if sp.HasField("tag"):
        out["tag"] = sp.tag
    out["keys"] = list(sp.keys)
    if sp.HasField("message_group"):
        out["message_group"] = sp.message_group
    out["user_properties"] = dict(pm.user_properties)
    if sp.HasField("trace_context"):
        out["trace_context"] = sp.trace_context
    return out
