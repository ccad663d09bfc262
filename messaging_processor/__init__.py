"""The protocol-neutral MessagingProcessor every adapter calls (send, pop, ack, change invisible
time, DLQ, transactions, routes, admin, client registry, authorization) and its delivery loops
(pop/ack, and by offset for consumers that do not compete; LocalFeed: pop/ack in memory over
offset reads for a queue only this process reads).

Adapters import from here, never from `store`: the message types (Message, MessageType, Filter,
ALL, RetryPolicy) and `now_ms` are re-exported for them."""

from store import ALL, Filter, Message, MessageType, RetryPolicy
from store.message import now_ms

from .delivery import DeliveryLoop, Handler, Outcome
from .errors import ErrorKind, ProcessorError, store_error
from .local_feed import LocalFeed
from .metrics import Metrics
from .model import (
    ANONYMOUS,
    Action,
    ClientContext,
    ClientInfo,
    ClientKind,
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
from .offset_delivery import OffsetDeliveryLoop
from .processor import CERTIFICATE_MECHANISM, Authorizer, MessagingProcessor, allow_all
from .registry import ClientRegistry
from .shadows import Shadow, ShadowError, ShadowService
from .store_client import LocalStoreClient, StoreClient
from .validation import Limits

__all__ = [
    "ALL",
    "ANONYMOUS",
    "CERTIFICATE_MECHANISM",
    "Action",
    "Authorizer",
    "ClientContext",
    "ClientInfo",
    "ClientKind",
    "ClientRegistry",
    "Delivery",
    "DeliveryLoop",
    "ErrorKind",
    "Filter",
    "GroupInfo",
    "Handler",
    "Identity",
    "Limits",
    "LocalFeed",
    "LocalStoreClient",
    "Message",
    "MessageType",
    "MessagingProcessor",
    "Metrics",
    "OffsetDeliveryLoop",
    "Outcome",
    "Permission",
    "ProcessorError",
    "QueueRoute",
    "Resource",
    "RetryPolicy",
    "Route",
    "SendReceipt",
    "Shadow",
    "ShadowError",
    "ShadowService",
    "StoreClient",
    "TopicInfo",
    "allow_all",
    "now_ms",
    "store_error",
]
