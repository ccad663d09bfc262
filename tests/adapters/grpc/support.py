"""Helpers for driving the gRPC adapter with our generated stubs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from adapters.grpc import GrpcAdapter
from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from messaging_processor import MessagingProcessor
from store import Store

CLIENT_ID = "test-host@1@0@abc"
MD = (("x-mq-client-id", CLIENT_ID), ("x-mq-language", "PYTHON"))


@dataclass
class Gateway:
    """What the `gw` fixture yields: the core's store and processor, the adapter, a channel to it."""

    store: Store
    processor: MessagingProcessor
    adapter: GrpcAdapter
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.MessagingServiceStub


def dur(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def ts(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def msg(topic: str, body: bytes = b"hello", **sp) -> d.Message:
    """A producer message; `user` = user properties, other keywords are system properties."""
    user = sp.pop("user", {})
    sp.setdefault("message_type", d.NORMAL)
    sp.setdefault("body_encoding", d.IDENTITY)
    return d.Message(
        topic=d.Resource(name=topic),
        body=body,
        user_properties=user,
        system_properties=d.SystemProperties(**sp),
    )


async def send(stub, *messages: d.Message, md=MD) -> s.SendMessageResponse:
    return await stub.SendMessage(s.SendMessageRequest(messages=list(messages)), metadata=md)


async def receive(
    stub,
    group: str,
    topic: str,
    *,
    batch: int = 32,
    invisible_ms: int | None = 30_000,
    poll_ms: int | None = 0,
    expression: str = "*",
    filter_type: int = d.TAG,
    auto_renew: bool = False,
    md=MD,
    timeout: float = 30,
) -> tuple[d.Status, list[d.Message], list[timestamp_pb2.Timestamp]]:
    """One ReceiveMessage call, gathered: (status, messages, delivery timestamps)."""
    req = s.ReceiveMessageRequest(
        group=d.Resource(name=group),
        message_queue=d.MessageQueue(topic=d.Resource(name=topic), id=-1),
        filter_expression=d.FilterExpression(type=filter_type, expression=expression),
        batch_size=batch,
        auto_renew=auto_renew,
    )
    if invisible_ms is not None:
        req.invisible_duration.CopyFrom(dur(invisible_ms))
    if poll_ms is not None:
        req.long_polling_timeout.CopyFrom(dur(poll_ms))
    status, msgs, stamps = None, [], []
    async for r in stub.ReceiveMessage(req, metadata=md, timeout=timeout):
        kind = r.WhichOneof("content")
        if kind == "status":
            status = r.status
        elif kind == "message":
            msgs.append(r.message)
        else:
            stamps.append(r.delivery_timestamp)
    assert status is not None, "no status in the receive stream"
    return status, msgs, stamps


async def ack(stub, group: str, topic: str, *handles: str, md=MD) -> s.AckMessageResponse:
    return await stub.AckMessage(
        s.AckMessageRequest(
            group=d.Resource(name=group),
            topic=d.Resource(name=topic),
            entries=[s.AckMessageEntry(message_id=f"m{i}", receipt_handle=h) for i, h in enumerate(handles)],
        ),
        metadata=md,
    )


async def change_invisible(stub, group: str, topic: str, handle: str, ms: int, md=MD):
    return await stub.ChangeInvisibleDuration(
        s.ChangeInvisibleDurationRequest(
            group=d.Resource(name=group),
            topic=d.Resource(name=topic),
            receipt_handle=handle,
            invisible_duration=dur(ms),
        ),
        metadata=md,
    )


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for a condition the server changes without telling us (e.g. cleanup after a stream ends)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def producer_settings(*topics: str) -> d.Settings:
    return d.Settings(
        client_type=d.PRODUCER,
        request_timeout=dur(3000),
        publishing=d.Publishing(
            topics=[d.Resource(name=t) for t in topics],
            max_body_size=128 * 1024 * 1024,
            validate_message_type=True,
        ),
        user_agent=d.UA(language=d.PYTHON, version="5.1.2", platform="linux", hostname="h"),
    )


def consumer_settings(group: str, topic: str, client_type: int = d.PUSH_CONSUMER) -> d.Settings:
    return d.Settings(
        client_type=client_type,
        request_timeout=dur(3000),
        subscription=d.Subscription(
            group=d.Resource(name=group),
            subscriptions=[
                d.SubscriptionEntry(
                    topic=d.Resource(name=topic), expression=d.FilterExpression(type=d.TAG, expression="*")
                )
            ],
        ),
        user_agent=d.UA(language=d.PYTHON, version="5.1.2"),
    )


class Telemetry:
    """A bidi Telemetry call we write to and read from."""

    def __init__(self, stub, md=MD) -> None:
        self.call = stub.Telemetry(metadata=md)

    async def settings(self, settings: d.Settings) -> s.TelemetryCommand:
        await self.call.write(s.TelemetryCommand(settings=settings))
        return await self.read()

    async def read(self, timeout: float = 10.0) -> s.TelemetryCommand:
        return await asyncio.wait_for(self.call.read(), timeout)

    async def close(self) -> None:
        await self.call.done_writing()
        self.call.cancel()
