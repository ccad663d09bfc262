"""Multi-dispatch: a sent message also stored in the extra queues an adapter names for it.

An adapter that keeps a queue per subscriber (MQTT's persistent sessions, docs/mqtt.md "Persistent
sessions at scale") registers a dispatcher with `MessagingProcessor.add_dispatcher`: a function
from a message about to be stored to the topics it must also be stored in. Every send of every
protocol asks the dispatchers, so a message that enters through gRPC, AMQP, CloudEvents or 4.x
reaches those queues as one that enters through MQTT does. The processor knows nothing of why a
topic is named: the rule is the adapter's.

A copy is the message with its topic replaced, queue 0, the original's message id (so traces and
lookups by id see one message; the original gets an id here when its producer gave none) and
`DISPATCHED_FROM` naming the original topic. Copies go into the same `append_many` as their
originals: one write, one sync, durable before the producer hears "stored", so an acknowledged
message is in every queue it was dispatched to (RocketMQ's light message queues write one commit
log record and one consume-queue entry per queue; here a copy is a record, which the store's
append path already makes durable and recovers).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

from store import Message, MessageType
from store.appending import MessageIdFactory

log = logging.getLogger("messaging_processor")

Dispatcher = Callable[[Message], Sequence[str]]
DISPATCHED_FROM = "__DISPATCHED_FROM"  # a copy's original topic (internal: no adapter delivers `__*`)


class Dispatchers:
    """The registered dispatchers and the copies they ask for."""

    __slots__ = ("_fns", "_ids")

    def __init__(self) -> None:
        self._fns: list[Dispatcher] = []
        self._ids = MessageIdFactory()

    def __bool__(self) -> bool:
        return bool(self._fns)

    def add(self, fn: Dispatcher) -> None:
        self._fns.append(fn)

    def remove(self, fn: Dispatcher) -> None:
        if fn in self._fns:
            self._fns.remove(fn)

    def copies(self, messages: Sequence[Message]) -> list[Message]:
        """The copies `messages` need (giving an original without an id one, so the copies share
        it); [] when none. A transaction's half message gets none here: its copies are made when it
        is committed (`copies_of_committed`)."""
        out: list[Message] = []
        for m in messages:
            if m.msg_type == MessageType.TRANSACTION:
                continue
            names = self._names(m)
            if names:
                if not m.message_id:
                    m.message_id = self._ids.next()
                out.extend(_copy(m, t) for t in names)
        return out

    def copies_of_committed(self, m: Message, real_topic: str) -> list[Message]:
        """The copies of a committed transaction message (`m` as stored, in `real_topic`)."""
        m = dataclasses.replace(m, topic=real_topic, msg_type=MessageType.NORMAL)
        return [_copy(m, t) for t in self._names(m)]

    def _names(self, m: Message) -> list[str]:
        names: list[str] = []
        for fn in self._fns:
            try:
                got = fn(m)
            except Exception:  # noqa: BLE001 - a dispatcher's bug must not fail every send
                log.exception("dispatcher %r failed for a message to %s", fn, m.topic)
                continue
            if got:
                names.extend(got)
        return names


def _copy(m: Message, topic: str) -> Message:
    props = dict(m.properties)
    props[DISPATCHED_FROM] = m.topic
    for k in ("__REAL_TOPIC", "__REAL_QID"):  # (a committed half message's bookkeeping)
        props.pop(k, None)
    return Message(
        topic,
        m.body,
        m.tag,
        m.keys,
        props,
        m.message_group,
        m.deliver_at,
        m.message_id,
        m.born_timestamp,
        m.born_host,
        0,
        MessageType.NORMAL if m.msg_type == MessageType.TRANSACTION else m.msg_type,
    )


__all__ = ["DISPATCHED_FROM", "Dispatcher", "Dispatchers"]
