"""Protocol constants: the protocol header, frame types and sizes, class ids and reply codes."""

from __future__ import annotations

from enum import IntEnum

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"  # AMQP 0-9-1; also our answer to any header we refuse
PROTOCOL_HEADER_0_9 = b"AMQP\x01\x01\x00\x09"  # 0-9, which RabbitMQ (and we) treat as 0-9-1

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_OVERHEAD = 8  # type (1) + channel (2) + size (4) + frame-end (1)
FRAME_MIN_SIZE = 4096  # frame_max before tune-ok, and the lowest a peer may negotiate
FRAME_SIZE_FUDGE = FRAME_OVERHEAD  # RabbitMQ accepts payloads up to frame_max (clients miscount)
DEFAULT_FRAME_MAX = 131072  # RabbitMQ's default frame_max offered in connection.tune
MAX_BODY_SIZE = 536_870_912  # RabbitMQ's ?MAX_MSG_SIZE (512 MiB): larger body sizes are 501

CLASS_CONNECTION = 10
CLASS_CHANNEL = 20
CLASS_ACCESS = 30
CLASS_EXCHANGE = 40
CLASS_QUEUE = 50
CLASS_BASIC = 60
CLASS_CONFIRM = 85
CLASS_TX = 90


class ReplyCode(IntEnum):
    """AMQP 0-9-1 reply codes (connection.close / channel.close reply-code)."""

    REPLY_SUCCESS = 200
    # soft errors: close the channel
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    # hard errors: close the connection
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


SOFT_ERRORS = frozenset(
    {
        ReplyCode.CONTENT_TOO_LARGE,
        ReplyCode.NO_ROUTE,
        ReplyCode.NO_CONSUMERS,
        ReplyCode.ACCESS_REFUSED,
        ReplyCode.NOT_FOUND,
        ReplyCode.RESOURCE_LOCKED,
        ReplyCode.PRECONDITION_FAILED,
    }
)


def is_soft_error(code: int) -> bool:
    """True for channel errors (the channel is closed), False for connection errors."""
    return code in SOFT_ERRORS
