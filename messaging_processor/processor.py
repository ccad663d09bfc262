"""MessagingProcessor: the one protocol-neutral API every adapter calls.

It validates requests, authorizes them through a pluggable hook, maps store failures to
`ErrorKind`s, counts traffic, keeps the client registry and routes transaction checks back to
connected producers. Storage is reached only through a `StoreClient`."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from collections.abc import Set as AbstractSet
from time import time_ns

from store import (
    ALL,
    AppendResult,
    CompactionStats,
    Filter,
    GroupConfig,
    Message,
    MessageType,
    RetryPolicy,
    TopicConfig,
)
from store.raw_range import RawRange

from .dispatch import Dispatcher, Dispatchers
from .errors import ErrorKind, ProcessorError, StoreCall, store_error, store_failed
from .metrics import Metrics
from .model import (
    Action,
    ClientContext,
    Delivery,
    GroupInfo,
    Identity,
    Permission,
    QueueRoute,
    Resource,
    Route,
    SendReceipt,
    TopicInfo,
)
from .registry import ClientRegistry
from .security import AuthFailure, Grant, Security
from .store_client import StoreClient
from .tracing import (
    DELIVERED,
    DELIVERED_FIELDS,
    GATEWAY_TRACEPARENT,
    HANDLED,
    STORED,
    TRACE_TOPIC,
    TRACEPARENT,
    TraceRecorder,
    context_of,
    derivable_id,
    format_traceparent,
    match_traceparent,
    next_trace_sequence,
    traceparent_of,
)
from .validation import Limits, check_group, check_invisible_time, check_message, check_topic

log = logging.getLogger("messaging_processor")
audit = logging.getLogger("messaging_processor.audit")

# Identity mechanisms that present a user name and password.
PASSWORD_MECHANISMS = frozenset({"password", "plain", "amqplain", "mqtt-password", "http-basic"})
# An identity taken from a client certificate the adapter's TLS layer verified (the CN is the user).
CERTIFICATE_MECHANISM = "tls-client-cert"

Authorizer = Callable[[Identity, Action, Resource], bool | Awaitable[bool]]

# Internal properties the store adds to redirected (delayed / half) messages.
_INTERNAL_PROPS = ("__REAL_TOPIC", "__REAL_QID", "TRANSACTION_CHECK_TIMES")
# who trace events of the store's own moves (a dead letter after the last attempt) are from
_STORE_CTX = ClientContext("store", client_id="store")
# Dead letters (admin browser and redrive): the DLQ topic prefix, the bookkeeping properties a move
# to the DLQ adds (store/popping.py `_to_dlq`, the 4.x send-back), and the kv namespace that keeps
# which DLQ records were redriven ("<group>/<queue>/<offset>" -> the new message's id).
DLQ_PREFIX = "%DLQ%"
DLQ_PROPS = (
    "ORIGIN_TOPIC",
    "ORIGIN_MESSAGE_ID",
    "ORIGIN_QUEUE_ID",
    "ORIGIN_QUEUE_OFFSET",
    "RECONSUME_TIMES",
    "DLQ_REASON",
    "RETRY_TOPIC",
    *_INTERNAL_PROPS,
)
REDRIVEN_NS = "dlq.redriven"


def ensure_traceparents(messages: Sequence[Message]) -> list[tuple[int, str]] | None:
    """[(index, traceparent)] of the messages of a send that carry a trace context (None: none does).
    A client's `traceparent` stays as sent (an invalid one is no context); a message without one is
    traced by its id (trace_context.py), unless the id is not hex or its properties dict is shared
    with the message before (copies of one publish: one trace): those get a new one, in place, in the
    internal `__TRACEPARENT`. C-level callables only: the send path enters no other module."""
    out = None
    prev = None
    for i, m in enumerate(messages):
        p = m.properties
        tp = p.get(TRACEPARENT)
        if tp is None or len(tp) != 55 or match_traceparent(tp) is None:
            tp = p.get(GATEWAY_TRACEPARENT)  # (an invalid client one is kept as sent, not followed)
        if tp is None:
            mid = m.message_id
            if p is not prev and (not mid or derivable_id(mid[-32:]) is not None):
                prev = p
                continue
            tp = p[GATEWAY_TRACEPARENT] = format_traceparent(next_trace_sequence())
            if p is prev:  # (the copy before shares it)
                out = out or []
                out.append((i - 1, tp))
        prev = p
        out = out or []
        out.append((i, tp))
    return out


def allow_all(identity: Identity, action: Action, resource: Resource) -> bool:
    """The default authorizer: every identity may do everything."""
    return True


class MessagingProcessor:
    """Protocol-neutral send / pop / ack / route / admin over a StoreClient.

    `auto_create_topics`: whether sending to (or routing) an unknown topic creates it. Adapters
    whose protocol has no topic declaration (MQTT) pass `auto_create=True` per call."""

    def __init__(
        self,
        store: StoreClient,
        *,
        limits: Limits | None = None,
        auto_create_topics: bool = False,
        authorizer: Authorizer | None = None,
        security: Security | None = None,
        client_idle_expiry_s: float = 120.0,
        tracer: TraceRecorder | None = None,
    ) -> None:
        self.store = store
        self.tracer = tracer  # None: no message trace (and no traceparent made for messages without one)
        self.limits = limits or Limits()
        self.auto_create_topics = auto_create_topics
        self.security = security  # None: no authentication (every identity may do everything)
        self.authorizer: Authorizer | None = self._acl_allows if security is not None else authorizer
        self.clients = ClientRegistry()
        self.metrics = Metrics()
        self.client_idle_expiry_s = client_idle_expiry_s
        self._known_topics: set[str] = set()
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self.dispatchers = Dispatchers()  # extra queues a sent message also goes to (dispatch.py)

    def add_dispatcher(self, fn: Dispatcher) -> None:
        """Have every send also store each message in the topics `fn(message)` names (dispatch.py)."""
        self.dispatchers.add(fn)

    def remove_dispatcher(self, fn: Dispatcher) -> None:
        self.dispatchers.remove(fn)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Hook into the store (transaction checks) and start housekeeping."""
        self.store.set_transaction_checker(self._check_transaction)
        if self.security is not None:
            await self.security.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._expire_clients()))
        if self.tracer is not None:
            await self.tracer.start()
            listen = getattr(self.store, "set_dead_letter_listener", None)
            if listen is not None:  # moves the store makes itself after a group's last attempt
                listen(self._traced_dead_letter)

    def _traced_dead_letter(self, group: str, msg: Message, reason: str) -> None:
        if self.tracer is not None:
            self.tracer.message_event(
                _STORE_CTX, "dead_lettered", msg.message_id, f"{reason}, group {group}", traceparent_of(msg)
            )

    async def close(self) -> None:
        """Stop housekeeping. The store is closed by whoever opened it."""
        self._closing = True
        self.store.set_transaction_checker(None)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        if self.tracer is not None:
            with contextlib.suppress(Exception):
                await self.tracer.close()
        if self.security is not None:
            await self.security.close()

    async def _expire_clients(self) -> None:
        while True:
            await asyncio.sleep(max(self.client_idle_expiry_s / 4, 1))
            for c in self.clients.expire(self.client_idle_expiry_s):
                log.info(
                    "client %s (%s) expired after %.0f s idle",
                    c.client_id,
                    c.protocol,
                    self.client_idle_expiry_s,
                )

    # ------------------------------------------------------------------ authentication
    async def authenticate(self, ctx: ClientContext, content: bytes = b"") -> None:
        """With `security` on, verify `ctx.identity`'s credentials and replace it with the verified
        identity (its `principal` set, the secret dropped); ProcessorError(UNAUTHORIZED) otherwise,
        saying nothing about which part was wrong. `content`: what a remoting signature signs.
        No credentials at all (mechanism "none"): the anonymous principal when `allow_anonymous`
        (user name None). Without security every identity is let in as it is."""
        sec = self.security
        if sec is None:
            return
        ident = ctx.identity
        attrs = dict(ident.attributes)
        mech = ident.mechanism
        try:
            if mech in PASSWORD_MECHANISMS and ident.username and ident.secret is not None:
                p = await sec.login_password(ident.username, ident.secret, ctx.protocol, ctx.client_id)
            elif mech == "bearer" and ident.secret:
                p = sec.login_token(ident.secret, ctx.protocol, ctx.client_id)
            elif mech == "mqv2-hmac-sha1" and ident.username:
                p = await sec.login_grpc(
                    ident.username,
                    attrs.get("signature", ""),
                    attrs.get("x-mq-date-time", ""),
                    ctx.protocol,
                    ctx.client_id,
                )
            elif mech == "remoting-acl" and ident.username:
                p = await sec.login_remoting(
                    ident.username, attrs.get("signature", ""), content, ctx.protocol, ctx.client_id
                )
            elif mech == CERTIFICATE_MECHANISM and ident.username:
                p = await sec.login_certificate(ident.username, ctx.protocol, ctx.client_id)
            elif mech == "internal":
                return
            elif mech == "none":  # no credentials at all: the anonymous principal, if allowed
                p = sec.login_anonymous(ctx.protocol, ctx.client_id)
            elif mech in PASSWORD_MECHANISMS:  # no whole user name and password: never anonymous
                raise AuthFailure("missing_credentials")
            else:
                raise AuthFailure("unsupported_mechanism")
        except AuthFailure as e:
            self.metrics.auth_failures[(ctx.protocol, e.reason)] += 1
            audit.warning(
                "login refused: protocol=%s remote=%s user=%r reason=%s",
                ctx.protocol,
                ctx.remote or "-",
                ident.username or "",
                e.reason,
            )
            raise ProcessorError(ErrorKind.UNAUTHORIZED, "authentication failed") from None
        ctx.identity = Identity(None if p.anonymous else p.user, None, mech, (), p)

    def permits(self, identity: Identity, action: Action, resource: Resource) -> bool:
        """Whether `identity` may `action` `resource`: the one ACL check (cached per connection).
        A refusal is counted each time and logged once per connection and resource."""
        sec = self.security
        if sec is None:
            return True
        p = identity.principal
        if p is None:
            if identity.mechanism == "internal":  # the proxy's own loops (never a client's identity)
                return True
            self.metrics.acl_denials[("", action.value)] += 1
            return False
        ok, first = sec.permits(p, action.value, resource.kind, resource.name)
        if not ok:
            self.metrics.acl_denials[(p.protocol, action.value)] += 1
            if first:
                audit.warning(
                    "denied: protocol=%s client=%s user=%r action=%s resource=%s",
                    p.protocol,
                    p.client_id or "-",
                    p.user,
                    action.value,
                    resource,
                )
        return ok

    def _may_publish(self, identity: Identity, path: str) -> bool:
        """`permits(PUBLISH, topic path)` with the cached allow answered first (the send path)."""
        p = identity.principal
        sec = self.security
        if (
            p is not None
            and sec is not None
            and p.version == sec.directory.version
            and p.decisions.get(("publish", "topic", path))
        ):
            return True
        return self.permits(identity, Action.PUBLISH, Resource("topic", path))

    def grant_subscription(self, identity: Identity, topic_filter: str) -> Grant:
        """An MQTT-style subscription filter's decision: DENY, ALLOW, or CHECK (then each delivered
        path must pass `permits(SUBSCRIBE)`)."""
        sec = self.security
        if sec is None or identity.mechanism == "internal":
            return Grant.ALLOW
        p = identity.principal
        g = Grant.DENY if p is None else sec.grant(p, topic_filter)
        if g is Grant.DENY:
            self.permits(identity, Action.SUBSCRIBE, Resource("topic", topic_filter))  # count and log
        return g

    def may_open_vhost(self, identity: Identity, vhost: str) -> bool:
        """Whether `identity` may open the AMQP virtual host `vhost`."""
        sec = self.security
        if sec is None:
            return True
        p = identity.principal
        return p is not None and sec.may_open_vhost(p, vhost)

    def _acl_allows(self, identity: Identity, action: Action, resource: Resource) -> bool:
        if action is Action.CONNECT:
            return identity.principal is not None or identity.mechanism == "internal"
        return self.permits(identity, action, resource)

    # ------------------------------------------------------------------ authorization
    async def authorize(self, identity: Identity, action: Action, resource: Resource) -> None:
        """Raise ProcessorError(FORBIDDEN) unless `action` on `resource` is allowed (UNAUTHORIZED
        for CONNECT without a verified identity when security is on)."""
        fn = self.authorizer
        if fn is None:
            return
        ok = fn(identity, action, resource)
        if inspect.isawaitable(ok):
            ok = await ok
        if not ok:
            kind = (
                ErrorKind.UNAUTHORIZED
                if action is Action.CONNECT and self.security is not None
                else ErrorKind.FORBIDDEN
            )
            raise ProcessorError(
                kind, f"{identity.username or 'anonymous'} may not {action.value} {resource}"
            )

    # ------------------------------------------------------------------ topics
    async def _ensure_topic(self, topic: str, auto_create: bool | AbstractSet[str] | None) -> None:
        if topic in self._known_topics:
            return
        if await self.store.get_topic(topic) is None:
            if auto_create is None:
                auto_create = self.auto_create_topics
            elif not isinstance(auto_create, bool):
                auto_create = topic in auto_create
            if not auto_create:
                raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
            with StoreCall(None, "", ""):
                await self.store.create_topic(topic, None, None, None)
            log.info("topic %s created on first use", topic)
        self._known_topics.add(topic)

    # ------------------------------------------------------------------ send
    async def send(
        self,
        ctx: ClientContext,
        messages: Sequence[Message],
        *,
        auto_create: bool | AbstractSet[str] | None = None,
        receipts: bool = True,
    ) -> list[SendReceipt]:
        """Store messages; returns once every one is durable per the store's flush policy.
        With `receipts=False` it returns [] (callers that only need "stored" skip building them).
        `auto_create`: whether a missing topic is created (None: `auto_create_topics`; a set: only
        those topics are).

        All messages are validated before any is stored. A store failure raises ProcessorError;
        messages of the batch stored before it stay stored (producers retry, as in RocketMQ)."""
        limits = self.limits
        now = time_ns() // 1_000_000  # (now_ms inlined: one call less per send)
        topics: set[str] = set()
        max_body = limits.body_sizes.get(ctx.protocol, limits.max_body_size)
        for m in messages:
            check_message(m, limits, now, max_body)
            if m.msg_type == MessageType.FIFO and not m.message_group:
                raise ProcessorError(ErrorKind.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group")
            topics.add(m.topic)
        if not messages:
            raise ProcessorError(ErrorKind.BAD_REQUEST, "no messages to send")
        if len(messages) > limits.max_batch:
            raise ProcessorError(ErrorKind.BAD_REQUEST, f"more than {limits.max_batch} messages in one send")
        if self.security is not None:
            allowed: set[str] = set()  # a batch's messages mostly share a path: check each path once
            for m in messages:  # the ACL path: the MQTT topic, else <topic> or <topic>/<tag>
                path = m.properties.get("mqtt.topic") or (f"{m.topic}/{m.tag}" if m.tag else m.topic)
                if path in allowed:
                    continue
                if not self._may_publish(ctx.identity, path):
                    raise ProcessorError(ErrorKind.FORBIDDEN, f"may not publish to {path}")
                allowed.add(path)
        elif self.authorizer is not None:
            for t in topics:
                await self.authorize(ctx.identity, Action.PUBLISH, Resource("topic", t))
        for t in topics:
            await self._ensure_topic(t, auto_create)
        tracer = self.tracer
        if tracer is not None:
            tps = ensure_traceparents(messages)  # (kept, not the messages: nothing big outlives the send)
        copies = self.dispatchers.copies(messages) if self.dispatchers else None
        try:
            if copies:  # (in the same write: durable together, dispatch.py)
                results = (await self.store.append_many([*messages, *copies]))[: len(messages)]
            elif len(messages) == 1:
                results: list[AppendResult] = [await self.store.append(messages[0])]
            else:
                results = await self.store.append_many(list(messages))
        except Exception as e:  # noqa: BLE001
            err = store_error(e)
            self.metrics.errors[(ctx.protocol, "send", err.kind.value)] += 1
            if err.kind is ErrorKind.TOPIC_NOT_FOUND:
                self._known_topics.difference_update(topics)
            raise err from e
        if tracer is not None:  # (a list append: the recorder builds the rows when it writes)
            tracer.pending.append((STORED, now, ctx, tps, results))
            if len(tracer.pending) >= tracer.max_buffered:
                tracer.wake()
        counts, nbytes = self.metrics.messages_in, self.metrics.bytes_in
        if len(topics) == 1:
            key = (ctx.protocol, messages[0].topic)
            counts[key] += len(messages)
            nbytes[key] += len(messages[0].body) if len(messages) == 1 else sum(len(m.body) for m in messages)
        else:
            for m in messages:
                counts[(ctx.protocol, m.topic)] += 1
                nbytes[(ctx.protocol, m.topic)] += len(m.body)
        if not receipts:
            return []
        out = []
        for m, r in zip(messages, results, strict=True):
            out.append(
                SendReceipt(
                    r.message_id,
                    r.topic,
                    r.queue_id,
                    r.queue_offset,
                    r.commitlog_offset,
                    r.store_timestamp,
                    str(r.commitlog_offset) if m.msg_type == MessageType.TRANSACTION else "",
                )
            )
        return out

    # ------------------------------------------------------------------ consume
    async def pop(
        self,
        ctx: ClientContext,
        group: str,
        topic: str,
        *,
        filter: Filter = ALL,
        max_messages: int = 32,
        invisible_time_ms: int = 30_000,
        long_poll_ms: int = 0,
    ) -> list[Delivery]:
        """Pop up to `max_messages` visible messages of `topic` for `group` (any queue), each
        invisible until acked or `invisible_time_ms` passes. `long_poll_ms` waits for arrivals."""
        limits = self.limits
        check_group(group, limits)
        check_topic(topic, limits)
        check_invisible_time(invisible_time_ms, limits)
        if not 1 <= max_messages <= limits.max_batch:
            raise ProcessorError(ErrorKind.BAD_REQUEST, f"max messages must be 1 to {limits.max_batch}")
        if long_poll_ms < 0:
            raise ProcessorError(ErrorKind.ILLEGAL_POLLING_TIME, "long polling time must not be negative")
        long_poll_ms = min(long_poll_ms, limits.max_long_poll_ms)
        if self.authorizer is not None:
            await self.authorize(ctx.identity, Action.SUBSCRIBE, Resource("topic", topic))
            await self.authorize(ctx.identity, Action.SUBSCRIBE, Resource("group", group))
        try:  # (not `with StoreCall`: no exit call on the hot path)
            popped = await self.store.pop(group, topic, max_messages, invisible_time_ms, filter, long_poll_ms)
        except Exception as e:  # noqa: BLE001 - mapped and counted
            store_failed(self.metrics, ctx.protocol, "pop", e)
        if not popped:
            return []
        tracer = self.tracer
        if tracer is not None:
            tracer.pending.append(
                (DELIVERED, time_ns() // 1_000_000, ctx, group, list(map(DELIVERED_FIELDS, popped)))
            )
            if len(tracer.pending) >= tracer.max_buffered:
                tracer.wake()
        m = self.metrics
        m.pops[ctx.protocol] += 1
        m.messages_out[(ctx.protocol, topic)] += len(popped)
        m.deliveries[(group, topic, ctx.protocol)] += len(popped)
        out = []
        for p in popped:
            d = Delivery(p.message, p.receipt_handle, p.invisible_until, p.message.reconsume_times + 1)
            if d.delivery_attempt > 1:
                m.redeliveries[(ctx.protocol, topic)] += 1
                m.group_redeliveries[(group, topic, ctx.protocol)] += 1
            out.append(d)
        return out

    async def ack(self, ctx: ClientContext, handle: str) -> None:
        """Acknowledge a delivery: it is done for its group."""
        try:
            await self.store.ack(handle)
        except Exception as e:  # noqa: BLE001 - mapped and counted
            store_failed(self.metrics, ctx.protocol, "ack", e)
        self.metrics.acks[ctx.protocol] += 1
        tracer = self.tracer
        if tracer is not None:
            tracer.pending.append((HANDLED, time_ns() // 1_000_000, ctx, "acked", handle, None, None))
            if len(tracer.pending) >= tracer.max_buffered:
                tracer.wake()

    async def ack_many(self, ctx: ClientContext, handles: Sequence[str]) -> list[ProcessorError | None]:
        """Acknowledge several deliveries with one store call (one per store node in CLUSTER mode);
        per handle None (acked) or the ProcessorError it failed with (the others are acked all the
        same). An error of the whole call (the store is closing, a node is down) is raised."""
        if not handles:
            return []
        try:
            errors = await self.store.ack_many(handles)
        except Exception as e:  # noqa: BLE001 - mapped and counted
            store_failed(self.metrics, ctx.protocol, "ack", e)
        out: list[ProcessorError | None] = []
        tracer = self.tracer
        ms = time_ns() // 1_000_000
        for handle, e in zip(handles, errors, strict=True):
            if e is None:
                out.append(None)
                if tracer is not None:
                    tracer.pending.append((HANDLED, ms, ctx, "acked", handle, None, None))
                continue
            out.append(StoreCall.failure(self.metrics, ctx.protocol, "ack", e))
        self.metrics.acks[ctx.protocol] += out.count(None)
        if tracer is not None and len(tracer.pending) >= tracer.max_buffered:
            tracer.wake()
        return out

    async def change_invisible_time(self, ctx: ClientContext, handle: str, invisible_time_ms: int) -> str:
        """Make a delivery visible again `invisible_time_ms` from now; returns the new handle
        (the old one stops working)."""
        check_invisible_time(invisible_time_ms, self.limits)
        with StoreCall(self.metrics, ctx.protocol, "change_invisible_time"):
            new = await self.store.change_invisible_time(handle, invisible_time_ms)
        self.metrics.nacks[ctx.protocol] += 1
        if self.tracer is not None:
            self.tracer.handled(ctx, "invisible_time_changed", handle, new, f"{invisible_time_ms} ms")
        return new

    async def nack(self, ctx: ClientContext, handle: str) -> str:
        """Give a delivery back for a retry after its group's back-off; returns the new handle."""
        with StoreCall(self.metrics, ctx.protocol, "nack"):
            new = await self.store.nack(handle)
        self.metrics.nacks[ctx.protocol] += 1
        if self.tracer is not None:
            self.tracer.handled(ctx, "nacked", handle, new)
        return new

    async def forward_to_dlq(self, ctx: ClientContext, handle: str, reason: str = "forwarded") -> SendReceipt:
        """Move a delivery to its group's dead-letter topic `%DLQ%<group>` now, and ack it."""
        with StoreCall(self.metrics, ctx.protocol, "forward_to_dlq"):
            r = await self.store.forward_to_dlq(handle, reason)
        self.metrics.dlq[(ctx.protocol, r.topic)] += 1
        if self.tracer is not None:
            detail = f"{reason}: {r.topic}/{r.queue_id}/{r.queue_offset}"
            self.tracer.handled(ctx, "dead_lettered", handle, None, detail)
        return SendReceipt(
            r.message_id, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset, r.store_timestamp
        )

    # ------------------------------------------------------------------ transactions
    async def end_transaction(
        self, ctx: ClientContext, transaction_id: str, commit: bool, *, message_id: str = ""
    ) -> SendReceipt | None:
        """Commit (deliver) or roll back a half message. `transaction_id` is the one the send
        receipt gave; `message_id` is a fallback. Returns where a committed message landed."""
        tid: int | str
        try:
            tid = int(transaction_id)
        except ValueError:
            if not message_id:
                raise ProcessorError(
                    ErrorKind.TRANSACTION_NOT_FOUND, f"unknown transaction id {transaction_id!r}"
                ) from None
            tid = message_id
        with StoreCall(self.metrics, ctx.protocol, "end_transaction"):
            r = await self.store.end_transaction(tid, commit)
        if r is None:
            return None
        if commit and self.dispatchers:  # a committed message's copies (dispatch.py): a write of
            # their own after the commit (a crash between the two loses them, not the message)
            with StoreCall(self.metrics, ctx.protocol, "end_transaction"):
                stored = await self.store.get_message(r.commitlog_offset)
                copies = self.dispatchers.copies_of_committed(stored, r.topic)
                if copies:
                    await self.store.append_many(copies)
        self.metrics.messages_in[(ctx.protocol, r.topic)] += 1
        return SendReceipt(
            r.message_id, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset, r.store_timestamp
        )

    async def _check_transaction(self, half: Message) -> None:
        """Store callback for an unresolved half message: ask one connected producer of its topic."""
        topic = half.properties.get("__REAL_TOPIC", half.topic)
        tid = str(half.commitlog_offset)
        props = {k: v for k, v in half.properties.items() if k not in _INTERNAL_PROPS}
        msg = Message(
            topic=topic,
            body=half.body,
            tag=half.tag,
            keys=half.keys,
            properties=props,
            message_group=half.message_group,
            message_id=half.message_id,
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            msg_type=MessageType.TRANSACTION,
            store_timestamp=half.store_timestamp,
            queue_offset=half.queue_offset,
            commitlog_offset=half.commitlog_offset,
        )
        for client in self.clients.transaction_checkers(topic):
            try:
                await client.transaction_check(msg, tid)  # type: ignore[misc]
                return
            except Exception as e:  # noqa: BLE001 - try the next producer
                log.warning("transaction check via %s failed: %s", client.client_id, e)
        log.info("no producer of %s can check transaction %s now; asking again later", topic, tid)

    # ------------------------------------------------------------------ routes and admin
    async def query_route(self, ctx: ClientContext, topic: str, *, auto_create: bool | None = None) -> Route:
        """The queues of `topic` (creating it when allowed)."""
        check_topic(topic, self.limits)
        await self._ensure_topic(topic, auto_create)
        t = await self.store.get_topic(topic)
        if t is None:
            self._known_topics.discard(topic)
            raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        # logic queues: queues a shrink sealed are listed for reading until retention empties them
        return Route(
            topic,
            tuple(
                QueueRoute(i, Permission.READ_WRITE if i < t.queues else Permission.READ)
                for i in range(t.readable)
            ),
        )

    async def create_topic(
        self,
        name: str,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        compacted: bool = False,
    ) -> TopicInfo:
        check_topic(name, self.limits, for_send=True)
        with StoreCall(None, "", ""):
            t = await self.store.create_topic(name, queues, retention_ms, retention_bytes, compacted)
        self._known_topics.add(name)
        return self._topic_info(t)

    async def resize_topic(self, name: str, queues: int) -> TopicInfo:
        """Logic queues: `queues` (per store) take new messages from now on, without moving any;
        a shrink seals the queues it leaves out (readable until retention empties them). docs/store.md."""
        check_topic(name, self.limits)
        with StoreCall(None, "", ""):
            t = await self.store.resize_topic(name, queues)
        return self._topic_info(t)

    def _topic_info(self, t: TopicConfig, messages: int = 0) -> TopicInfo:
        per_store = t.queues // max(self.store.store_count(), 1)
        return TopicInfo(
            t.name, t.queues, t.retention_ms, t.retention_bytes, messages, per_store, t.compacted, t.readable
        )

    async def delete_topic(self, name: str) -> None:
        self._known_topics.discard(name)
        with StoreCall(None, "", ""):
            await self.store.delete_topic(name)

    async def get_topic(self, name: str) -> TopicInfo:
        t = await self.store.get_topic(name)
        if t is None:
            raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {name} does not exist")
        n = 0
        for q in range(t.readable):
            n += await self.store.max_offset(name, q) - await self.store.min_offset(name, q)
        return self._topic_info(t, n)

    async def topic_consumers(self, name: str) -> dict[str, dict[str, int]]:
        """{group: {backlog, inflight}} for every group that has consumed topic `name`."""
        out = {}
        for group, topic in await self.store.subscriptions():
            if topic == name:
                out[group] = {
                    "backlog": await self.store.backlog(group, name),
                    "inflight": await self.store.inflight_count(group, name),
                }
        return out

    async def list_topics(self, *, include_system: bool = False) -> list[TopicInfo]:
        return [
            self._topic_info(t)
            for t in await self.store.list_topics()
            if include_system or not t.name.startswith("%") or t.name.startswith("%DLQ%")
        ]

    async def create_group(
        self, name: str, max_attempts: int = 16, retry: RetryPolicy | None = None
    ) -> GroupInfo:
        check_group(name, self.limits)
        with StoreCall(None, "", ""):
            g = await self.store.create_group(name, max_attempts, retry)
        return GroupInfo(g.name, g.max_attempts, g.retry.initial_ms, g.retry.multiplier, g.retry.max_ms)

    async def delete_group(self, name: str) -> None:
        with StoreCall(None, "", ""):
            await self.store.delete_group(name)

    async def get_group(self, name: str) -> GroupInfo:
        """A group with backlog and in-flight counts for each topic it has consumed."""
        g = await self.store.get_group(name)
        if g is None:
            raise ProcessorError(ErrorKind.GROUP_NOT_FOUND, f"consumer group {name} does not exist")
        return await self._group_info(g, [t for grp, t in await self.store.subscriptions() if grp == name])

    async def list_groups(self) -> list[GroupInfo]:
        """Every group but the system ones, as `get_group` (the subscriptions are read once)."""
        topics: dict[str, list[str]] = {}
        for grp, topic in await self.store.subscriptions():
            topics.setdefault(grp, []).append(topic)
        gs = [g for g in await self.store.list_groups() if not g.name.startswith("%")]
        return [await self._group_info(g, topics.get(g.name, [])) for g in gs]

    async def _group_info(self, g: GroupConfig, topics: list[str]) -> GroupInfo:
        info = GroupInfo(g.name, g.max_attempts, g.retry.initial_ms, g.retry.multiplier, g.retry.max_ms)
        for topic in topics:
            if await self.store.get_topic(topic) is not None:
                info.topics[topic] = {
                    "backlog": await self.store.backlog(g.name, topic),
                    "inflight": await self.store.inflight_count(g.name, topic),
                }
        return info

    async def group_names(self) -> list[str]:
        """The names of the groups, system ones included (no counts: cheap with many groups)."""
        return [g.name for g in await self.store.list_groups()]

    async def backlog(self, group: str, topic: str) -> tuple[int, int]:
        """(messages of `topic` not yet acked by `group`, how many of those are in flight)."""
        with StoreCall(None, "", ""):
            return await self.store.backlog(group, topic), await self.store.inflight_count(group, topic)

    async def get_max_attempts(self, group: str) -> int:
        g = await self.store.get_group(group)
        return g.max_attempts if g is not None else 16

    # ------------------------------------------------------------------ offset reads (pull, analytics)
    async def read(
        self,
        ctx: ClientContext,
        topic: str,
        queue_id: int,
        start: int,
        end: int | None = None,
        max_messages: int = 32,
        filter: Filter = ALL,
        *,
        group: str | None = None,
    ) -> list[Message]:
        """Messages of one queue with offsets in [start, end): replayable range reads. `group`: a
        pull consumer's group, which reads them to consume them (traced as deliveries)."""
        if self.authorizer is not None:
            await self.authorize(ctx.identity, Action.SUBSCRIBE, Resource("topic", topic))
        with StoreCall(None, "", ""):
            msgs = await self.store.read(topic, queue_id, start, end, max_messages, filter)
        if msgs:
            self.metrics.messages_out[(ctx.protocol, topic)] += len(msgs)
            if group is not None and self.tracer is not None:
                self.tracer.pulled(ctx, group, topic, queue_id, msgs)
        return msgs

    async def tail(
        self,
        ctx: ClientContext,
        topic: str,
        positions: dict[int, int],
        max_messages: int = 128,
        wait_ms: int = 0,
        *,
        group: str,
    ) -> list[Message]:
        """Offset reads of a whole topic for a subscriber that does not compete (StoreClient.tail):
        no pop state and nothing to ack; the caller moves `positions` (queue id -> next offset) past
        what it gets. Traced as deliveries to `group`, acked at once (the reader keeps no progress
        in the store)."""
        if self.authorizer is not None:
            await self.authorize(ctx.identity, Action.SUBSCRIBE, Resource("topic", topic))
        with StoreCall(None, "", ""):
            msgs = await self.store.tail(topic, positions, max_messages, wait_ms)
        if msgs:
            self.metrics.messages_out[(ctx.protocol, topic)] += len(msgs)
            if self.tracer is not None:
                self.tracer.tailed(ctx, group, msgs)
        return msgs

    def watch(self, topic: str, callback: Callable[[], object]) -> Callable[[], None] | None:
        """After a `tail` of `topic` that found nothing (no await in between): call `callback` once
        when the topic next gets a record, holding no task or timer meanwhile; returns the function
        that ends the watch unfired. None when the store offers no watch (a network store: long-poll
        instead). TopicNotFound mapped as by `tail`."""
        watch = getattr(self.store, "watch", None)
        if watch is None:
            return None
        with StoreCall(None, "", ""):
            return watch(topic, callback)

    async def read_raw(
        self,
        ctx: ClientContext,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        max_records: int,
        max_bytes: int,
    ) -> RawRange | None:
        """As `read`, the records' bytes undecoded (store/raw_range.py); None when the store
        client has no raw reads (then use `read`). Counting delivered messages is the caller's."""
        if self.authorizer is not None:
            await self.authorize(ctx.identity, Action.SUBSCRIBE, Resource("topic", topic))
        with StoreCall(None, "", ""):
            return await self.store.read_raw(topic, queue_id, start, end, max_records, max_bytes)

    # ------------------------------------------------------------------ compacted topics
    async def latest(self, topic: str, key: str) -> Message | None:
        """The latest value of `key` in compacted topic `topic` (None: none, or deleted)."""
        with StoreCall(None, "", ""):
            return await self.store.latest(topic, key)

    async def latest_items(self, topic: str) -> list[Message]:
        """The latest value of every key of compacted topic `topic` (deleted keys left out), by key."""
        with StoreCall(None, "", ""):
            return await self.store.latest_items(topic)

    async def compact(self) -> CompactionStats:
        """Compact every compacted topic now (it also runs in the background)."""
        with StoreCall(None, "", ""):
            return await self.store.compact()

    async def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, max) offsets of a queue: [min, max) are readable."""
        with StoreCall(None, "", ""):
            return await self.store.min_offset(topic, queue_id), await self.store.max_offset(topic, queue_id)

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        with StoreCall(None, "", ""):
            return await self.store.search_offset(topic, queue_id, timestamp_ms)

    async def commit_offset(
        self, ctx: ClientContext, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        check_group(group, self.limits)
        with StoreCall(None, "", ""):
            await self.store.commit_offset(group, topic, queue_id, offset)
        if self.tracer is not None:  # (the messages a pull consumer read below it are consumed)
            self.tracer.committed(ctx, group, topic, queue_id, offset)

    async def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        with StoreCall(None, "", ""):
            return await self.store.committed_offset(group, topic, queue_id)

    async def get_message_by_id(self, message_id: str) -> list[Message]:
        return await self.store.get_by_id(message_id)

    # ------------------------------------------------------------------ protocol-managed redelivery
    # RocketMQ 4.x consumers read by offset and hand failed messages back by commit log offset
    # alone (CONSUMER_SEND_MSG_BACK); the broker then stores a copy in %RETRY%<group> (delayed)
    # or %DLQ%<group>. These two calls let an adapter do that without reaching past the processor.
    async def get_message_at(self, commitlog_offset: int) -> Message:
        """The message stored at `commitlog_offset`; MESSAGE_NOT_FOUND when none starts there."""
        try:
            msg = await self.store.get_message(commitlog_offset)
        except Exception as e:  # noqa: BLE001 - unknown, deleted or not a record start
            raise ProcessorError(
                ErrorKind.MESSAGE_NOT_FOUND, f"no message at commit log offset {commitlog_offset}"
            ) from e
        if msg.commitlog_offset != commitlog_offset:
            raise ProcessorError(
                ErrorKind.MESSAGE_NOT_FOUND, f"no message at commit log offset {commitlog_offset}"
            )
        return msg

    async def send_to_system_topic(self, ctx: ClientContext, msg: Message) -> SendReceipt:
        """Store `msg` in a retry (`%RETRY%<group>`) or dead-letter (`%DLQ%<group>`) topic, which
        `send` refuses to producers; the topic is created on first use. A `deliver_at` delays it."""
        topic = msg.topic
        if not topic.startswith(("%RETRY%", "%DLQ%")):
            raise ProcessorError(ErrorKind.ILLEGAL_TOPIC, f"{topic!r} is not a retry or dead-letter topic")
        check_topic(topic, self.limits)
        if len(msg.body) > self.limits.max_body_size:
            raise ProcessorError(ErrorKind.BODY_TOO_LARGE, f"body of {len(msg.body)} bytes is too large")
        with StoreCall(self.metrics, ctx.protocol, "send"):
            if await self.store.get_topic(topic) is None:
                await self.store.create_topic(topic, None, None, None)
                log.info("topic %s created on first use", topic)
            r = await self.store.append(msg)
        if topic.startswith("%DLQ%"):
            self.metrics.dlq[(ctx.protocol, topic)] += 1
        else:
            self.metrics.messages_in[(ctx.protocol, topic)] += 1
        origin = msg.properties.get("ORIGIN_MESSAGE_ID")
        if self.tracer is not None and origin:
            event = "dead_lettered" if topic.startswith("%DLQ%") else "retried"
            at, tp = f"{r.topic}/{r.queue_id}/{r.queue_offset}", context_of(msg.properties, origin)
            self.tracer.message_event(ctx, event, origin, at, tp)
        return SendReceipt(
            r.message_id, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset, r.store_timestamp
        )

    async def send_internal(
        self, topic: str, messages: Sequence[Message], *, compacted: bool = False, queues: int | None = None
    ) -> None:
        """Store `messages` in `topic`, a `%` topic of the gateway's own that `send` refuses to
        producers (e.g. MQTT's retained messages); no producer, ACL or size checks: the caller
        checked what it stores. `topic` is created first if missing (with `queues`, `compacted` if
        asked; an existing one made compacted if asked); with no messages only that is done. Durable
        on return."""
        if not topic.startswith("%") or any(m.topic != topic for m in messages):
            raise ProcessorError(ErrorKind.ILLEGAL_TOPIC, f"internal sends go to one % topic, not {topic!r}")
        with StoreCall(None, "", ""):
            if topic not in self._known_topics:
                t = await self.store.get_topic(topic)
                if t is None or (compacted and not t.compacted):
                    await self.store.create_topic(topic, t.queues if t else queues, None, None, compacted)
                    log.info("topic %s created (compacted: %s)", topic, compacted)
                self._known_topics.add(topic)
            if messages:
                await self.store.append_many(list(messages))

    # ------------------------------------------------------------------ durable protocol metadata
    # Adapters keep what must outlive a proxy (MQTT sessions, AMQP declarations, webhook
    # subscriptions) here, under a namespace of their own ("mqtt.session").
    async def kv_put(self, ns: str, key: str, value: bytes) -> None:
        """Store `value` under (ns, key); returns once durable."""
        await self.store.kv_put(ns, key, value)

    async def kv_put_many(self, ns: str, items: dict[str, bytes | None]) -> None:
        """Set several keys (None deletes) in one durable transaction."""
        await self.store.kv_put_many(ns, items)

    async def kv_put_if_absent(self, ns: str, key: str, value: bytes) -> bytes | None:
        """Store `value` unless (ns, key) exists, atomically, on the store every proxy shares:
        None when stored (durable), else the value already there."""
        return await self.store.kv_put_if_absent(ns, key, value)

    async def kv_get(self, ns: str, key: str) -> bytes | None:
        return await self.store.kv_get(ns, key)

    async def kv_delete(self, ns: str, key: str) -> bool:
        return await self.store.kv_delete(ns, key)

    async def kv_scan(self, ns: str, prefix: str = "") -> list[tuple[str, bytes]]:
        """(key, value) pairs of `ns` whose key starts with `prefix`, in key order."""
        return await self.store.kv_scan(ns, prefix)

    def store_stats(self) -> dict[str, object]:
        return self.store.stats()

    # ------------------------------------------------------------------ message browser and dead letters
    # For operators (admin API, console, CLI): no ACL check (the admin API checked the admin role)
    # and nothing counted as delivered. A redrive claims each DLQ record in the kv before it sends
    # the copy (released if the send fails), so two redrives never send one record twice.
    async def browse(
        self, topic: str, queue_id: int | None = None, offset: int | None = None, count: int = 20
    ) -> list[Message]:
        """Up to `count` messages of `topic` from `offset` (default: each queue's min) of queue
        `queue_id`, or of every readable queue merged by store time."""
        t = await self.store.get_topic(topic)
        if t is None:
            raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        if queue_id is not None and not 0 <= queue_id < t.readable:
            raise ProcessorError(ErrorKind.BAD_REQUEST, f"topic {topic} has no queue {queue_id}")
        out: list[Message] = []
        with StoreCall(None, "", ""):
            for q in range(t.readable) if queue_id is None else (queue_id,):
                lo = await self.store.min_offset(topic, q)
                out += await self.store.read(topic, q, max(lo, offset or 0), None, count)
        out.sort(key=lambda m: (m.store_timestamp, m.queue_id, m.queue_offset))
        return out[:count]

    async def find_by_key(self, key: str) -> list[Message]:
        """Every stored record whose keys include `key` (the store's key index)."""
        with StoreCall(None, "", ""):
            found = await self.store.get_by_key(key)
        return [m for m in found if m.topic != TRACE_TOPIC]  # (the trace's own records are keyed too)

    async def dead_letters(
        self, group: str, count: int = 100, *, pending_only: bool = False
    ) -> list[tuple[Message, str | None]]:
        """Up to `count` records of `group`'s dead-letter topic `%DLQ%<group>`, oldest first, each
        with the id of the message a redrive sent ("" while one is sending; None: not redriven).
        `pending_only`: only those not redriven."""
        topic = DLQ_PREFIX + group
        t = await self.store.get_topic(topic)
        if t is None:
            if await self.store.get_group(group) is None:
                raise ProcessorError(ErrorKind.GROUP_NOT_FOUND, f"consumer group {group} does not exist")
            return []
        done = {k: v.decode() for k, v in await self.store.kv_scan(REDRIVEN_NS, group + "/")}
        out: list[tuple[Message, str | None]] = []
        with StoreCall(None, "", ""):
            for q in range(t.readable):
                start, end = await self.store.min_offset(topic, q), await self.store.max_offset(topic, q)
                found = 0
                while start < end and found < count:
                    page = await self.store.read(topic, q, start, end, min(count, 256))
                    if not page:
                        break
                    start = page[-1].queue_offset + 1
                    for m in page:
                        new_id = done.get(f"{group}/{q}/{m.queue_offset}")
                        if not (pending_only and new_id is not None) and found < count:
                            out.append((m, new_id))
                            found += 1
        out.sort(key=lambda r: (r[0].store_timestamp, r[0].queue_id, r[0].queue_offset))
        return out[:count]

    async def redrive(
        self, group: str, ids: Sequence[str] | None = None, ctx: ClientContext | None = None
    ) -> list[tuple[str, str]]:
        """Send dead letters of `group` (those with message id in `ids`; None: every one not yet
        redriven) back to their original topic as new messages: same body, keys, tag, message group
        and properties (`traceparent` too) without the DLQ bookkeeping. Returns (dead letter id, new
        message id) per record sent; ids not in the DLQ and records redriven before are skipped.
        `ctx`: who asked (the trace's `redriven` events)."""
        ctx = ctx or ClientContext("admin", client_id="admin-api")
        topic = DLQ_PREFIX + group
        sent: list[tuple[str, str]] = []
        await self.dead_letters(group, 1)  # GROUP_NOT_FOUND for a group with neither DLQ nor settings
        if ids is not None:
            records: dict[tuple[int, int], Message] = {}
            with StoreCall(None, "", ""):
                for mid in dict.fromkeys(ids):
                    for m in await self.store.get_by_id(mid):
                        if m.topic == topic:
                            records[(m.queue_id, m.queue_offset)] = m
            for m in records.values():
                await self._redrive_one(ctx, group, m, sent)
            return sent
        while True:  # all: page through what is still pending until nothing is
            page = await self.dead_letters(group, 500, pending_only=True)
            before = len(sent)
            for m, _ in page:
                await self._redrive_one(ctx, group, m, sent)
            if len(sent) == before:
                return sent

    async def _redrive_one(
        self, ctx: ClientContext, group: str, dead: Message, sent: list[tuple[str, str]]
    ) -> None:
        origin = dead.properties.get("ORIGIN_TOPIC") or dead.properties.get("RETRY_TOPIC")
        if not origin:
            log.warning("dead letter %s of %s has no original topic: not redriven", dead.message_id, group)
            return
        key = f"{group}/{dead.queue_id}/{dead.queue_offset}"
        if await self.store.kv_put_if_absent(REDRIVEN_NS, key, b"") is not None:
            return  # redriven before (or by a redrive running now)
        props = {k: v for k, v in dead.properties.items() if k not in DLQ_PROPS}
        if (tp := traceparent_of(dead)) is not None and tp != props.get(TRACEPARENT):
            props[GATEWAY_TRACEPARENT] = tp  # (the copy's new id: it keeps the original's trace)
        copy = Message(
            topic=origin,
            body=dead.body,
            tag=dead.tag,
            keys=dead.keys,
            properties=props,
            message_group=dead.message_group,
            born_host=dead.born_host,
            msg_type=MessageType.FIFO if dead.message_group else MessageType.NORMAL,
        )
        try:
            if await self.store.get_topic(origin) is None:
                raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {origin} does not exist")
            with StoreCall(None, "", ""):
                r = await self.store.append(copy)
        except BaseException:
            await self.store.kv_delete(REDRIVEN_NS, key)
            raise
        await self.store.kv_put(REDRIVEN_NS, key, r.message_id.encode())
        if self.tracer is not None:
            self.tracer.stored(ctx, [copy], [r])
            self.tracer.message_event(ctx, "redriven", dead.message_id, f"to {origin} as {r.message_id}", tp)
        log.info("dead letter %s of %s redriven to %s as %s", dead.message_id, group, origin, r.message_id)
        sent.append((dead.message_id, r.message_id))
