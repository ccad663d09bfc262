"""Client sessions of the gRPC adapter: the Settings each client sent over Telemetry, keyed on its
`x-mq-client-id` (a Heartbeat before them answers UNRECOGNIZED_CLIENT_TYPE), the merged settings
reply (batch size, long polling timeout, max body size, retry back-off of the consumer group),
and forgetting clients that stopped sending Heartbeats."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from adapters.grpc.convert import dur_ms, ms_dur
from adapters.grpc.generated import definition_pb2 as d
from messaging_processor import (
    ClientContext,
    ClientInfo,
    ClientKind,
    ErrorKind,
    MessagingProcessor,
    ProcessorError,
    RetryPolicy,
)

log = logging.getLogger("adapters.grpc")

PROTOCOL = "grpc"
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_TIMEOUT_MS = 20_000
DEFAULT_REQUEST_TIMEOUT_MS = 3_000
_KIND = {
    d.PRODUCER: ClientKind.PRODUCER,
    d.PUSH_CONSUMER: ClientKind.PUSH_CONSUMER,
    d.SIMPLE_CONSUMER: ClientKind.SIMPLE_CONSUMER,
    d.PULL_CONSUMER: ClientKind.PULL_CONSUMER,
}
_PRODUCER_BACKOFF = d.RetryPolicy(
    max_attempts=3,
    exponential_backoff=d.ExponentialBackoff(initial=ms_dur(10), max=ms_dur(1000), multiplier=2.0),
)


@dataclass(slots=True)
class Session:
    """What a client told us in its last Settings."""

    client_id: str
    kind: ClientKind
    group: str
    topics: frozenset[str]
    remote: str
    language: str
    version: str
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    last_seen: float = field(default_factory=time.monotonic)

    def client_info(self) -> ClientInfo:
        return ClientInfo(
            self.client_id,
            PROTOCOL,
            self.kind,
            self.group,
            self.topics,
            self.remote,
            self.language,
            self.version,
        )


class ClientSessions:
    """The sessions of connected clients, by client id."""

    def __init__(self, processor: MessagingProcessor) -> None:
        self.processor = processor
        self.sessions: dict[str, Session] = {}

    def expire(self, max_idle_s: float) -> list[str]:
        """Forget sessions without a Heartbeat or Settings for `max_idle_s`; returns their ids."""
        cutoff = time.monotonic() - max_idle_s
        gone = [cid for cid, sess in self.sessions.items() if sess.last_seen < cutoff]
        for cid in gone:
            del self.sessions[cid]
        return gone

    async def apply(
        self, ctx: ClientContext, settings: d.Settings, transaction_check: Callable
    ) -> tuple[d.Settings, ClientInfo]:
        """Remember the client's Settings, register it and build the merged settings reply."""
        reply = d.Settings()
        reply.CopyFrom(settings)
        pub_sub = settings.WhichOneof("pub_sub")
        kind = _KIND.get(settings.client_type, ClientKind.OTHER)
        if kind is ClientKind.OTHER:
            kind = {"publishing": ClientKind.PRODUCER, "subscription": ClientKind.SIMPLE_CONSUMER}.get(
                pub_sub or "", ClientKind.OTHER
            )
        group = ""
        topics: frozenset[str] = frozenset()
        if kind is ClientKind.PRODUCER:
            topics = frozenset(t.name for t in settings.publishing.topics)
            reply.publishing.max_body_size = self.processor.limits.max_body_size
            if not settings.HasField("backoff_policy"):
                reply.backoff_policy.CopyFrom(_PRODUCER_BACKOFF)
        elif kind is not ClientKind.OTHER:
            sub = settings.subscription
            group = sub.group.name
            topics = frozenset(e.topic.name for e in sub.subscriptions)
            rs = reply.subscription
            rs.fifo = False
            rs.receive_batch_size = RECEIVE_BATCH_SIZE
            rs.long_polling_timeout.CopyFrom(ms_dur(LONG_POLLING_TIMEOUT_MS))
            reply.backoff_policy.CopyFrom(await self.consumer_backoff(group, kind))
        ua = settings.user_agent
        sess = Session(
            ctx.client_id,
            kind,
            group,
            topics,
            ctx.remote,
            d.Language.Name(ua.language) if ua.language else "",
            ua.version,
            dur_ms(settings.request_timeout)
            if settings.HasField("request_timeout")
            else DEFAULT_REQUEST_TIMEOUT_MS,
        )
        self.sessions[ctx.client_id] = sess
        info = sess.client_info()
        if kind is ClientKind.PRODUCER:
            info.transaction_check = transaction_check
        return reply, self.processor.clients.register(info)

    async def consumer_backoff(self, group: str, kind: ClientKind) -> d.RetryPolicy:
        """The group's max attempts and retry back-off. Push consumers get the schedule as
        `customized_backoff` (the Python client reads only that), others as exponential."""
        max_attempts, retry = 16, RetryPolicy()
        if group:
            try:
                g = await self.processor.get_group(group)
                max_attempts = g.max_attempts
                retry = RetryPolicy(g.retry_initial_ms, g.retry_multiplier, g.retry_max_ms)
            except ProcessorError as e:
                if e.kind is not ErrorKind.GROUP_NOT_FOUND:
                    log.warning("settings for group %s: %s; using defaults", group, e)
        policy = d.RetryPolicy(max_attempts=max_attempts)
        if kind is ClientKind.PUSH_CONSUMER:
            policy.customized_backoff.next.extend(
                ms_dur(retry.delay_ms(a)) for a in range(1, max(max_attempts, 1) + 1)
            )
        else:
            eb = policy.exponential_backoff
            eb.initial.CopyFrom(ms_dur(retry.initial_ms))
            eb.max.CopyFrom(ms_dur(retry.max_ms))
            eb.multiplier = retry.multiplier
        return policy
