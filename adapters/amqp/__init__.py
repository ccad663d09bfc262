"""AMQP 0-9-1 adapter (RabbitMQ-compatible): the sans-IO wire codec (codec/), one connection's
state machine (session.py) and its channels (channel.py), what connections share (broker.py:
vhosts, exchanges, queues, bindings), routing (routing.py), queue rules (queues.py), the message
mapping (mapping.py) and the listener (server.py). See docs/amqp.md."""

from .server import AmqpAdapter

__all__ = ["AmqpAdapter"]
