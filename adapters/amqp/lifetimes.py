"""Queue lifetimes: x-expires (a queue unused for its expiry time is deleted), auto-delete (a queue
that had consumers goes with its last one) and exclusive queues (deleted with their connection).
The deletions themselves are the registry's (`drop_later`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from .queues import Queue

log = logging.getLogger("adapters.amqp")


class Owner(Protocol):
    """A connection, as the owner of exclusive queues."""

    exclusive_queues: set[Queue]


class QueueLifetimes:
    __slots__ = ("drop_later",)

    def __init__(self, drop_later: Callable[[Queue], None]) -> None:
        self.drop_later = drop_later

    def consumer_added(self, q: Queue) -> None:
        q.had_consumer = True
        if q.expiry_timer is not None:
            q.expiry_timer.cancel()
            q.expiry_timer = None
        q.wake.set()

    def consumer_removed(self, q: Queue) -> None:
        if q.deleted:
            return
        if not q.consumers:
            if q.auto_delete and q.had_consumer:
                self.drop_later(q)
                return
            self.touch(q)
            q.wake.set()

    def touch(self, q: Queue) -> None:
        """The queue was used: restart its x-expires timer (running only while it has no consumer)."""
        if q.expires is None or q.deleted:
            return
        if q.expiry_timer is not None:
            q.expiry_timer.cancel()
            q.expiry_timer = None
        if not q.consumers:
            q.expiry_timer = asyncio.get_running_loop().call_later(q.expires / 1000, self._expire, q)

    def _expire(self, q: Queue) -> None:
        q.expiry_timer = None
        if not q.consumers and not q.deleted:
            log.info("amqp: queue %r in vhost %r expired (x-expires)", q.name, q.vhost)
            self.drop_later(q)

    def connection_closed(self, conn: Owner) -> None:
        """The connection's exclusive queues go with it."""
        for q in list(conn.exclusive_queues):
            self.drop_later(q)
        conn.exclusive_queues.clear()
