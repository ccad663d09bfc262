"""The gateway's durable message store: commit log, consume queues, index, pop/ack progress,
delay timers, transactions and retention. Protocol-free; see docs/store.md."""

from .commitlog import StoreFullError
from .compaction import CompactionStats, compaction_key
from .config import GroupConfig, RetryPolicy, StoreConfig, TopicConfig
from .errors import (
    GroupNotFound,
    InvalidReceiptHandle,
    MessageTooLarge,
    NotReplicated,
    StoreError,
    TopicNotFound,
    TransactionNotFound,
)
from .filters import ALL, Filter
from .message import AppendResult, Message, MessageType, PoppedMessage
from .store import Store

__all__ = [
    "CompactionStats",
    "compaction_key",
    "ALL",
    "AppendResult",
    "Filter",
    "GroupConfig",
    "GroupNotFound",
    "InvalidReceiptHandle",
    "Message",
    "MessageTooLarge",
    "MessageType",
    "NotReplicated",
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
