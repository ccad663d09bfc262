"""`apache.rocketmq.v2.MessagingService` servicer: thin glue from RPCs to `MessagingProcessor` calls.

Errors go into each response's `status` under gRPC status OK (only Telemetry uses gRPC statuses).
Client sessions (the Settings each client sent over Telemetry, keyed on `x-mq-client-id`) are
sessions.py's, the Telemetry stream telemetry.py's, the signature and ACL checks access.py's.

With the processor's `security` on, every RPC is authenticated from its `authorization` metadata
(the official clients' MQv2-HMAC-SHA1 signature; refused: Status UNAUTHORIZED) and checked against
the ACL as RocketMQ's ACL 2.0 does (refused: Status FORBIDDEN): QueryRoute needs publish or subscribe
on the topic; Settings publish on each publishing topic, or subscribe on the group and each
subscribed topic; Heartbeat and QueryAssignment subscribe on the consumer group (and topic);
ReceiveMessage, Ack, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue subscribe on group
and topic; SendMessage and EndTransaction publish on the topic."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import grpc

from adapters.grpc import codes
from adapters.grpc.access import RequestAccess
from adapters.grpc.access import group_resource as _group
from adapters.grpc.access import settings_checks as _settings_checks
from adapters.grpc.access import subscribe_checks as _sub
from adapters.grpc.access import topic_resource as _topic
from adapters.grpc.codes import Code, status_of
from adapters.grpc.convert import (
    GrpcError,
    dur_ms,
    endpoints,
    identity_of,
    ms_ts,
    peer_address,
    to_store,
)
from adapters.grpc.delivery_bytes import delivery_response
from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from adapters.grpc.outbound import OutboundBudgets
from adapters.grpc.sessions import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    LONG_POLLING_TIMEOUT_MS,
    PROTOCOL,
    RECEIVE_BATCH_SIZE,
    ClientSessions,
)
from adapters.grpc.telemetry import telemetry_commands
from messaging_processor import (
    ANONYMOUS,
    Action,
    ClientContext,
    Delivery,
    ErrorKind,
    Filter,
    MessagingProcessor,
    Permission,
    ProcessorError,
    now_ms,
)

log = logging.getLogger("adapters.grpc")

BROKER_NAME = "gateway"
MIN_DEADLINE_POLL_MS = 5_000
# ReceiveMessage with auto_renew and no invisible_duration (push consumers): the messages stay
# invisible this long; the consumer acks or changes the invisible duration well before that.
AUTO_RENEW_INVISIBLE_MS = 60_000
DEFAULT_INVISIBLE_MS = 30_000
# A message popped but not written to a vanished receiver becomes visible again after this.
RELEASE_INVISIBLE_MS = 1_000
DEADLINE_MARGIN_MS = 200

_PERMISSION = {
    Permission.NONE: d.NONE,
    Permission.READ: d.READ,
    Permission.WRITE: d.WRITE,
    Permission.READ_WRITE: d.READ_WRITE,
}
_MESSAGE_TYPES = (d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION)
# Failures MessagingProcessor.send raises before storing any message of the batch.
_REFUSED_BEFORE_STORE = frozenset(ErrorKind) - {
    ErrorKind.STORE_FULL,
    ErrorKind.UNAVAILABLE,
    ErrorKind.NOT_REPLICATED,
    ErrorKind.INTERNAL,
    ErrorKind.TOO_MANY_REQUESTS,
}
_NOT_IMPLEMENTED = d.Status(code=Code.NOT_IMPLEMENTED, message="offset-based pull is not implemented")


def _overall(statuses: list[d.Status]) -> d.Status:
    """One status for many entries: theirs when all agree, else MULTIPLE_RESULTS."""
    first = statuses[0]
    code = first.code
    for st in statuses:
        if st.code != code:
            return codes.MULTIPLE_RESULTS
    return first


def _status_response(status: d.Status) -> bytes:
    return s.ReceiveMessageResponse(status=status).SerializeToString()


def _timestamp_response() -> bytes:
    return s.ReceiveMessageResponse(delivery_timestamp=ms_ts(now_ms())).SerializeToString()


_OK_RESPONSE = _status_response(codes.OK)
# Methods whose handlers yield responses this service serialized itself.
RECEIVE_RAW = frozenset({"ReceiveMessage"})


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    """The servicer. `endpoint` is set by the adapter once bound: (advertised host or None, port)."""

    def __init__(self, processor: MessagingProcessor) -> None:
        self.processor = processor
        self.clients = ClientSessions(processor)
        self.sessions = self.clients.sessions
        self.expire_sessions = self.clients.expire
        self.advertise_host: str | None = None
        self.port = 0
        self.store_host = ""
        self._brokers: dict[tuple[str, int], d.Broker] = {}
        self._tasks: set[asyncio.Task] = set()
        self.outbound: OutboundBudgets | None = None  # --max-outbound-bytes-per-connection, per client id
        # Security on: each RPC's signature verified (remembered) and its ACL checks (access.py)
        self.access = access = RequestAccess(processor)
        self._refused = access.refused
        self._may_route = access.may_route
        self._principals = access.principals

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _ctx(context: grpc.aio.ServicerContext) -> ClientContext:
        cid = auth = date_time = ""
        for k, v in context.invocation_metadata() or ():
            if k == "x-mq-client-id":
                cid = v
            elif k == "authorization":
                auth = v
            elif k == "x-mq-date-time":
                date_time = v
        ident = identity_of(auth, date_time) if auth else None
        return ClientContext(PROTOCOL, cid, ident or ANONYMOUS, peer_address(context.peer()))

    def _broker(self, requested: d.Endpoints | None) -> d.Broker:
        host, port = self.advertise_host, self.port
        if host is None:
            host = "127.0.0.1"
            if requested is not None and requested.addresses:
                a = requested.addresses[0]
                host, port = a.host or host, a.port or port
        b = self._brokers.get((host, port))
        if b is None:
            if len(self._brokers) > 256:
                self._brokers.clear()
            b = self._brokers[(host, port)] = d.Broker(
                name=BROKER_NAME, id=0, endpoints=endpoints(host, port)
            )
        return b

    def _spawn(self, coro) -> None:  # noqa: ANN001 - fire and forget, kept referenced until done
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ routes
    async def QueryRoute(self, request: s.QueryRouteRequest, context) -> s.QueryRouteResponse:
        ctx = self._ctx(context)
        if not ctx.client_id:
            return s.QueryRouteResponse(status=codes.CLIENT_ID_REQUIRED)
        topic = request.topic
        if self.processor.security is not None:
            if (st := await self._refused(ctx)) is not None:
                return s.QueryRouteResponse(status=st)
            if not self._may_route(ctx.identity, topic.name):
                return s.QueryRouteResponse(
                    status=codes.status(Code.FORBIDDEN, f"may not publish or subscribe topic:{topic.name}")
                )
        try:
            route = await self.processor.query_route(ctx, topic.name)
        except ProcessorError as e:
            return s.QueryRouteResponse(status=status_of(e))
        broker = self._broker(request.endpoints if request.HasField("endpoints") else None)
        types = [_MESSAGE_TYPES[t] for t in route.message_types]
        return s.QueryRouteResponse(
            status=codes.OK,
            message_queues=[
                d.MessageQueue(
                    topic=topic,
                    id=q.queue_id,
                    permission=_PERMISSION[q.permission],
                    broker=broker,
                    accept_message_types=types,
                )
                for q in route.queues
            ],
        )

    async def QueryAssignment(self, request: s.QueryAssignmentRequest, context) -> s.QueryAssignmentResponse:
        """One queue with id -1 ("any queue": pop balances per message) for this gateway."""
        ctx = self._ctx(context)
        if not ctx.client_id:
            return s.QueryAssignmentResponse(status=codes.CLIENT_ID_REQUIRED)
        if (
            self.processor.security is not None
            and (st := await self._refused(ctx, *_sub(request.group.name, request.topic.name))) is not None
        ):
            return s.QueryAssignmentResponse(status=st)
        try:
            route = await self.processor.query_route(ctx, request.topic.name)
        except ProcessorError as e:
            return s.QueryAssignmentResponse(status=status_of(e))
        if not any(q.permission & Permission.READ for q in route.queues):
            return s.QueryAssignmentResponse(
                status=codes.status(Code.FORBIDDEN, f"topic {request.topic.name} has no readable queue")
            )
        broker = self._broker(request.endpoints if request.HasField("endpoints") else None)
        mq = d.MessageQueue(
            topic=request.topic,
            id=-1,
            permission=d.READ_WRITE,
            broker=broker,
            accept_message_types=[_MESSAGE_TYPES[t] for t in route.message_types],
        )
        return s.QueryAssignmentResponse(status=codes.OK, assignments=[d.Assignment(message_queue=mq)])

    # ------------------------------------------------------------------ clients
    async def Heartbeat(self, request: s.HeartbeatRequest, context) -> s.HeartbeatResponse:
        ctx = self._ctx(context)
        cid = ctx.client_id
        if not cid:
            return s.HeartbeatResponse(status=codes.CLIENT_ID_REQUIRED)
        if self.processor.security is not None:
            group = request.group.name  # a consumer's group (ACL 2.0 refuses a producer's: we ignore it)
            checks = (
                [(Action.SUBSCRIBE, _group(group))] if group and request.client_type != d.PRODUCER else []
            )
            if (st := await self._refused(ctx, *checks)) is not None:
                return s.HeartbeatResponse(status=st)
        sess = self.sessions.get(cid)
        if sess is None:
            return s.HeartbeatResponse(
                status=codes.status(
                    Code.UNRECOGNIZED_CLIENT_TYPE,
                    f"no Settings from client {cid} yet: send them over Telemetry",
                )
            )
        sess.last_seen = time.monotonic()
        clients = self.processor.clients
        if not clients.touch(PROTOCOL, cid):
            clients.register(sess.client_info())  # its Telemetry stream ended, but it is alive
        return s.HeartbeatResponse(status=codes.OK)

    async def NotifyClientTermination(
        self, request: s.NotifyClientTerminationRequest, context
    ) -> s.NotifyClientTerminationResponse:
        ctx = self._ctx(context)
        if not ctx.client_id:
            return s.NotifyClientTerminationResponse(status=codes.CLIENT_ID_REQUIRED)
        if self.processor.security is not None and (st := await self._refused(ctx)) is not None:
            return s.NotifyClientTerminationResponse(status=st)
        self.sessions.pop(ctx.client_id, None)
        self.processor.clients.unregister(PROTOCOL, ctx.client_id)
        return s.NotifyClientTerminationResponse(status=codes.OK)

    async def Telemetry(
        self, request_iterator: AsyncIterator[s.TelemetryCommand], context
    ) -> AsyncIterator[s.TelemetryCommand]:
        """Answers every Settings with `{status OK, settings}` and carries transaction checks."""
        ctx = self._ctx(context)
        cid = ctx.client_id
        if not cid:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "x-mq-client-id metadata is required")
        stream = telemetry_commands(
            ctx,
            request_iterator,
            await self._refused(ctx),
            self._settings_refused,
            self.clients.apply,
            self.processor.clients,
        )
        try:
            async for item in stream:
                yield item
        finally:
            await stream.aclose()  # (its own finally: the reader stopped, the client unregistered)

    async def _settings_refused(self, ctx: ClientContext, settings: d.Settings) -> d.Status | None:
        if self.processor.security is None:
            return None
        return await self._refused(ctx, *_settings_checks(settings))

    # ------------------------------------------------------------------ produce
    async def SendMessage(self, request: s.SendMessageRequest, context) -> s.SendMessageResponse:
        ctx = self._ctx(context)
        if not ctx.client_id:
            return s.SendMessageResponse(status=codes.CLIENT_ID_REQUIRED)
        if (
            self.processor.security is not None and (st := await self._refused(ctx)) is not None
        ):  # publish: checked per message by send
            return s.SendMessageResponse(status=st)
        msgs = request.messages
        if len(msgs) == 1:
            entry = await self._send_one(ctx, msgs[0])
            return s.SendMessageResponse(status=entry.status, entries=(entry,))
        if not msgs:
            return s.SendMessageResponse(status=codes.status(Code.BAD_REQUEST, "no messages to send"))
        # Fast path: one processor call for the whole batch. It validates every message before
        # storing any, so when validation fails nothing is stored and each message is retried alone
        # to get its own status.
        try:
            receipts = await self.processor.send(ctx, [to_store(m) for m in msgs])
        except (GrpcError, ProcessorError) as e:
            if isinstance(e, ProcessorError) and e.kind not in _REFUSED_BEFORE_STORE:
                st = status_of(e)
                return s.SendMessageResponse(status=st, entries=[s.SendResultEntry(status=st) for _ in msgs])
            entries = await asyncio.gather(*[self._send_one(ctx, m) for m in msgs])
            return s.SendMessageResponse(status=_overall([e.status for e in entries]), entries=entries)
        ok = codes.OK
        resp = s.SendMessageResponse(status=ok)
        add = resp.entries.add
        for r in receipts:
            e = add(message_id=r.message_id, transaction_id=r.transaction_id, offset=r.queue_offset)
            st = e.status
            st.code = Code.OK
            st.message = "OK"
        return resp

    async def _send_one(self, ctx: ClientContext, m: d.Message) -> s.SendResultEntry:
        try:
            r = (await self.processor.send(ctx, (to_store(m),)))[0]
        except ProcessorError as e:
            return s.SendResultEntry(status=status_of(e))
        except GrpcError as e:
            return s.SendResultEntry(status=e.status())
        return s.SendResultEntry(
            status=codes.OK, message_id=r.message_id, transaction_id=r.transaction_id, offset=r.queue_offset
        )

    async def EndTransaction(self, request: s.EndTransactionRequest, context) -> s.EndTransactionResponse:
        ctx = self._ctx(context)
        if not ctx.client_id:
            return s.EndTransactionResponse(status=codes.CLIENT_ID_REQUIRED)
        if (
            self.processor.security is not None
            and (st := await self._refused(ctx, (Action.PUBLISH, _topic(request.topic.name)))) is not None
        ):
            return s.EndTransactionResponse(status=st)
        res = request.resolution
        if res not in (d.COMMIT, d.ROLLBACK):
            return s.EndTransactionResponse(
                status=codes.status(Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
            )
        try:
            await self.processor.end_transaction(
                ctx, request.transaction_id, res == d.COMMIT, message_id=request.message_id
            )
        except ProcessorError as e:
            return s.EndTransactionResponse(status=status_of(e))
        return s.EndTransactionResponse(status=codes.OK)

    # ------------------------------------------------------------------ consume
    def _poll_ms(self, request: s.ReceiveMessageRequest, cid: str, remaining_s: float | None) -> int:
        """Long polling time: the request's, else deadline − request timeout / 2 (clamped to
        [5 s, 20 s] as the Java proxy does); never past the deadline."""
        if request.HasField("long_polling_timeout"):
            poll = dur_ms(request.long_polling_timeout)
        elif remaining_s is not None:
            sess = self.sessions.get(cid)
            rt = sess.request_timeout_ms if sess is not None else DEFAULT_REQUEST_TIMEOUT_MS
            poll = min(max(int(remaining_s * 1000) - rt // 2, MIN_DEADLINE_POLL_MS), LONG_POLLING_TIMEOUT_MS)
        else:
            poll = LONG_POLLING_TIMEOUT_MS
        if remaining_s is not None:
            poll = min(poll, int(remaining_s * 1000) - DEADLINE_MARGIN_MS)
        return max(poll, 0)

    async def ReceiveMessage(self, request: s.ReceiveMessageRequest, context) -> AsyncIterator[bytes]:
        """Stream: status, then one message each, then the delivery timestamp, as serialized
        `ReceiveMessageResponse`s (`RECEIVE_RAW`; messages by `delivery_bytes`). An async generator:
        grpc.aio writes its items a little faster than awaited `context.write` calls."""
        ctx = self._ctx(context)
        if not ctx.client_id:
            yield _status_response(codes.CLIENT_ID_REQUIRED)
            return
        if (
            self.processor.security is not None and (st := await self._refused(ctx)) is not None
        ):  # subscribe: checked by pop
            yield _status_response(st)
            return
        try:
            deliveries = await self._receive(ctx, request, context)
        except ProcessorError as e:
            yield _status_response(status_of(e))
            return
        except GrpcError as e:
            yield _status_response(e.status())
            return
        if not deliveries:
            yield _status_response(codes.NO_MESSAGE)
            yield _timestamp_response()
            return
        sent = 0
        ob = self.outbound
        try:
            yield _OK_RESPONSE
            host = self.store_host
            for dl in deliveries:
                yield delivery_response(dl, host)
                sent += 1  # grpc asks for the next item only once this one is written
                if ob is not None:
                    ob.sent(ctx.client_id, len(dl.message.body))
            yield _timestamp_response()
        except BaseException:
            if sent < len(deliveries):  # the receiver went away: hand the rest out again soon
                self._spawn(self._release(ctx, deliveries[sent:]))
            raise
        finally:
            if ob is not None and sent < len(deliveries):
                ob.sent(ctx.client_id, sum(len(dl.message.body) for dl in deliveries[sent:]))

    async def _receive(self, ctx: ClientContext, request: s.ReceiveMessageRequest, context) -> list[Delivery]:
        fe = request.filter_expression
        if fe.type == d.SQL:
            raise GrpcError(Code.ILLEGAL_FILTER_EXPRESSION, "SQL92 filter expressions are not supported")
        flt = Filter.from_expression(fe.expression)
        if request.HasField("invisible_duration"):
            invisible = dur_ms(request.invisible_duration)
        elif request.auto_renew:
            invisible = AUTO_RENEW_INVISIBLE_MS
        else:
            invisible = DEFAULT_INVISIBLE_MS
        batch = request.batch_size
        batch = RECEIVE_BATCH_SIZE if batch <= 0 else min(batch, self.processor.limits.max_batch)
        poll = self._poll_ms(request, ctx.client_id, context.time_remaining())
        ob = self.outbound
        if ob is None:
            return await self.processor.pop(
                ctx,
                request.group.name,
                request.message_queue.topic.name,
                filter=flt,
                max_messages=batch,
                invisible_time_ms=invisible,
                long_poll_ms=poll,
            )
        # the client's other calls hold its bound (or are popping): wait within the long poll
        t0 = time.monotonic()
        if not await ob.acquire(ctx.client_id, poll / 1000):
            return []
        deliveries: list[Delivery] = []
        try:
            deliveries = await self.processor.pop(
                ctx,
                request.group.name,
                request.message_queue.topic.name,
                filter=flt,
                max_messages=ob.batch(ctx.client_id, batch),
                invisible_time_ms=invisible,
                long_poll_ms=max(0, poll - int((time.monotonic() - t0) * 1000)),
            )
        finally:
            ob.took(ctx.client_id, deliveries)
        return deliveries

    async def _release(self, ctx: ClientContext, deliveries: list[Delivery]) -> None:
        for dl in deliveries:
            with contextlib.suppress(ProcessorError):
                await self.processor.change_invisible_time(ctx, dl.receipt_handle, RELEASE_INVISIBLE_MS)

    async def AckMessage(self, request: s.AckMessageRequest, context) -> s.AckMessageResponse:
        ctx = self._ctx(context)
        if not ctx.client_id:
            return s.AckMessageResponse(status=codes.CLIENT_ID_REQUIRED)
        if (
            self.processor.security is not None
            and (st := await self._refused(ctx, *_sub(request.group.name, request.topic.name))) is not None
        ):
            return s.AckMessageResponse(status=st)
        if not request.entries:
            return s.AckMessageResponse(status=codes.status(Code.BAD_REQUEST, "no entries to acknowledge"))
        entries = request.entries
        try:  # (one store call for the whole batch)
            errors = await self.processor.ack_many(ctx, [e.receipt_handle for e in entries])
        except ProcessorError as err:
            errors = [err] * len(entries)
        resp = s.AckMessageResponse()
        add = resp.entries.add
        failed: list[d.Status] = []
        for e, err in zip(entries, errors, strict=True):
            h = e.receipt_handle
            if err is not None:
                st = status_of(err)
                failed.append(st)
                add(message_id=e.message_id, receipt_handle=h, status=st)
                continue
            st = add(message_id=e.message_id, receipt_handle=h).status
            st.code = Code.OK
            st.message = "OK"
        if not failed:
            resp.status.CopyFrom(codes.OK)
        elif len(failed) == len(request.entries):
            resp.status.CopyFrom(_overall(failed))
        else:
            resp.status.CopyFrom(codes.MULTIPLE_RESULTS)
        return resp

    async def ChangeInvisibleDuration(
        self, request: s.ChangeInvisibleDurationRequest, context
    ) -> s.ChangeInvisibleDurationResponse:
        ctx = self._ctx(context)
        if not ctx.client_id:
            return s.ChangeInvisibleDurationResponse(status=codes.CLIENT_ID_REQUIRED)
        if (
            self.processor.security is not None
            and (st := await self._refused(ctx, *_sub(request.group.name, request.topic.name))) is not None
        ):
            return s.ChangeInvisibleDurationResponse(status=st)
        try:
            handle = await self.processor.change_invisible_time(
                ctx, request.receipt_handle, dur_ms(request.invisible_duration)
            )
        except ProcessorError as e:
            return s.ChangeInvisibleDurationResponse(status=status_of(e))
        return s.ChangeInvisibleDurationResponse(status=codes.OK, receipt_handle=handle)

    async def ForwardMessageToDeadLetterQueue(
        self, request: s.ForwardMessageToDeadLetterQueueRequest, context
    ) -> s.ForwardMessageToDeadLetterQueueResponse:
        ctx = self._ctx(context)
        if not ctx.client_id:
            return s.ForwardMessageToDeadLetterQueueResponse(status=codes.CLIENT_ID_REQUIRED)
        if (
            self.processor.security is not None
            and (st := await self._refused(ctx, *_sub(request.group.name, request.topic.name))) is not None
        ):
            return s.ForwardMessageToDeadLetterQueueResponse(status=st)
        reason = (
            f"forwarded by the consumer at delivery attempt {request.delivery_attempt}"
            f" of {request.max_delivery_attempts}"
        )
        try:
            await self.processor.forward_to_dlq(ctx, request.receipt_handle, reason)
        except ProcessorError as e:
            return s.ForwardMessageToDeadLetterQueueResponse(status=status_of(e))
        return s.ForwardMessageToDeadLetterQueueResponse(status=codes.OK)

    # ------------------------------------------------------------------ not implemented
    async def PullMessage(self, request: s.PullMessageRequest, context) -> None:
        await context.write(s.PullMessageResponse(status=_NOT_IMPLEMENTED))

    async def UpdateOffset(self, request, context) -> s.UpdateOffsetResponse:
        return s.UpdateOffsetResponse(status=_NOT_IMPLEMENTED)

    async def GetOffset(self, request, context) -> s.GetOffsetResponse:
        return s.GetOffsetResponse(status=_NOT_IMPLEMENTED)

    async def QueryOffset(self, request, context) -> s.QueryOffsetResponse:
        return s.QueryOffsetResponse(status=_NOT_IMPLEMENTED)

    async def RecallMessage(self, request, context) -> s.RecallMessageResponse:
        return s.RecallMessageResponse(
            status=codes.status(Code.UNSUPPORTED, "recalling delayed messages is not supported")
        )

    async def SyncLiteSubscription(self, request, context) -> s.SyncLiteSubscriptionResponse:
        return s.SyncLiteSubscriptionResponse(
            status=codes.status(Code.UNSUPPORTED, "lite topics are not supported")
        )
