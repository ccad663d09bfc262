"""`messaging_processor.ErrorKind` → `apache.rocketmq.v2.Code`, and prebuilt `Status` values.

RocketMQ 5 reports errors in the response body's `status` under gRPC status OK; this table is the
one place where a protocol-neutral failure gets its gRPC code."""

from __future__ import annotations

from adapters.grpc.generated import definition_pb2 as d
from messaging_processor import ErrorKind, ProcessorError


class Code:
    """The `apache.rocketmq.v2.Code` values as plain int class attributes: the generated
    `definition_pb2.Code` resolves every attribute through `EnumTypeWrapper.__getattr__` (~1 µs, paid
    per acked entry on the receive path)."""


for _name, _value in d.Code.items():
    setattr(Code, _name, _value)
del _name, _value

KIND_TO_CODE: dict[ErrorKind, int] = {
    ErrorKind.BAD_REQUEST: Code.BAD_REQUEST,
    ErrorKind.ILLEGAL_TOPIC: Code.ILLEGAL_TOPIC,
    ErrorKind.ILLEGAL_GROUP: Code.ILLEGAL_CONSUMER_GROUP,
    ErrorKind.ILLEGAL_TAG: Code.ILLEGAL_MESSAGE_TAG,
    ErrorKind.ILLEGAL_KEY: Code.ILLEGAL_MESSAGE_KEY,
    ErrorKind.ILLEGAL_MESSAGE_GROUP: Code.ILLEGAL_MESSAGE_GROUP,
    ErrorKind.ILLEGAL_PROPERTY: Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
    ErrorKind.ILLEGAL_DELIVERY_TIME: Code.ILLEGAL_DELIVERY_TIME,
    ErrorKind.ILLEGAL_INVISIBLE_TIME: Code.ILLEGAL_INVISIBLE_TIME,
    ErrorKind.ILLEGAL_FILTER: Code.ILLEGAL_FILTER_EXPRESSION,
    ErrorKind.ILLEGAL_POLLING_TIME: Code.ILLEGAL_POLLING_TIME,
    ErrorKind.INVALID_RECEIPT_HANDLE: Code.INVALID_RECEIPT_HANDLE,
    ErrorKind.BODY_TOO_LARGE: Code.MESSAGE_BODY_TOO_LARGE,
    ErrorKind.BODY_EMPTY: Code.MESSAGE_BODY_EMPTY,
    ErrorKind.PROPERTIES_TOO_LARGE: Code.MESSAGE_PROPERTIES_TOO_LARGE,
    ErrorKind.UNAUTHORIZED: Code.UNAUTHORIZED,
    ErrorKind.FORBIDDEN: Code.FORBIDDEN,
    ErrorKind.TOPIC_NOT_FOUND: Code.TOPIC_NOT_FOUND,
    ErrorKind.GROUP_NOT_FOUND: Code.CONSUMER_GROUP_NOT_FOUND,
    ErrorKind.MESSAGE_NOT_FOUND: Code.MESSAGE_NOT_FOUND,
    ErrorKind.TRANSACTION_NOT_FOUND: Code.INVALID_TRANSACTION_ID,
    ErrorKind.TOO_MANY_REQUESTS: Code.TOO_MANY_REQUESTS,
    # The store refuses writes (disk below --disk-free-limit): "not now, retry later", the v2 code of
    # backpressure (the Apache proxy's for a broker's SYSTEM_BUSY flow control). The Apache proxy has
    # no mapping for the broker's disk-full SERVICE_NOT_AVAILABLE (14) and falls back to
    # INTERNAL_SERVER_ERROR, which the official clients retry at once: hammering a full store.
    ErrorKind.STORE_FULL: Code.TOO_MANY_REQUESTS,
    # The store, its primary or enough in-sync replicas cannot take the request now (nothing was
    # stored when a send is refused so): the v2 code of "not available" (the Apache proxy's for a
    # broker's SLAVE_NOT_AVAILABLE). The official clients (Java, Go, C#, Node.js, Python) resend any
    # failed non-transactional send at once, this one included; TOO_MANY_REQUESTS they resend after
    # a backoff (the Python client not at all), so it stays the code of flow control only.
    ErrorKind.UNAVAILABLE: Code.HA_NOT_AVAILABLE,
    # Stored by the primary, not acknowledged by its in-sync replicas in time: the Apache proxy's
    # code for a broker's FLUSH_SLAVE_TIMEOUT, resent at once by the official clients as well.
    ErrorKind.NOT_REPLICATED: Code.SLAVE_PERSISTENCE_TIMEOUT,
    ErrorKind.UNSUPPORTED: Code.UNSUPPORTED,
    ErrorKind.INTERNAL: Code.INTERNAL_SERVER_ERROR,
}

OK = d.Status(code=Code.OK, message="OK")
MULTIPLE_RESULTS = d.Status(code=Code.MULTIPLE_RESULTS, message="entries have different results")
NO_MESSAGE = d.Status(code=Code.MESSAGE_NOT_FOUND, message="no new message")
CLIENT_ID_REQUIRED = d.Status(code=Code.CLIENT_ID_REQUIRED, message="x-mq-client-id metadata is required")


def code_of(kind: ErrorKind) -> int:
    return KIND_TO_CODE.get(kind, Code.INTERNAL_SERVER_ERROR)


def status_of(err: ProcessorError) -> d.Status:
    """The response Status for a processor failure."""
    return d.Status(code=KIND_TO_CODE.get(err.kind, Code.INTERNAL_SERVER_ERROR), message=err.message)


def status(code: int, message: str) -> d.Status:
    return d.Status(code=code, message=message)
