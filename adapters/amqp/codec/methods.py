"""One slotted dataclass per AMQP 0-9-1 method (with RabbitMQ's extensions), and their arguments codec.

Each class carries CLASS_ID, METHOD_ID, NAME ("basic.publish"), SENDER ("client", "server" or
"both": who may send it), HAS_CONTENT (publish, return, deliver, get-ok) and ARGS, the argument
list as space-separated type codes:

    o octet   h short (uint16)   l long (uint32)   q longlong (uint64)   b bit
    s short string, UTF-8 checked (RabbitMQ asserts UTF-8 on these: names, tags, texts)
    z short string, any bytes (publish/deliver/return/get-ok exchange and routing key)
    S long string (bytes)   F field table

A leading "_" marks a reserved argument (ticket, out-of-band, known-hosts, cluster-id, ...): it is
not a dataclass field, it is skipped when decoding and sent as 0 / empty. Consecutive bits share
octets (up to 8 per octet, first bit in the low-order bit). Field names follow the spec with
"-" as "_", plus `nowait` and `global_` as in pamqp/RabbitMQ.

Their generic, table-driven arguments codec (by SPEC) is arguments.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

CLIENT, SERVER, BOTH = "client", "server", "both"


@dataclass(slots=True)
class AMQPMethod:
    """Base class of all methods (no fields)."""

    CLASS_ID: ClassVar[int] = 0
    METHOD_ID: ClassVar[int] = 0
    NAME: ClassVar[str] = ""
    ARGS: ClassVar[str] = ""
    SENDER: ClassVar[str] = BOTH
    HAS_CONTENT: ClassVar[bool] = False
    # (type code, field name or None for reserved), derived from ARGS
    SPEC: ClassVar[tuple[tuple[str, str | None], ...]] = ()


METHODS: dict[int, type[AMQPMethod]] = {}  # (class_id << 16) | method_id -> class
METHODS_BY_NAME: dict[str, type[AMQPMethod]] = {}


def method_key(class_id: int, method_id: int) -> int:
    return (class_id << 16) | method_id


def _method(class_id: int, method_id: int, name: str, args: str, sender: str, content: bool = False) -> Any:
    def wrap(cls: type[AMQPMethod]) -> type[AMQPMethod]:
        cls = dataclass(slots=True)(cls)
        names = iter(f.name for f in fields(cls))
        spec = []
        for code in args.split():
            if code.startswith("_"):
                spec.append((code[1:], None))
            else:
                spec.append((code, next(names)))
        leftover = list(names)
        if leftover:  # pragma: no cover - a definition error
            raise TypeError(f"{cls.__name__}: fields {leftover} are not in ARGS {args!r}")
        cls.CLASS_ID, cls.METHOD_ID, cls.NAME, cls.ARGS = class_id, method_id, name, args
        cls.SENDER, cls.HAS_CONTENT, cls.SPEC = sender, content, tuple(spec)
        METHODS[method_key(class_id, method_id)] = cls
        METHODS_BY_NAME[name] = cls
        return cls

    return wrap


def _table() -> dict[str, Any]:
    return field(default_factory=dict)


# --- connection (10) -------------------------------------------------------------------------------


@_method(10, 10, "connection.start", "o o F S S", SERVER)
class ConnectionStart(AMQPMethod):
    version_major: int = 0
    version_minor: int = 9
    server_properties: dict[str, Any] = _table()
    mechanisms: bytes = b"PLAIN AMQPLAIN"
    locales: bytes = b"en_US"


@_method(10, 11, "connection.start-ok", "F s S s", CLIENT)
class ConnectionStartOk(AMQPMethod):
    client_properties: dict[str, Any] = _table()
    mechanism: str = "PLAIN"
    response: bytes = b""
    locale: str = "en_US"


@_method(10, 20, "connection.secure", "S", SERVER)
class ConnectionSecure(AMQPMethod):
    challenge: bytes = b""


@_method(10, 21, "connection.secure-ok", "S", CLIENT)
class ConnectionSecureOk(AMQPMethod):
    response: bytes = b""


@_method(10, 30, "connection.tune", "h l h", SERVER)
class ConnectionTune(AMQPMethod):
    channel_max: int = 0
    frame_max: int = 0
    heartbeat: int = 0


@_method(10, 31, "connection.tune-ok", "h l h", CLIENT)
class ConnectionTuneOk(AMQPMethod):
    channel_max: int = 0
    frame_max: int = 0
    heartbeat: int = 0


@_method(10, 40, "connection.open", "s _s _b", CLIENT)
class ConnectionOpen(AMQPMethod):
    virtual_host: str = "/"


@_method(10, 41, "connection.open-ok", "_s", SERVER)
class ConnectionOpenOk(AMQPMethod):
    pass


@_method(10, 50, "connection.close", "h s h h", BOTH)
class ConnectionClose(AMQPMethod):
    reply_code: int = 0
    reply_text: str = ""
    class_id: int = 0
    method_id: int = 0


@_method(10, 51, "connection.close-ok", "", BOTH)
class ConnectionCloseOk(AMQPMethod):
    pass


@_method(10, 60, "connection.blocked", "s", SERVER)
class ConnectionBlocked(AMQPMethod):
    reason: str = ""


@_method(10, 61, "connection.unblocked", "", SERVER)
class ConnectionUnblocked(AMQPMethod):
    pass


@_method(10, 70, "connection.update-secret", "S s", CLIENT)
class ConnectionUpdateSecret(AMQPMethod):
    new_secret: bytes = b""
    reason: str = ""


@_method(10, 71, "connection.update-secret-ok", "", SERVER)
class ConnectionUpdateSecretOk(AMQPMethod):
    pass


# --- channel (20) ----------------------------------------------------------------------------------


@_method(20, 10, "channel.open", "_s", CLIENT)
class ChannelOpen(AMQPMethod):
    pass


@_method(20, 11, "channel.open-ok", "_S", SERVER)
class ChannelOpenOk(AMQPMethod):
    pass


@_method(20, 20, "channel.flow", "b", BOTH)
class ChannelFlow(AMQPMethod):
    active: bool = True


@_method(20, 21, "channel.flow-ok", "b", BOTH)
class ChannelFlowOk(AMQPMethod):
    active: bool = True


@_method(20, 40, "channel.close", "h s h h", BOTH)
class ChannelClose(AMQPMethod):
    reply_code: int = 0
    reply_text: str = ""
    class_id: int = 0
    method_id: int = 0


@_method(20, 41, "channel.close-ok", "", BOTH)
class ChannelCloseOk(AMQPMethod):
    pass


# --- access (30): deprecated in 0-9-1, still answered by RabbitMQ -----------------------------------


@_method(30, 10, "access.request", "s b b b b b", CLIENT)
class AccessRequest(AMQPMethod):
    realm: str = "/data"
    exclusive: bool = False
    passive: bool = True
    active: bool = True
    write: bool = True
    read: bool = True


@_method(30, 11, "access.request-ok", "h", SERVER)
class AccessRequestOk(AMQPMethod):
    ticket: int = 1


# --- exchange (40) ---------------------------------------------------------------------------------


@_method(40, 10, "exchange.declare", "_h s s b b b b b F", CLIENT)
class ExchangeDeclare(AMQPMethod):
    exchange: str = ""
    type: str = "direct"
    passive: bool = False
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    nowait: bool = False
    arguments: dict[str, Any] = _table()


@_method(40, 11, "exchange.declare-ok", "", SERVER)
class ExchangeDeclareOk(AMQPMethod):
    pass


@_method(40, 20, "exchange.delete", "_h s b b", CLIENT)
class ExchangeDelete(AMQPMethod):
    exchange: str = ""
    if_unused: bool = False
    nowait: bool = False


@_method(40, 21, "exchange.delete-ok", "", SERVER)
class ExchangeDeleteOk(AMQPMethod):
    pass


@_method(40, 30, "exchange.bind", "_h s s s b F", CLIENT)
class ExchangeBind(AMQPMethod):
    destination: str = ""
    source: str = ""
    routing_key: str = ""
    nowait: bool = False
    arguments: dict[str, Any] = _table()


@_method(40, 31, "exchange.bind-ok", "", SERVER)
class ExchangeBindOk(AMQPMethod):
    pass


@_method(40, 40, "exchange.unbind", "_h s s s b F", CLIENT)
class ExchangeUnbind(AMQPMethod):
    destination: str = ""
    source: str = ""
    routing_key: str = ""
    nowait: bool = False
    arguments: dict[str, Any] = _table()


@_method(40, 51, "exchange.unbind-ok", "", SERVER)  # 51, not 41: RabbitMQ's numbering
class ExchangeUnbindOk(AMQPMethod):
    pass


# --- queue (50) ------------------------------------------------------------------------------------


@_method(50, 10, "queue.declare", "_h s b b b b b F", CLIENT)
class QueueDeclare(AMQPMethod):
    queue: str = ""
    passive: bool = False
    durable: bool = False
    exclusive: bool = False
    auto_delete: bool = False
    nowait: bool = False
    arguments: dict[str, Any] = _table()


@_method(50, 11, "queue.declare-ok", "s l l", SERVER)
class QueueDeclareOk(AMQPMethod):
    queue: str = ""
    message_count: int = 0
    consumer_count: int = 0


@_method(50, 20, "queue.bind", "_h s s s b F", CLIENT)
class QueueBind(AMQPMethod):
    queue: str = ""
    exchange: str = ""
    routing_key: str = ""
    nowait: bool = False
    arguments: dict[str, Any] = _table()


@_method(50, 21, "queue.bind-ok", "", SERVER)
class QueueBindOk(AMQPMethod):
    pass


@_method(50, 30, "queue.purge", "_h s b", CLIENT)
class QueuePurge(AMQPMethod):
    queue: str = ""
    nowait: bool = False


@_method(50, 31, "queue.purge-ok", "l", SERVER)
class QueuePurgeOk(AMQPMethod):
    message_count: int = 0


@_method(50, 40, "queue.delete", "_h s b b b", CLIENT)
class QueueDelete(AMQPMethod):
    queue: str = ""
    if_unused: bool = False
    if_empty: bool = False
    nowait: bool = False


@_method(50, 41, "queue.delete-ok", "l", SERVER)
class QueueDeleteOk(AMQPMethod):
    message_count: int = 0


@_method(50, 50, "queue.unbind", "_h s s s F", CLIENT)
class QueueUnbind(AMQPMethod):
    queue: str = ""
    exchange: str = ""
    routing_key: str = ""
    arguments: dict[str, Any] = _table()


@_method(50, 51, "queue.unbind-ok", "", SERVER)
class QueueUnbindOk(AMQPMethod):
    pass


# --- basic (60) ------------------------------------------------------------------------------------


@_method(60, 10, "basic.qos", "l h b", CLIENT)
class BasicQos(AMQPMethod):
    prefetch_size: int = 0
    prefetch_count: int = 0
    global_: bool = False


@_method(60, 11, "basic.qos-ok", "", SERVER)
class BasicQosOk(AMQPMethod):
    pass


@_method(60, 20, "basic.consume", "_h s s b b b b F", CLIENT)
class BasicConsume(AMQPMethod):
    queue: str = ""
    consumer_tag: str = ""
    no_local: bool = False
    no_ack: bool = False
    exclusive: bool = False
    nowait: bool = False
    arguments: dict[str, Any] = _table()


@_method(60, 21, "basic.consume-ok", "s", SERVER)
class BasicConsumeOk(AMQPMethod):
    consumer_tag: str = ""


@_method(60, 30, "basic.cancel", "s b", BOTH)  # server -> client: consumer cancel notification
class BasicCancel(AMQPMethod):
    consumer_tag: str = ""
    nowait: bool = False


@_method(60, 31, "basic.cancel-ok", "s", SERVER)
class BasicCancelOk(AMQPMethod):
    consumer_tag: str = ""


@_method(60, 40, "basic.publish", "_h z z b b", CLIENT, content=True)
class BasicPublish(AMQPMethod):
    exchange: str = ""
    routing_key: str = ""
    mandatory: bool = False
    immediate: bool = False


@_method(60, 50, "basic.return", "h z z z", SERVER, content=True)
class BasicReturn(AMQPMethod):
    reply_code: int = 0
    reply_text: str = ""
    exchange: str = ""
    routing_key: str = ""


@_method(60, 60, "basic.deliver", "z q b z z", SERVER, content=True)
class BasicDeliver(AMQPMethod):
    consumer_tag: str = ""
    delivery_tag: int = 0
    redelivered: bool = False
    exchange: str = ""
    routing_key: str = ""


@_method(60, 70, "basic.get", "_h s b", CLIENT)
class BasicGet(AMQPMethod):
    queue: str = ""
    no_ack: bool = False


@_method(60, 71, "basic.get-ok", "q b z z l", SERVER, content=True)
class BasicGetOk(AMQPMethod):
    delivery_tag: int = 0
    redelivered: bool = False
    exchange: str = ""
    routing_key: str = ""
    message_count: int = 0


@_method(60, 72, "basic.get-empty", "_s", SERVER)
class BasicGetEmpty(AMQPMethod):
    pass


@_method(60, 80, "basic.ack", "q b", BOTH)  # server -> client: publisher confirms
class BasicAck(AMQPMethod):
    delivery_tag: int = 0
    multiple: bool = False


@_method(60, 90, "basic.reject", "q b", CLIENT)
class BasicReject(AMQPMethod):
    delivery_tag: int = 0
    requeue: bool = True


@_method(60, 100, "basic.recover-async", "b", CLIENT)
class BasicRecoverAsync(AMQPMethod):
    requeue: bool = False


@_method(60, 110, "basic.recover", "b", CLIENT)
class BasicRecover(AMQPMethod):
    requeue: bool = False


@_method(60, 111, "basic.recover-ok", "", SERVER)
class BasicRecoverOk(AMQPMethod):
    pass


@_method(60, 120, "basic.nack", "q b b", BOTH)  # server -> client: publisher confirms
class BasicNack(AMQPMethod):
    delivery_tag: int = 0
    multiple: bool = False
    requeue: bool = True


# --- confirm (85) and tx (90) -------------------------------------------------------------------------


@_method(85, 10, "confirm.select", "b", CLIENT)
class ConfirmSelect(AMQPMethod):
    nowait: bool = False


@_method(85, 11, "confirm.select-ok", "", SERVER)
class ConfirmSelectOk(AMQPMethod):
    pass


@_method(90, 10, "tx.select", "", CLIENT)
class TxSelect(AMQPMethod):
    pass


@_method(90, 11, "tx.select-ok", "", SERVER)
class TxSelectOk(AMQPMethod):
    pass


@_method(90, 20, "tx.commit", "", CLIENT)
class TxCommit(AMQPMethod):
    pass


@_method(90, 21, "tx.commit-ok", "", SERVER)
class TxCommitOk(AMQPMethod):
    pass


@_method(90, 30, "tx.rollback", "", CLIENT)
class TxRollback(AMQPMethod):
    pass


@_method(90, 31, "tx.rollback-ok", "", SERVER)
class TxRollbackOk(AMQPMethod):
    pass


CLIENT_METHODS = frozenset(k for k, c in METHODS.items() if c.SENDER != SERVER)  # a server decodes these
SERVER_METHODS = frozenset(k for k, c in METHODS.items() if c.SENDER != CLIENT)  # a client decodes these
