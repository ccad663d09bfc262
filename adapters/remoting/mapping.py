"""RocketMQ 4.x message <-> store `Message` (see docs/remoting.md, "Message mapping").

Inbound, system properties with a store field move onto it: TAGS -> tag, KEYS (space separated)
-> keys, UNIQ_KEY -> message id, `__SHARDINGKEY` -> message group (FIFO), DELAY level /
`__STARTDELIVERTIME` / TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS -> delivery time,
TRAN_MSG or the PREPARED sysFlag -> transaction type. Per-hop properties (WAIT, MSG_REGION,
TRACE_ON, MIN/MAX_OFFSET, REAL_TOPIC/REAL_QID) are dropped; the rest are stored as properties.
A non-zero message `flag` travels as property `__FLAG`.

Outbound, the reverse, in the stored-message layout: TAGS, KEYS, UNIQ_KEY (the store's message id,
so 4.x, gRPC and MQTT consumers see the same id), `__SHARDINGKEY`; the reconsume count of retry
copies (property RECONSUME_TIME) goes into the record's reconsumeTimes field."""

from __future__ import annotations

import time

from adapters.remoting import message_codec as wm
from adapters.remoting.message_codec import MessageExt
from messaging_processor import Message, MessageType
from messaging_processor.properties import P_USER_PROPERTIES, user_property_pairs
from messaging_processor.trace_context import GATEWAY_TRACEPARENT
from remoting import parse_host_port
from remoting.codes import SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_PREPARED

# The broker's messageDelayLevel default, in ms: levels 1..18.
DELAY_LEVELS_MS = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000,
    360_000, 420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip

PROPERTY_FLAG = "__FLAG"
# Dropped on the way in: per-hop or broker-internal.
_DROP = frozenset(
    {
        wm.PROPERTY_WAIT_STORE_MSG_OK,
        wm.PROPERTY_MSG_REGION,
        wm.PROPERTY_TRACE_SWITCH,
        wm.PROPERTY_MIN_OFFSET,
        wm.PROPERTY_MAX_OFFSET,
        wm.PROPERTY_REAL_TOPIC,
        wm.PROPERTY_REAL_QUEUE_ID,
        wm.PROPERTY_TRANSACTION_PREPARED,
        wm.PROPERTY_POP_CK,
    }
)
# Never shown to 4.x consumers: the store's, the gRPC adapter's and the tracer's bookkeeping (a trace
# context the gateway made; a client's `traceparent` is an ordinary property, delivered as sent).
HIDDEN = frozenset(
    {"__REAL_TOPIC", "__REAL_QID", "TRANSACTION_CHECK_TIMES", PROPERTY_FLAG, GATEWAY_TRACEPARENT}
)


def delay_level_ms(level: int) -> int:
    """Delay of a RocketMQ delay level (1-18; higher levels are capped at 18, as the broker does)."""
    if level <= 0:
        return 0
    return DELAY_LEVELS_MS[min(level, len(DELAY_LEVELS_MS)) - 1]


def _int_prop(props: dict[str, str], key: str) -> int | None:
    v = props.pop(key, None)
    if v is None:
        return None
    try:
        return int(v.strip())
    except ValueError:
        return None


