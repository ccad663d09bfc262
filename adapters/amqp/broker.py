"""What the AMQP connections of one proxy share, put together: the declarations (registry.py, with
queue lifetimes in lifetimes.py and their durable records in records.py), the queues' topics and
groups in the store (queue_store.py), the broker's own work on messages (queue_work.py),
connection.blocked (blocking.py), direct reply-to registrations, authorization and settings.

Mapping (docs/amqp.md): a queue is a store topic with one queue (FIFO) plus the consumer group of
the same name (`mapping.store_name`). A publish is routed by its exchange when it arrives
(`routing.VHost.route`) and stored once per destination queue (fanout to N queues = N appends in one
processor.send, so one group commit): each queue is then an independent array with exact counts,
purge, limits and deletion, and a binding change never re-routes what was already published. A new
queue starts empty (its group is positioned at the end of its topic). Consumption pops the queue's
group.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from messaging_processor import (
    Action,
    ClientContext,
    Identity,
    MessagingProcessor,
    ProcessorError,
    Resource,
)
from messaging_processor.client_events import ClientEvents
from messaging_processor.ownership import OwnerLeases, this_process

from .blocking import Blocking
from .bridge import ExchangeBridge
from .codec import AMQPError, ReplyCode
from .queue_store import QueueStore
from .queue_work import QueueWork
from .records import LEASES_NS, Records
from .registry import Registry
from .routing import VHost

if TYPE_CHECKING:
    from .reply_to import DirectReplyTo
    from .session import Connection

PROXY_IDENTITY = Identity("$amqp-proxy", None, "internal")


class Broker:
    def __init__(
        self,
        processor: MessagingProcessor,
        *,
        invisible_time_ms: int = 60_000,
        consumer_timeout_ms: int = 1_800_000,
        long_poll_ms: int = 20_000,
        max_inflight_publishes: int = 20_000,
        mqtt_exchange: str = "amq.topic",
        max_queues_per_vhost: int = 0,
        max_queues_per_user: int = 0,
        events: ClientEvents | None = None,
    ) -> None:
        """`events`: client events (events.py and the event exchange of bridge.py; None: none)."""
        self.processor = processor
        self.events = events
        self.max_queues_per_vhost = max_queues_per_vhost  # 0: no cap (RabbitMQ's default)
        self.invisible_time_ms = invisible_time_ms
        self.consumer_timeout_ms = consumer_timeout_ms
        self.long_poll_ms = long_poll_ms
        self.max_inflight_publishes = max_inflight_publishes
        limits = processor.limits  # AMQP's own body limit if the processor has one (amqp_max_body_size)
        self.max_body_size = limits.body_sizes.get("amqp", limits.max_body_size)
        self.secured = processor.security is not None  # authentication and the ACL are on
        self.ctx = ClientContext("amqp", client_id="$amqp-broker", identity=PROXY_IDENTITY)
        self.vhosts: dict[str, VHost] = {}
        self.reply_channels: dict[str, DirectReplyTo] = {}  # direct reply-to tokens
        self._tasks: set[asyncio.Task] = set()
        self.blocking = Blocking()
        self.queue_store = QueueStore(processor, self.ctx)
        self.work = QueueWork(
            processor, self.ctx, self.vhosts, self.queue_store.ready_count, self.blocking.block, self.spawn
        )
        self.leases = OwnerLeases(processor, this_process(), LEASES_NS)
        self.registry = Registry(
            self.vhosts,
            Records(processor),
            self.queue_store,
            self.authorize,
            self.work.start_sweeper,
            self.spawn,
            self.leases,
        )
        self.work.missing_topics = self.registry.missing_topics
        self.registry.max_queues_per_vhost = max_queues_per_vhost
        self.registry.max_queues_per_user = max_queues_per_user  # 0: no cap (as RabbitMQ)
        self.lifetimes = self.registry.lifetimes
        # the MQTT exchange of vhost "/" ("" = none): RabbitMQ's MQTT convention (bridge.py)
        self.bridge = ExchangeBridge(
            processor,
            self.ctx,
            self.registry.vhost,
            self.work,
            mqtt_exchange,
            events=events is not None,
            # appends of passed-over paths wake no routing loop: its offset trails by at most this
            long_poll_ms=min(long_poll_ms, 1_000),
        )

    async def start(self) -> None:
        await self.leases.start()  # before the records this proxy writes: they name it
        await self.registry.start()
        await self.bridge.start()

    async def close(self) -> None:
        await self.bridge.close()
        self.work.close()
        self.blocking.close()
        self.registry.close()
        if self._tasks:  # queue deletions under way (exclusive owners gone): let them finish
            await asyncio.wait(list(self._tasks), timeout=2.0)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):  # the store may be gone already
            await self.registry.forget()
        await self.leases.close()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def connection_closed(self, conn: Connection) -> None:
        self.blocking.leave(conn)
        self.lifetimes.connection_closed(conn)

    async def authorize(
        self, conn: Connection, action: Action, resource: Resource, cls: int, mid: int, what: str = ""
    ) -> None:
        """403 ACCESS_REFUSED (a channel error) unless the connection's user may `action` `resource`;
        `what` names it in RabbitMQ's words ("queue 'q'"). With security on this is the ACL
        (processor.permits, cached per connection); without, the processor's authorizer if any."""
        p = self.processor
        if p.security is not None:
            if not p.permits(conn.ctx.identity, action, resource):
                raise AMQPError(ReplyCode.ACCESS_REFUSED, refused(conn, what), class_id=cls, method_id=mid)
            return
        if p.authorizer is None:
            return
        try:
            await p.authorize(conn.ctx.identity, action, resource)
        except ProcessorError as e:
            raise AMQPError(ReplyCode.ACCESS_REFUSED, e.message, class_id=cls, method_id=mid) from None


def refused(conn: Connection, what: str) -> str:
    """RabbitMQ's text of a refused action: "access to queue 'q' in vhost '/' refused for user 'u'"."""
    vh = conn.vhost_obj.name if conn.vhost_obj is not None else "/"
    return f"access to {what} in vhost '{vh}' refused for user '{conn.ctx.identity.username or ''}'"
