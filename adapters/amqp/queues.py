"""Queues: what a declared queue is (its store topic and group, flags, parsed x-arguments, local
consumers) and the validation / equivalence rules of queue.declare, as RabbitMQ applies them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .codec import AMQPError, ReplyCode

if TYPE_CHECKING:
    from messaging_processor import ClientContext, ProcessorError


# What a queue holds of the parts above it, typed here so that the queue (every part's common
# ground) imports none of them.
class ServerCancel(Protocol):
    """A consumer's channel, as far as its queue's holders use it (channel.py `Channel`)."""

    def server_cancel(self, consumer: Any) -> None: ...


class QueueConsumer(Protocol):
    """One of a queue's local consumers (consumer.py `Consumer`)."""

    tag: str
    exclusive: bool

    @property
    def channel(self) -> ServerCancel: ...

    def start(self) -> None: ...


class QueueBinding(Protocol):
    """A binding to a queue, as the queue keeps it (routing.py `Binding`)."""

    routing_key: str
    key: str


class QueueFeed(Protocol):
    """What holds a queue's deliveries in this process instead of its group in the store: an
    exclusive queue's `LocalFeed` (messaging_processor) or a stream's `StreamFeeds` (streams.py).
    It also pops and settles like the processor (the DeliveryLoop's source)."""

    async def ready(self) -> int: ...
    async def purge(self) -> int: ...
    async def close(self) -> None: ...
    def position(self, queue_id: int) -> int: ...
    async def ack_many(self, ctx: ClientContext, handles: Sequence[str]) -> list[ProcessorError | None]: ...
    async def change_invisible_time(self, ctx: ClientContext, handle: str, invisible_time_ms: int) -> str: ...


QUEUE_TYPES = ("classic", "quorum", "stream")
OVERFLOWS = ("drop-head", "reject-publish", "reject-publish-dlx")
# x-arguments compared on redeclaration (others may differ, as in RabbitMQ)
COMPARED_ARGS = (
    "x-message-ttl",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-overflow",
    "x-max-priority",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
)


