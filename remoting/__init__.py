"""The RocketMQ remoting wire, shared by the 4.x adapter, the name server and CLUSTER mode's
store protocol. This package imports nothing from the project.

The frame codec is sans-IO (no sockets, no asyncio) and is what `import remoting` gives:

    from remoting import Decoder, RemotingCommand, RequestCode, ResponseCode

    dec = Decoder()                                  # max frame 16 MiB, as Netty's decoder
    dec.feed(data)
    for cmd in dec:                                  # RemotingCommand (JSON or ROCKETMQ header)
        reply = cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": "0"})
        transport.write(reply.encode())              # always JSON, string extFields

Modules: codes (request/response/language/version constants, flags), command (frames, headers,
Decoder), headers (lenient extFields access, SEND_MESSAGE_V2 short names), jsonx (fastjson's JSON:
sorted keys, bare numeric keys for clients below 4.9.4), routes (route and cluster data bodies),
address (`host:port` parsing). The asyncio parts are imported on their own: `remoting.client` (a
request/response client) and `remoting.server` (the frame server every remoting listener runs,
each supplying only its dispatch); `remoting.cluster_auth` is the cluster secret's sans-IO
connect-time handshake, which both of them run when given one. The 4.x message encodings are the adapter's
(adapters/remoting/message_codec.py). Wire facts: ../shared/protocols/rocketmq-remoting.md.
"""

from .address import parse_host_port
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

__all__ = [
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
    "V4_9_4",
    "decode_command",
    "decode_frame",
    "dumps",
    "dumps_bytes",
    "encode_command",
    "loads",
    "parse_host_port",
    "request_name",
    "response_name",
    "send_header",
    "wants_standard_json",
]
