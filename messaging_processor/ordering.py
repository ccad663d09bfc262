"""Which queue keeps a message's order: the one rule above the store.

A message's order key is its message group (FIFO), else its path (`P_PATH`: an MQTT topic path, the
path a CloudEvent or a bridged AMQP message carries), else none. Messages of one key go to one queue
(the store hashes `Message.order_key`, store/appending.py) and, in CLUSTER mode, to one store node
(cluster/sends.py), so they are stored and handed out in order; messages without one are spread
round robin. The store never reads a protocol property to choose a queue.

`order_key` is not stored: it is an input to the queue choice at send time. So it is set where a
message enters a store: the processor's sends (`MessagingProcessor.send`, `send_nowait`,
`send_internal`, the dead-letter redrive, a committed transaction's copies) and a store node's
append (cluster/store_wire.py: the record wire carries the group and the path, not the key). The
store carries it along where it moves a message itself at once (a delayed or transactional message
keeps it while held, store/scheduling.py). The store's logic queues (store/popping.py
`_held_back`) find the key of a message stored before a queue count change from the same two
stored fields.
"""

from __future__ import annotations

from collections.abc import Iterable

from store import Message

from .properties import P_PATH

__all__ = ["order_key", "set_order_keys"]


def order_key(m: Message) -> str:
    """The key whose messages keep their order: the message group, else the path, else ""."""
    if m.message_group:
        return m.message_group
    props = m.properties
    return (props.get(P_PATH) or "") if props else ""


def set_order_keys(msgs: Iterable[Message]) -> None:
    """Give each message without one its order key (before it is appended)."""
    for m in msgs:
        if not m.order_key:
            m.order_key = order_key(m)
