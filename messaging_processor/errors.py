"""Protocol-neutral failure kinds. Adapters map each kind to their own code (gRPC Code, MQTT reason
code, AMQP reply code, HTTP status, remoting response code)."""

from __future__ import annotations

import enum


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
    UNAVAILABLE = "unavailable"  # shutting down, store unreachable
    UNSUPPORTED = "unsupported"
    INTERNAL = "internal"


class ProcessorError(Exception):
    """A request failed; `kind` says why in protocol-neutral terms, `args[0]` is a readable message."""

    def __init__(self, kind: ErrorKind, message: str = "") -> None:
        super().__init__(message or kind.value)
        self.kind = kind

    @property
    def message(self) -> str:
        return str(self.args[0])

    def __repr__(self) -> str:
        return f"ProcessorError({self.kind.name}, {self.message!r})"