def to_store(
    topic: str,
    body: bytes,
    properties: dict[str, str],
    *,
    sys_flag: int = 0,
    flag: int = 0,
    queue_id: int = -1,
    born_timestamp: int = 0,
    born_host: str = "",
    now_ms: int | None = None,
) -> Message:
    """A message a 4.x producer sent -> a store Message. `properties` is consumed (modified)."""
    props = properties
    tag = props.pop(wm.PROPERTY_TAGS, "")
    keys_text = props.pop(wm.PROPERTY_KEYS, "")
    keys = tuple(k for k in keys_text.split(wm.KEY_SEPARATOR) if k.strip()) if keys_text else ()
    msg_id = props.pop(wm.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
    group = props.pop(wm.PROPERTY_SHARDING_KEY, "")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    deliver_at = 0
    level = _int_prop(props, wm.PROPERTY_DELAY_TIME_LEVEL)
    if level:
        deliver_at = now + delay_level_ms(level)
    for key, relative, scale in (
        (wm.PROPERTY_START_DELIVER_TIME, False, 1),
        (wm.PROPERTY_TIMER_DELIVER_MS, False, 1),
        (wm.PROPERTY_TIMER_DELAY_SEC, True, 1000),
        (wm.PROPERTY_TIMER_DELAY_MS, True, 1),
    ):
        v = _int_prop(props, key)
        if v:
            deliver_at = now + v * scale if relative else v
    transaction = (sys_flag & SYSFLAG_TRANSACTION_MASK) == SYSFLAG_TRANSACTION_PREPARED or (
        props.get(wm.PROPERTY_TRANSACTION_PREPARED, "").lower() == "true"
    )
    for k in _DROP & props.keys():
        del props[k]
    if flag:
        props[PROPERTY_FLAG] = str(flag)
    if transaction:
        mtype = MessageType.TRANSACTION
    elif group:
        mtype = MessageType.FIFO
    elif deliver_at > now:
        mtype = MessageType.DELAY
    else:
        mtype = MessageType.NORMAL
        deliver_at = 0
    return Message(
        topic,
        body,
        tag,
        keys,
        props,
        group,
        deliver_at if deliver_at > now else 0,
        msg_id,
        born_timestamp,
        born_host,
        queue_id,
        mtype,
    )


def wire_properties(msg: Message) -> dict[str, str]:
    """The properties string of a stored message as 4.x consumers expect it; the pairs of
    `mqtt.user_properties` (MQTT 5 user properties, AMQP headers) are properties of their own
    unless a stored property has the name (the first pair of a name wins)."""
    props = msg.properties
    out = {k: v for k, v in props.items() if k not in HIDDEN}
    if P_USER_PROPERTIES in props:
        for k, v in user_property_pairs(props):
            if k not in out and k not in HIDDEN:
                out[k] = v
    if msg.tag:
        out[wm.PROPERTY_TAGS] = msg.tag
    if msg.keys:
        out[wm.PROPERTY_KEYS] = wm.KEY_SEPARATOR.join(msg.keys)
    if msg.message_id:
        out[wm.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = msg.message_id
    if msg.message_group:
        out[wm.PROPERTY_SHARDING_KEY] = msg.message_group
    return out


def to_wire(
    msg: Message,
    store_host: tuple[str, int],
    *,
    topic: str | None = None,
    extra: dict[str, str] | None = None,
    sys_flag: int = 0,
    reconsume_times: int | None = None,
) -> MessageExt:
    """A stored message in the stored-message layout; `topic` overrides the record's topic."""
    props = wire_properties(msg)
    rc = props.pop(wm.PROPERTY_RECONSUME_TIME, None)
    if reconsume_times is None:
        try:
            reconsume_times = int(rc) if rc is not None else msg.reconsume_times
        except ValueError:
            reconsume_times = msg.reconsume_times
    if extra:
        props.update(extra)
    flag = msg.properties.get(PROPERTY_FLAG)
    return MessageExt(
        topic=topic or msg.topic,
        body=msg.body,
        properties=props,
        queue_id=max(msg.queue_id, 0),
        flag=int(flag) if flag and flag.lstrip("-").isdigit() else 0,
        queue_offset=max(msg.queue_offset, 0),
        commitlog_offset=max(msg.commitlog_offset, 0),
        sys_flag=sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=parse_host_port(msg.born_host),
        store_timestamp=msg.store_timestamp,
        store_host=store_host,
        reconsume_times=reconsume_times,
    )


def encode_messages(msgs: list[MessageExt]) -> bytes:
    return b"".join(wm.encode_message(m) for m in msgs)
