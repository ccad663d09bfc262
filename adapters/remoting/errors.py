"""Failures of remoting requests and their response codes."""

from __future__ import annotations

from messaging_processor import ErrorKind, ProcessorError
from remoting import ResponseCode

R = ResponseCode

# ErrorKind -> remoting response code (the Java broker's choices where it has one).
KIND_CODES: dict[ErrorKind, int] = {
    ErrorKind.BAD_REQUEST: R.INVALID_PARAMETER,
    ErrorKind.ILLEGAL_TOPIC: R.MESSAGE_ILLEGAL,
    ErrorKind.ILLEGAL_GROUP: R.INVALID_PARAMETER,
    ErrorKind.ILLEGAL_TAG: R.MESSAGE_ILLEGAL,
    ErrorKind.ILLEGAL_KEY: R.MESSAGE_ILLEGAL,
    ErrorKind.ILLEGAL_MESSAGE_GROUP: R.MESSAGE_ILLEGAL,
    ErrorKind.ILLEGAL_PROPERTY: R.MESSAGE_ILLEGAL,
    ErrorKind.ILLEGAL_DELIVERY_TIME: R.MESSAGE_ILLEGAL,
    ErrorKind.ILLEGAL_INVISIBLE_TIME: R.INVALID_PARAMETER,
    ErrorKind.ILLEGAL_FILTER: R.SUBSCRIPTION_PARSE_FAILED,
    ErrorKind.ILLEGAL_POLLING_TIME: R.INVALID_PARAMETER,
    ErrorKind.INVALID_RECEIPT_HANDLE: R.NO_MESSAGE,
    ErrorKind.BODY_TOO_LARGE: R.MESSAGE_ILLEGAL,
    ErrorKind.BODY_EMPTY: R.MESSAGE_ILLEGAL,
    ErrorKind.PROPERTIES_TOO_LARGE: R.MESSAGE_ILLEGAL,
    ErrorKind.UNAUTHORIZED: R.NO_PERMISSION,
    ErrorKind.FORBIDDEN: R.NO_PERMISSION,
    ErrorKind.TOPIC_NOT_FOUND: R.TOPIC_NOT_EXIST,
    ErrorKind.GROUP_NOT_FOUND: R.SUBSCRIPTION_GROUP_NOT_EXIST,
    ErrorKind.MESSAGE_NOT_FOUND: R.QUERY_NOT_FOUND,
    ErrorKind.TRANSACTION_NOT_FOUND: R.SYSTEM_ERROR,
    ErrorKind.TOO_MANY_REQUESTS: R.SYSTEM_BUSY,
    ErrorKind.STORE_FULL: R.SERVICE_NOT_AVAILABLE,
    ErrorKind.UNAVAILABLE: R.SERVICE_NOT_AVAILABLE,
    # (stored on the primary: the broker's FLUSH_SLAVE_TIMEOUT is a send result with its header,
    # which a refusal has none of; SYSTEM_ERROR is a code 4.x producers resend, as the broker's
    # IN_SYNC_REPLICAS_NOT_ENOUGH)
    ErrorKind.NOT_REPLICATED: R.SYSTEM_ERROR,
    ErrorKind.UNSUPPORTED: R.SYSTEM_ERROR,
    ErrorKind.INTERNAL: R.SYSTEM_ERROR,
}


class RemotingError(Exception):
    """A request this adapter refuses itself: answered with `code` and the message as remark."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code

    @property
    def remark(self) -> str:
        return str(self.args[0])


def code_of(err: ProcessorError) -> int:
    return KIND_CODES.get(err.kind, R.SYSTEM_ERROR)
