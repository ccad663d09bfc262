"""Request, response, language and version constants of the RocketMQ remoting protocol.

Values from Apache RocketMQ's `RequestCode`, `ResponseCode`, `RemotingSysResponseCode`,
`LanguageCode` and `MQVersion` (see ../shared/protocols/rocketmq-remoting.md §1-2)."""

from __future__ import annotations

# Serialization type: the high byte of the header-length word.
JSON = 0
ROCKETMQ = 1

# Flag bits.
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2


class RequestCode:
    """Request codes the gateway knows (clients -> server, and the broker -> client ones)."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39  # broker -> producer
    NOTIFY_CONSUMER_IDS_CHANGED = 40  # broker -> consumer, oneway
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    CHECK_CLIENT_CONFIG = 46
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    GET_CONSUMER_RUNNING_INFO = 307  # broker -> consumer
    CONSUME_MESSAGE_DIRECTLY = 309  # broker -> consumer
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    LITE_PULL_MESSAGE = 361
    # Pop, as 5.0-5.2 clients send them (JSON header only: they do not fit the binary int16) ...
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    PEEK_MESSAGE = 200052
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    BATCH_ACK_MESSAGE = 200151
    # ... and as later clients send them (the same values truncated to 16 bits).
    POP_MESSAGE_SHORT = 3442
    ACK_MESSAGE_SHORT = 3443
    CHANGE_MESSAGE_INVISIBLETIME_SHORT = 3445
    BATCH_ACK_MESSAGE_SHORT = 3543
    # Gateway extension (name server): proxies register their endpoints. JSON header only.
    REGISTER_PROXY = 7001
    UNREGISTER_PROXY = 7002
    GET_PROXY_LIST = 7003


class ResponseCode:
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    BROKER_NOT_EXIST = 211
    FLOW_CONTROL = 215


def _names(cls: type) -> dict[int, str]:
    out: dict[int, str] = {}
    for k, v in vars(cls).items():
        if k.isupper() and isinstance(v, int):
            out.setdefault(v, k)
    return out


REQUEST_NAMES = _names(RequestCode)
RESPONSE_NAMES = _names(ResponseCode)


def request_name(code: int) -> str:
    """`SEND_MESSAGE_V2` for 310; the number for codes this module does not name."""
    return REQUEST_NAMES.get(code, str(code))


def response_name(code: int) -> str:
    return RESPONSE_NAMES.get(code, str(code))


# LanguageCode enum: names are what JSON headers carry, ordinals what binary headers carry.
LANGUAGES = (
    "JAVA",
    "CPP",
    "DOTNET",
    "PYTHON",
    "DELPHI",
    "ERLANG",
    "RUBY",
    "OTHER",
    "HTTP",
    "GO",
    "PHP",
    "OMS",
    "RUST",
    "NODE_JS",
)
LANGUAGE_CODES = {name: i for i, name in enumerate(LANGUAGES)}


def language_name(code: int) -> str:
    return LANGUAGES[code] if 0 <= code < len(LANGUAGES) else "OTHER"


# MQVersion ordinals.
V4_0_0 = 213
V4_5_0 = 313
V4_9_4 = 401  # from here on clients get standard JSON route data (see routes.py)
V5_0_0 = 413
V5_3_3 = 479
SERVER_VERSION = V4_9_4  # the `version` the gateway puts in what it sends

# Message system flags (MessageSysFlag).
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
SYSFLAG_COMPRESSION_TYPE_MASK = 0x700  # bits 8-10: 0 (old data) or 3 = zlib, 1 = LZ4, 2 = ZSTD
COMPRESSION_ZLIB = 3

# Pull request sysFlag bits (PullSysFlag).
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4
PULL_CLASS_FILTER = 0x8
PULL_LITE = 0x10

# Topic permissions (PermName).
PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4
PERM_READ_WRITE = PERM_READ | PERM_WRITE

MASTER_ID = 0
DEFAULT_TOPIC = "TBW102"  # the producers' auto-create template topic
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
