"""Values that cross the processor seam: who is calling, what was stored, what is delivered."""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from store import Filter, Message, MessageType, PoppedMessage

if TYPE_CHECKING:
    from .security.acl import Principal


class Action(enum.Enum):
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"
    ADMIN = "admin"
    CONNECT = "connect"


class ClientKind(enum.Enum):
    PRODUCER = "producer"
    PUSH_CONSUMER = "push_consumer"
    SIMPLE_CONSUMER = "simple_consumer"
    PULL_CONSUMER = "pull_consumer"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a client says it is, as the adapter extracted it (None fields = not given)."""

    username: str | None = None
    secret: str | None = None  # password / secret key as presented; an authorizer may check it
    mechanism: str = "none"  # e.g. "plain", "mqv2-hmac-sha1", "mqtt-password", "none"
    attributes: tuple[tuple[str, str], ...] = ()
    principal: Principal | None = None  # set by MessagingProcessor.authenticate when auth is on


ANONYMOUS = Identity()


@dataclass(frozen=True, slots=True)
class Resource:
    kind: str  # "topic", "group", "cluster"
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


@dataclass(slots=True)
class ClientContext:
    """Per-connection (or per-client-id) facts an adapter passes with each call."""

    protocol: str  # "grpc", "mqtt", "amqp", "http", "remoting"
    client_id: str = ""
    identity: Identity = ANONYMOUS
    remote: str = ""  # "host:port" of the peer


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """Where a message landed. `transaction_id` is set for half (transactional) messages."""

    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_timestamp: int
    transaction_id: str = ""


@dataclass(slots=True)
class Delivery:
    """A popped message with its receipt handle; `delivery_attempt` starts at 1."""

    message: Message
    receipt_handle: str
    invisible_until: int  # epoch ms
    delivery_attempt: int

    @classmethod
    def of(cls, p: PoppedMessage) -> Delivery:
        return cls(p.message, p.receipt_handle, p.invisible_until, p.message.reconsume_times + 1)


class Permission(enum.IntEnum):
    NONE = 0
    READ = 1
    WRITE = 2
    READ_WRITE = 3


@dataclass(frozen=True, slots=True)
class QueueRoute:
    queue_id: int
    permission: Permission = Permission.READ_WRITE


@dataclass(frozen=True, slots=True)
class Route:
    """A topic's queues as this processor's stores expose them. Adapters add their own endpoint."""

    topic: str
    queues: tuple[QueueRoute, ...]
    message_types: tuple[MessageType, ...] = tuple(MessageType)


@dataclass(slots=True)
class TopicInfo:
    name: str
    queues: int  # over all stores: what routes list
    retention_ms: int | None = None
    retention_bytes: int | None = None
    messages: int = 0  # stored and not yet deleted by retention, over all queues
    queues_per_store: int = 0  # what create_topic takes; equal to `queues` in LOCAL mode
    compacted: bool = False  # the latest record per key wins (store/compaction.py)
    read_queues: int = 0  # over all stores: `queues` plus those a shrink sealed (still readable)


@dataclass(slots=True)
class GroupInfo:
    name: str
    max_attempts: int
    retry_initial_ms: int
    retry_multiplier: float
    retry_max_ms: int
    topics: dict[str, dict[str, int]] = field(default_factory=dict)  # topic -> {backlog, inflight}


TransactionCheck = Callable[[Message, str], Awaitable[None]]


@dataclass(slots=True, eq=False)
class ClientInfo:
    """A registered client: who is connected to which adapter, as what."""

    client_id: str
    protocol: str
    kind: ClientKind = ClientKind.OTHER
    group: str = ""
    topics: frozenset[str] = frozenset()
    remote: str = ""
    language: str = ""
    version: str = ""
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    # For producers: asks the client to resolve an orphaned half message (message, transaction id).
    transaction_check: TransactionCheck | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "client_id": self.client_id,
            "protocol": self.protocol,
            "kind": self.kind.value,
            "group": self.group,
            "topics": sorted(self.topics),
            "remote": self.remote,
            "language": self.language,
            "version": self.version,
            "connected_at": self.connected_at,
            "last_seen": self.last_seen,
        }


__all__ = [
    "Action",
    "ANONYMOUS",
    "ClientContext",
    "ClientInfo",
    "ClientKind",
    "Delivery",
    "Filter",
    "GroupInfo",
    "Identity",
    "Message",
    "MessageType",
    "Permission",
    "QueueRoute",
    "Resource",
    "Route",
    "SendReceipt",
    "TopicInfo",
    "TransactionCheck",
]
