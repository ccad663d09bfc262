"""Direct reply-to (RabbitMQ's amq.rabbitmq.reply-to) of one channel: its reply consumer
(basic.consume on the pseudo-queue, no-ack), the reply_to property of its requests, and replies
published to amq.rabbitmq.reply-to.<token>, delivered straight to the requesting channel (no queue,
no store)."""

from __future__ import annotations

import os
from collections.abc import Callable, Container

from .codec import AMQPError, BasicConsume, ReplyCode

REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_TO + "."

# deliver(consumer tag, routing key, raw properties, body) -> delivered (False: channel not open)
Deliver = Callable[[str, str, bytes, bytes], bool]


class DirectReplyTo:
    __slots__ = ("token", "tag", "_registry", "_deliver")

    def __init__(self, registry: dict[str, DirectReplyTo], deliver: Deliver) -> None:
        self.token = ""  # set while the channel has a reply consumer
        self.tag = ""
        self._registry = registry  # every channel's, by token (the broker's)
        self._deliver = deliver

    def consume(self, m: BasicConsume, consumer_tags: Container[str]) -> str:
        """Start the reply consumer; its consumer tag."""
        if not m.no_ack:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, "reply consumer cannot acknowledge", class_id=60, method_id=20
            )
        if self.token:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, "reply consumer already set", class_id=60, method_id=20
            )
        tag = m.consumer_tag or "amq.ctag-" + os.urandom(16).hex()
        if tag in consumer_tags:
            raise AMQPError(
                ReplyCode.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", class_id=60, method_id=20
            )
        self.token = os.urandom(16).hex()
        self.tag = tag
        self._registry[self.token] = self
        return tag

    def cancel(self, tag: str) -> None:
        if self.token and tag == self.tag:
            self.release()

    def release(self) -> None:
        if self.token:
            self._registry.pop(self.token, None)
            self.token = ""

    def reply_to(self) -> str:
        """The reply_to of a request published with reply_to = amq.rabbitmq.reply-to (406 without a
        reply consumer)."""
        if not self.token:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, "fast reply consumer does not exist", class_id=60, method_id=40
            )
        return f"{REPLY_TO}.{self.token}"

    def send(self, rk: str, raw: bytes, body: bytes) -> bool:
        """A reply published to the default exchange with routing key amq.rabbitmq.reply-to.<token>:
        delivered to that token's channel (False: no such reply consumer)."""
        target = self._registry.get(rk[len(REPLY_PREFIX) :])
        return target is not None and bool(target.token) and target._deliver(target.tag, rk, raw, body)
