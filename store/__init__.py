"""The gateway's durable message store: commit log, consume queues, index, pop/ack progress,
delay timers, transactions and retention. Protocol-free; see docs/store.md."""

from .commitlog import StoreFullError
from .config import GroupConfig, RetryPolicy, StoreConfig, TopicConfig
from .message import AppendResult, Message, MessageType, PoppedMessage
from .store import (
    ALL,
    Filter,
    GroupNotFound,
    InvalidReceiptHandle,
    MessageTooLarge,
    Store,
    StoreError,
    TopicNotFound,
    TransactionNotFound,
)

__all__ = [
    "ALL",
    "AppendResult",
    "Filter",
    "GroupConfig",
    "GroupNotFound",
    "InvalidReceiptHandle",
    "Message",
    "MessageTooLarge",
    "MessageType",
    "PoppedMessage",
    "RetryPolicy",
    "Store",
    "StoreConfig",
    "StoreError",
    "StoreFullError",
    "TopicConfig",
    "TopicNotFound",
    "TransactionNotFound",
]