class Queue:
    __slots__ = (
        "vhost",
        "name",
        "topic",
        "durable",
        "exclusive",
        "owner",
        "auto_delete",
        "args",
        "own_topic",
        "ttl",
        "expires",
        "max_length",
        "overflow",
        "dlx",
        "dlrk",
        "delivery_limit",
        "single_active",
        "consumers",
        "bindings",
        "deleted",
        "had_consumer",
        "expiry_timer",
        "sweeper",
        "wake",
        "trimming",
        "has_expiring",
        "limited",
        "remote",
        "stored",
        "feed",
        "stream",
    )

    def __init__(
        self,
        vhost: str,
        name: str,
        topic: str,
        *,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        args: dict[str, Any],
        own_topic: bool = True,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.topic = topic  # the store topic; also the consumer group's name
        self.durable = durable
        self.exclusive = exclusive
        self.owner: object | None = None  # the Connection of an exclusive queue
        self.auto_delete = auto_delete
        self.args = args
        self.own_topic = own_topic  # the store topic was created for this queue
        a = parse_args(args, vhost, name)
        self.ttl: int | None = a.get("x-message-ttl")
        self.expires: int | None = a.get("x-expires")
        self.max_length: int | None = a.get("x-max-length")
        self.overflow: str = a.get("x-overflow", "drop-head")
        self.dlx: str | None = a.get("x-dead-letter-exchange")
        self.dlrk: str | None = a.get("x-dead-letter-routing-key")
        self.delivery_limit: int | None = a.get("x-delivery-limit")
        self.single_active: bool = bool(a.get("x-single-active-consumer", False))
        self.consumers: list[QueueConsumer] = []
        self.bindings: dict[str, QueueBinding] = {}
        self.deleted = False
        self.had_consumer = False
        self.expiry_timer: asyncio.TimerHandle | None = None
        self.sweeper: asyncio.Task | None = None
        self.wake = asyncio.Event()
        self.trimming = 0  # 0 idle, 1 trimming, 2 trimming and asked again
        self.has_expiring = self.ttl is not None
        self.limited = self.max_length is not None and self.overflow != "drop-head"  # reject-publish
        # known only as the destination of a binding another proxy made (registry.sync_bindings):
        # publishes here route to it; its timers start when a connection here uses it
        self.remote = False
        self.stored: bytes | None = None  # its record in the store (records.py)
        # an exclusive queue's deliveries, kept in memory over offset reads (LocalFeed); None: the
        # queue's consumers pop and ack in the store
        self.feed: QueueFeed | None = None
        self.stream = a.get("x-queue-type") == "stream"  # read by offset per consumer (streams.py)

    @property
    def group(self) -> str:
        return self.topic

    def __repr__(self) -> str:
        return f"Queue({self.vhost!r}, {self.name!r} -> {self.topic})"

    def record(self) -> dict[str, Any]:
        return {
            "durable": self.durable,
            "exclusive": self.exclusive,
            "auto_delete": self.auto_delete,
            "topic": self.topic,
            "own_topic": self.own_topic,
        }


def _int(args: dict[str, Any], key: str, lo: int, vhost: str, name: str) -> int | None:
    if key not in args:
        return None
    v = args[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise AMQPError(
            ReplyCode.PRECONDITION_FAILED,
            f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {v!r} is not an integer >= {lo}",
            class_id=50,
            method_id=10,
        )
    return int(v)


def _str(
    args: dict[str, Any], key: str, choices: tuple[str, ...] | None, vhost: str, name: str
) -> str | None:
    if key not in args:
        return None
    v = args[key]
    if isinstance(v, bytes):
        v = v.decode("utf-8", "surrogateescape")
    if not isinstance(v, str) or (choices is not None and v not in choices):
        raise AMQPError(
            ReplyCode.PRECONDITION_FAILED,
            f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {v!r}",
            class_id=50,
            method_id=10,
        )
    return v


def parse_args(args: dict[str, Any], vhost: str, name: str) -> dict[str, Any]:
    """Validated x-arguments (406 PRECONDITION_FAILED for invalid ones)."""
    out: dict[str, Any] = {}
    for key, lo in (("x-message-ttl", 0), ("x-expires", 1), ("x-max-length", 0), ("x-max-length-bytes", 0)):
        v = _int(args, key, lo, vhost, name)
        if v is not None:
            out[key] = v
    v = _int(args, "x-delivery-limit", 0, vhost, name)
    if v is not None:
        out["x-delivery-limit"] = v
    v = _int(args, "x-max-priority", 0, vhost, name)
    if v is not None and v > 255:
        raise AMQPError(
            ReplyCode.PRECONDITION_FAILED, "x-max-priority must be at most 255", class_id=50, method_id=10
        )
    for key, choices in (
        ("x-dead-letter-exchange", None),
        ("x-dead-letter-routing-key", None),
        ("x-overflow", OVERFLOWS),
        ("x-queue-type", QUEUE_TYPES),
    ):
        s = _str(args, key, choices, vhost, name)
        if s is not None:
            out[key] = s
    if "x-dead-letter-routing-key" in out and "x-dead-letter-exchange" not in out:
        raise AMQPError(
            ReplyCode.PRECONDITION_FAILED,
            f"invalid arg 'x-dead-letter-routing-key' for queue '{name}' in vhost '{vhost}': "
            "it needs x-dead-letter-exchange",
            class_id=50,
            method_id=10,
        )
    if "x-single-active-consumer" in args:
        sac = args["x-single-active-consumer"]
        if not isinstance(sac, bool):
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg 'x-single-active-consumer' for queue '{name}' in vhost '{vhost}': {sac!r}",
                class_id=50,
                method_id=10,
            )
        out["x-single-active-consumer"] = sac
    return out


def _normalized(args: dict[str, Any], key: str) -> Any:
    v = args.get(key)
    if key == "x-queue-type" and v is None:
        return "classic"
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return int(v)
    return v


def check_equivalent(
    q: Queue, durable: bool, exclusive: bool, auto_delete: bool, args: dict[str, Any]
) -> None:
    """406 PRECONDITION_FAILED unless a redeclaration matches the queue (RabbitMQ's rules)."""

    def fail(what: str, got: Any, cur: Any) -> AMQPError:
        return AMQPError(
            ReplyCode.PRECONDITION_FAILED,
            f"inequivalent arg '{what}' for queue '{q.name}' in vhost '{q.vhost}': "
            f"received '{_text(got)}' but current is '{_text(cur)}'",
            class_id=50,
            method_id=10,
        )

    if durable != q.durable:
        raise fail("durable", durable, q.durable)
    # `exclusive` is not compared (as in RabbitMQ): the owner may redeclare either way; another
    # connection is refused with 405 RESOURCE_LOCKED before this check.
    if auto_delete != q.auto_delete:
        raise fail("auto_delete", auto_delete, q.auto_delete)
    for key in COMPARED_ARGS:
        got, cur = _normalized(args, key), _normalized(q.args, key)
        if got != cur:
            raise fail(key, got, cur)


def _text(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
