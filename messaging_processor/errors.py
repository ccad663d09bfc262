"""Protocol-neutral failure kinds (adapters map each kind to their own code: gRPC Code, MQTT reason
code, AMQP reply code, HTTP status, remoting response code) and the mapping of store exceptions
to them (`store_error`, `StoreCall`)."""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, NoReturn

from store import (
    GroupNotFound,
    InvalidReceiptHandle,
    MessageTooLarge,
    NotReplicated,
    StoreError,
    StoreFullError,
    TopicNotFound,
    TransactionNotFound,
)

from .store_client import PartlyStored

if TYPE_CHECKING:
    from .metrics import Metrics

log = logging.getLogger("messaging_processor")


class ErrorKind(enum.Enum):
    BAD_REQUEST = "bad_request"
    ILLEGAL_TOPIC = "illegal_topic"
    ILLEGAL_GROUP = "illegal_group"
    ILLEGAL_TAG = "illegal_tag"
    ILLEGAL_KEY = "illegal_key"
    ILLEGAL_MESSAGE_GROUP = "illegal_message_group"
    ILLEGAL_PROPERTY = "illegal_property"
    ILLEGAL_DELIVERY_TIME = "illegal_delivery_time"
    ILLEGAL_INVISIBLE_TIME = "illegal_invisible_time"
    ILLEGAL_FILTER = "illegal_filter"
    ILLEGAL_POLLING_TIME = "illegal_polling_time"
    INVALID_RECEIPT_HANDLE = "invalid_receipt_handle"
    BODY_TOO_LARGE = "body_too_large"
    BODY_EMPTY = "body_empty"
    PROPERTIES_TOO_LARGE = "properties_too_large"
    UNAUTHORIZED = "unauthorized"  # no or bad credentials
    FORBIDDEN = "forbidden"  # identity known, action refused
    TOPIC_NOT_FOUND = "topic_not_found"
    GROUP_NOT_FOUND = "group_not_found"
    MESSAGE_NOT_FOUND = "message_not_found"
    TRANSACTION_NOT_FOUND = "transaction_not_found"
    TOO_MANY_REQUESTS = "too_many_requests"
    STORE_FULL = "store_full"  # the store refuses writes (disk full); retry later
    UNAVAILABLE = "unavailable"  # shutting down, store unreachable, too few in-sync replicas
    # stored by a replica group's primary, not acknowledged by its in-sync replicas in time: a
    # retry may store it twice
    NOT_REPLICATED = "not_replicated"
    UNSUPPORTED = "unsupported"
    INTERNAL = "internal"


class ProcessorError(Exception):
    """A request failed; `kind` says why in protocol-neutral terms, `args[0]` is a readable message.
    A failed `send` says in `stored` which of its messages (their indices) were stored all the same:
    none unless the store failed part way through the batch; None when that is not known."""

    stored: frozenset[int] | None = frozenset()

    def __init__(self, kind: ErrorKind, message: str = "") -> None:
        super().__init__(message or kind.value)
        self.kind = kind

    @property
    def message(self) -> str:
        return str(self.args[0])

    def __repr__(self) -> str:
        return f"ProcessorError({self.kind.name}, {self.message!r})"


def store_error(exc: BaseException) -> ProcessorError:
    """Map a store (or argument) exception to a ProcessorError."""
    if isinstance(exc, ProcessorError):
        return exc
    if isinstance(exc, PartlyStored):
        return store_error(exc.error)
    if isinstance(exc, TopicNotFound):
        return ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {exc} does not exist")
    if isinstance(exc, GroupNotFound):
        return ProcessorError(ErrorKind.GROUP_NOT_FOUND, f"consumer group {exc} does not exist")
    if isinstance(exc, InvalidReceiptHandle):
        return ProcessorError(ErrorKind.INVALID_RECEIPT_HANDLE, str(exc))
    if isinstance(exc, MessageTooLarge):
        return ProcessorError(ErrorKind.BODY_TOO_LARGE, str(exc))
    if isinstance(exc, TransactionNotFound):
        return ProcessorError(ErrorKind.TRANSACTION_NOT_FOUND, f"transaction {exc} not found or resolved")
    if isinstance(exc, StoreFullError):
        return ProcessorError(ErrorKind.STORE_FULL, f"the store refuses writes: {exc}")
    if isinstance(exc, NotReplicated):
        return ProcessorError(ErrorKind.NOT_REPLICATED, str(exc))
    if isinstance(exc, StoreError):
        return ProcessorError(ErrorKind.UNAVAILABLE, str(exc))
    if isinstance(exc, ValueError):
        return ProcessorError(ErrorKind.BAD_REQUEST, str(exc))
    log.error("unexpected store failure", exc_info=exc)
    return ProcessorError(ErrorKind.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


class StoreCall:
    """`with StoreCall(metrics, protocol, op):` around a store call: turns store exceptions into
    ProcessorErrors and counts them per (protocol, operation, kind)."""

    __slots__ = ("metrics", "protocol", "op")

    def __init__(self, metrics: Metrics | None, protocol: str, op: str) -> None:
        self.metrics, self.protocol, self.op = metrics, protocol, op

    def __enter__(self) -> None:
        return None

    def __exit__(self, tp: type | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or not isinstance(exc, Exception):
            return
        err = StoreCall.failure(self.metrics, self.protocol, self.op, exc)
        if err is not exc:  # (the same exception goes on by itself)
            raise err from exc

    @staticmethod
    def failure(metrics: Metrics | None, protocol: str, op: str, exc: Exception) -> ProcessorError:
        """The ProcessorError a store failure stands for, counted per (protocol, operation, kind)
        (for hot paths that catch instead of entering a StoreCall)."""
        err = store_error(exc)
        if metrics is not None:
            metrics.errors[(protocol, op, err.kind.value)] += 1
        return err


def store_failed(metrics: Metrics | None, protocol: str, op: str, exc: Exception) -> NoReturn:
    """Raise the ProcessorError a store failure stands for, counted (what a StoreCall does on
    exit; hot paths call it from an `except` instead of entering a StoreCall)."""
    err = StoreCall.failure(metrics, protocol, op, exc)
    if err is exc:
        raise exc
    raise err from exc
