"""Sans-IO codec of the RocketMQ 4.x remoting protocol (no sockets, no asyncio).

    from adapters.remoting.codec import Decoder, RemotingCommand, RequestCode, ResponseCode

    dec = Decoder()                                  # max frame 16 MiB, as Netty's decoder
    dec.feed(data)
    for cmd in dec:                                  # RemotingCommand (JSON or ROCKETMQ header)
        reply = cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": "0"})
        transport.write(reply.encode())              # always JSON, string extFields

Modules: codes (request/response/language/version constants, flags), command (frames, headers,
Decoder), headers (lenient extFields access, SEND_MESSAGE_V2 short names), message (stored-message
layout, batch bodies, properties strings, offset message ids), jsonx (fastjson's JSON: sorted
keys, bare numeric keys for clients below 4.9.4). Wire facts: ../shared/protocols/rocketmq-remoting.md.
"""

from .codes import (
    DEFAULT_TOPIC,
    DLQ_PREFIX,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    JSON,
    LANGUAGES,
    PERM_READ,
    PERM_READ_WRITE,
    PERM_WRITE,
    RETRY_PREFIX,
    ROCKETMQ,
    SERVER_VERSION,
    V4_9_4,
    RequestCode,
    ResponseCode,
    request_name,
    response_name,
)
from .command import (
    MAX_FRAME_SIZE,
    Decoder,
    FrameTooLarge,
    RemotingCodecError,
    RemotingCommand,
    decode_command,
    decode_frame,
    encode_command,
)
from .headers import Ext, HeaderError, send_header
from .jsonx import dumps, dumps_bytes, loads, wants_standard_json
from .message import (
    BatchItem,
    MessageCodecError,
    MessageExt,
    UniqKeyFactory,
    decode_batch,
    decode_message,
    decode_messages,
    decode_offset_msg_id,
    decode_properties,
    encode_batch,
    encode_message,
    encode_properties,
    offset_msg_id,
    parse_host_port,
)

__all__ = [
    "BatchItem",
    "DEFAULT_TOPIC",
    "DLQ_PREFIX",
    "Decoder",
    "Ext",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "FrameTooLarge",
    "HeaderError",
    "JSON",
    "LANGUAGES",
    "MAX_FRAME_SIZE",
    "MessageCodecError",
    "MessageExt",
    "PERM_READ",
    "PERM_READ_WRITE",
    "PERM_WRITE",
    "RETRY_PREFIX",
    "ROCKETMQ",
    "RemotingCodecError",
    "RemotingCommand",
    "RequestCode",
    "ResponseCode",
    "SERVER_VERSION",
    "UniqKeyFactory",
    "V4_9_4",
    "decode_batch",
    "decode_command",
    "decode_frame",
    "decode_message",
    "decode_messages",
    "decode_offset_msg_id",
    "decode_properties",
    "dumps",
    "dumps_bytes",
    "encode_batch",
    "encode_command",
    "encode_message",
    "encode_properties",
    "loads",
    "offset_msg_id",
    "parse_host_port",
    "request_name",
    "response_name",
    "send_header",
    "wants_standard_json",
]
