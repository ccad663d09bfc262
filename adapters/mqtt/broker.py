"""What the MQTT sessions of one proxy share, composed from one object per concern:

    registry       SessionRegistry (registry.py): client-id takeover, persistent sessions, expiry, wills
    subscriptions  Subscriptions (subscriptions.py): SUBSCRIBE / UNSUBSCRIBE
    shares         Shares (shared.py): shared subscriptions' groups in this proxy
    fanout         Fanout (fanout.py): delivery of stored messages to clean and persistent sessions
    retained       Retained (retained.py): retained messages
    publisher      Publisher (publish.py): storing PUBLISHes and wills
    routes         SessionRoutes (session_routing.py): which persistent sessions' queues a send
                   also goes to (the processor's dispatcher; None without session queues)
    feed           SessionFeed (session_feed.py): the index changes shared with other proxies
                   (`--workers`; None in one process)
    events         MqttEvents (events.py): client events (`--client-events`; None without)
    sys            SysTopics (sys_topics.py): `$SYS/broker/...` (`--sys-interval`; None when 0)

A Session (session.py) calls these parts directly; the broker only builds them, starts and stops
them, and holds the proxy's fan-out name and identity.
"""

from __future__ import annotations

import uuid

from messaging_processor import ClientContext, Identity, MessagingProcessor
from messaging_processor.client_events import ClientEvents

from ..limits import Limiter
from .caps import DEFAULT_CAPS, MqttCaps
from .events import MqttEvents, with_events
from .fanout import Fanout
from .persistence import SessionState
from .publish import Publisher
from .registry import SessionRegistry
from .retained import Retained
from .session import Session
from .session_feed import SessionFeed
from .session_routing import SessionRoutes
from .shared import Shares
from .subscriptions import Subscriptions
from .sys_topics import SysRetained, SysTopics, session_copies

# Every delivery loop (clean sessions' fan-out, persistent sessions, shared subscriptions) pops as
# the proxy itself, which also positions share and persistent-session groups (an authorizer must
# allow it SUBSCRIBE; no client can present the "internal" mechanism). With security on, each
# delivery is checked against the receiving session's own rights instead (access.py).
PROXY_IDENTITY = Identity("$mqtt-proxy", None, "internal")


class Broker:
    def __init__(
        self,
        processor: MessagingProcessor,
        *,
        max_packet_size: int = 1 << 20,
        topic_scan_interval: float = 1.0,
        max_keep_alive: int = 0,
        caps: MqttCaps = DEFAULT_CAPS,
        session_queues: bool = True,
        shared_sessions: bool = False,
        events: ClientEvents | None = None,
        sys_interval: float = 0,
        limiter: Limiter | None = None,
    ) -> None:
        """`session_queues`: persistent sessions get a queue each (not in CLUSTER mode, whose
        stores take one topic per send: session_routing.py). `shared_sessions`: other proxies
        serve the same sessions (`--workers`): the index changes go through the feed
        (session_feed.py). `events`: the client events emitter (None: no events);
        `sys_interval`: seconds between `$SYS` updates (0: none)."""
        self.processor = processor
        self.max_packet_size = max_packet_size
        self.max_keep_alive = max_keep_alive  # 0: accept what the client asks for
        self.caps = caps
        self.group = f"%MQTT_FANOUT_{uuid.uuid4().hex}"  # names the fan-out in traces only
        ctx = ClientContext("mqtt", client_id=self.group, identity=PROXY_IDENTITY)
        retained = SysRetained if sys_interval > 0 else Retained
        self.retained = retained(processor, caps.max_retained_messages, caps.max_retained_bytes)
        self.fanout = Fanout(processor, ctx, self.group, topic_scan_interval)
        self.publisher = Publisher(processor, self.fanout, self.retained, caps)
        self.shares = Shares(processor, ctx)
        self.routes = SessionRoutes() if session_queues else None
        self.feed = (
            SessionFeed(processor, ctx, self.routes) if self.routes is not None and shared_sessions else None
        )
        if self.feed is not None:
            self.routes.feed = self.feed.publish  # type: ignore[union-attr]
        self._copier = None
        if events is not None:
            self.events: MqttEvents | None = MqttEvents(events)
            if self.routes is not None:  # persistent sessions' queues get the events too
                routes = self.routes
                self._copier = lambda ms: session_copies(routes, ms)
                events.copiers.append(self._copier)
            subscriptions = with_events(Subscriptions, events)
            self.subscriptions = subscriptions(
                processor, self.fanout, self.retained, self.shares, self.routes
            )
        else:
            self.events = None
            self.subscriptions = Subscriptions(
                processor, self.fanout, self.retained, self.shares, self.routes
            )
        self.sys = SysTopics(self, sys_interval, limiter) if sys_interval > 0 else None
        if isinstance(self.retained, SysRetained):
            self.retained.sys = self.sys
        self.registry = SessionRegistry(
            processor, self.subscriptions, self.publisher.publish, caps, self.routes
        )

    @property
    def sessions(self) -> dict[str, Session]:
        """Connected sessions by client id."""
        return self.registry.sessions

    @property
    def states(self) -> dict[str, SessionState]:
        """This proxy's persistent sessions by client id."""
        return self.registry.states

    async def start(self) -> None:
        """Restore the persistent sessions an earlier run saved."""
        if self.routes is not None:
            self.processor.add_dispatcher(self.routes.dispatch)
        await self.registry.start()
        if self.feed is not None:  # (after the restore: the feed's newer changes win)
            await self.feed.start()
        await self.retained.start()
        if self.sys is not None:
            await self.sys.start()

    async def close(self) -> None:
        """Close every connection (persistent sessions are saved with their disconnect time, their
        in-flight messages made visible again), stop the fan-out loops."""
        if self.sys is not None:
            await self.sys.close()
        if self.events is not None:
            self.events.stopping = True
            if self._copier in self.events.events.copiers:
                self.events.events.copiers.remove(self._copier)
        self.registry.close_connections()
        await self.fanout.close()
        await self.retained.close()
        await self.registry.close()
        if self.feed is not None:
            await self.feed.close()
        if self.routes is not None:
            self.processor.remove_dispatcher(self.routes.dispatch)


__all__ = ["Broker", "PROXY_IDENTITY"]
