"""AMQP 0-9-1 adapter (RabbitMQ-compatible): the sans-IO wire codec (codec/), one connection's
state machine (session.py) and its channels (channel.py, owning publish.py, declaring.py and
reply_to.py), what connections share (broker.py, put together from registry.py, records.py,
lifetimes.py, queue_store.py, queue_work.py and blocking.py), routing (routing.py), queue rules
(queues.py), the message mapping (mapping.py) and the listener (server.py). See docs/amqp.md."""

from .server import AmqpAdapter

__all__ = ["AmqpAdapter"]
