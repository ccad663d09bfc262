"""Conversion between `apache.rocketmq.v2` protobuf values and the gateway's model.

- `to_store`: a `definition_pb2.Message` a producer sent → `store.Message`.
- `fill_proto`: a `Delivery` (popped message + receipt handle) → a `definition_pb2.Message`, in place.
- `message_to_proto`: a stored `Message` without a handle (transaction check-back).
- Settings, durations, timestamps, endpoints and the `authorization` header.

System properties with a store field map onto it (tag, keys, message id, message group, delivery
time, born timestamp/host, message type). The rest that must survive a round trip travel as
properties under RocketMQ's own reserved name `CHECK_IMMUNITY_TIME_IN_SECONDS`, and `trace_context`
as `traceparent` (the W3C trace context every protocol shares); both are taken out of
`user_properties` again on delivery. Only a client's trace context is delivered (none when the
producer sent none): one the gateway derived or made (`__TRACEPARENT`) is not."""

from __future__ import annotations

import gzip
import hashlib
import ipaddress
import zlib

from google.protobuf import duration_pb2, timestamp_pb2

from adapters.grpc.codes import Code
from adapters.grpc.generated import definition_pb2 as d
from messaging_processor import Delivery, ErrorKind, Identity, Message, MessageType, ProcessorError
from messaging_processor.properties import P_USER_PROPERTIES, user_property_pairs
from messaging_processor.trace_context import GATEWAY_TRACEPARENT, TRACEPARENT

Timestamp = timestamp_pb2.Timestamp
Duration = duration_pb2.Duration

PROP_TRACE_CONTEXT = TRACEPARENT  # system_properties.trace_context
PROP_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
# Properties the store, the tracer or this adapter add that are not user properties.
HIDDEN_PROPERTIES = frozenset(
    {
        "__REAL_TOPIC",
        "__REAL_QID",
        "TRANSACTION_CHECK_TIMES",
        PROP_TRACE_CONTEXT,
        PROP_CHECK_IMMUNITY,
        GATEWAY_TRACEPARENT,
    }
)

# store.MessageType (0..3) -> proto MessageType (1..4), and back.
_TYPE_TO_PROTO = (d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION)
_TYPE_FROM_PROTO = {
    d.NORMAL: MessageType.NORMAL,
    d.FIFO: MessageType.FIFO,
    d.DELAY: MessageType.DELAY,
    d.TRANSACTION: MessageType.TRANSACTION,
}
MAX_INFLATED_BODY = 128 * 1024 * 1024


class GrpcError(Exception):
    """A request this adapter refuses itself, with its `Code`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code

    def status(self) -> d.Status:
        return d.Status(code=self.code, message=str(self))


# ---------------------------------------------------------------------------- time


def ts_ms(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def ms_ts(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def dur_ms(dur: Duration) -> int:
    return dur.seconds * 1000 + dur.nanos // 1_000_000


def ms_dur(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


# ---------------------------------------------------------------------------- messages


def to_store(m: d.Message) -> Message:
    """A message as a producer sent it → a store Message (raises GrpcError / ProcessorError)."""
    sp = m.system_properties
    body = m.body
    if sp.body_encoding == d.GZIP:
        body = _gunzip(body)
    up = m.user_properties
    props = dict(up) if up else {}
    mtype = sp.message_type
    deliver_at = ts_ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else 0
    group = sp.message_group
    keys = sp.keys
    if mtype in _TYPE_FROM_PROTO:
        msg_type = _TYPE_FROM_PROTO[mtype]
    elif mtype == d.MESSAGE_TYPE_UNSPECIFIED:
        msg_type = MessageType.FIFO if group else MessageType.DELAY if deliver_at else MessageType.NORMAL
    else:
        raise GrpcError(Code.UNSUPPORTED, f"message type {d.MessageType.Name(mtype)} is not supported")
    if msg_type is MessageType.DELAY:
        if not deliver_at:
            raise GrpcError(
                Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a DELAY message needs a delivery timestamp"
            )
    elif deliver_at and msg_type is MessageType.NORMAL:
        msg_type = MessageType.DELAY
    if sp.trace_context:
        props[PROP_TRACE_CONTEXT] = sp.trace_context
    if sp.HasField("orphaned_transaction_recovery_duration"):
        props[PROP_CHECK_IMMUNITY] = str(sp.orphaned_transaction_recovery_duration.seconds)
    return Message(
        m.topic.name,
        body,
        sp.tag,
        tuple(keys) if keys else (),
        props,
        group,
        deliver_at,
        sp.message_id,
        ts_ms(sp.born_timestamp),
        sp.born_host,
        -1,
        msg_type,
    )


def _gunzip(body: bytes) -> bytes:
    try:
        z = zlib.decompressobj(wbits=47)  # gzip or zlib header
        out = z.decompress(body, MAX_INFLATED_BODY)
        if z.unconsumed_tail:
            raise ProcessorError(ErrorKind.BODY_TOO_LARGE, "inflated GZIP body is too large")
        return out
    except (zlib.error, gzip.BadGzipFile) as e:
        raise GrpcError(Code.MESSAGE_CORRUPTED, f"GZIP body cannot be inflated: {e}") from None


def proto_type(m: Message) -> int:
    """The proto `MessageType` a stored message is delivered as."""
    mt = m.msg_type
    # The store delivers a released delayed message as NORMAL; it keeps its delivery time.
    return d.DELAY if m.deliver_at and mt is MessageType.NORMAL else _TYPE_TO_PROTO[mt]


def _immunity_seconds(value: str) -> int | None:
    """The `CHECK_IMMUNITY_TIME_IN_SECONDS` property as a Duration's seconds; None when it is not
    a decimal int64."""
    if value.isascii() and value.isdigit():
        n = int(value)
        if n < 1 << 63:
            return n
    return None


def _system_properties(m: Message, sp: d.SystemProperties) -> None:
    body = m.body
    if m.tag:
        sp.tag = m.tag
    if m.keys:
        sp.keys.extend(m.keys)
    sp.message_id = m.message_id
    sp.body_digest.type = d.MD5
    sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()
    sp.body_encoding = d.IDENTITY
    sp.message_type = proto_type(m)
    born = m.born_timestamp
    sp.born_timestamp.seconds = born // 1000
    sp.born_timestamp.nanos = (born % 1000) * 1_000_000
    sp.born_host = m.born_host
    st = m.store_timestamp
    if st:
        sp.store_timestamp.seconds = st // 1000
        sp.store_timestamp.nanos = (st % 1000) * 1_000_000
    if m.store_host:
        sp.store_host = m.store_host
    if m.deliver_at:
        sp.delivery_timestamp.seconds = m.deliver_at // 1000
        sp.delivery_timestamp.nanos = (m.deliver_at % 1000) * 1_000_000
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    if m.message_group:
        sp.message_group = m.message_group


def split_properties(props: dict[str, str]) -> tuple[list[tuple[str, str]], str | None, int | None]:
    """A stored message's properties → (user properties, trace context, orphaned-transaction
    recovery seconds). The store's and this adapter's own properties are not user properties; the
    pairs of `mqtt.user_properties` (MQTT 5 user properties, AMQP headers) are user properties too,
    each under its own name unless a store property has that name (the first pair of a name wins)."""
    user = []
    trace = recovery = None
    for k, v in props.items():
        if k not in HIDDEN_PROPERTIES:
            user.append((k, v))
        elif k == PROP_TRACE_CONTEXT:
            trace = v
        elif k == PROP_CHECK_IMMUNITY:
            recovery = _immunity_seconds(v)
    if P_USER_PROPERTIES in props:
        names = set(props)
        for k, v in user_property_pairs(props):
            if k not in names and k not in HIDDEN_PROPERTIES:
                names.add(k)
                user.append((k, v))
    return user, trace, recovery


def _user_properties(m: Message, out: d.Message) -> None:
    user, trace, recovery = split_properties(m.properties) if m.properties else ((), None, None)
    up = out.user_properties
    for k, v in user:
        up[k] = v
    sp = out.system_properties
    if trace is not None:
        sp.trace_context = trace
    if recovery is not None:
        sp.orphaned_transaction_recovery_duration.seconds = recovery


def fill_proto(dl: Delivery, out: d.Message, store_host: str = "") -> None:
    """A delivery → the protobuf message a consumer receives (IDENTITY body, uppercase MD5 digest),
    written into an empty message in place, e.g. a response's `message` field (building a message
    and then assigning it to the field would copy it)."""
    m = dl.message
    out.body = m.body
    out.topic.name = m.topic
    sp = out.system_properties
    _system_properties(m, sp)
    if store_host and not m.store_host:
        sp.store_host = store_host
    sp.receipt_handle = dl.receipt_handle
    sp.delivery_attempt = dl.delivery_attempt
    _user_properties(m, out)


def message_to_proto(m: Message) -> d.Message:
    """A stored message without a receipt handle (e.g. for a transaction check-back)."""
    out = d.Message(body=m.body)
    out.topic.name = m.topic
    _system_properties(m, out.system_properties)
    _user_properties(m, out)
    return out


# ---------------------------------------------------------------------------- addressing


def endpoints(host: str, port: int) -> d.Endpoints:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
        scheme = d.IPv6 if ip.version == 6 else d.IPv4
        host = str(ip)
    except ValueError:
        scheme = d.DOMAIN_NAME
    return d.Endpoints(scheme=scheme, addresses=[d.Address(host=host, port=port)])


def peer_address(peer: str) -> str:
    """grpc `context.peer()` ("ipv4:1.2.3.4:5", "ipv6:[::1]:5", "unix:...") → "host:port"."""
    for prefix in ("ipv4:", "ipv6:"):
        if peer.startswith(prefix):
            return peer[len(prefix) :]
    return peer


# ---------------------------------------------------------------------------- identity

_identities: dict[str, Identity] = {}


def identity_of(authorization: str, date_time: str = "") -> Identity | None:
    """`MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex>` → Identity
    (username = access key; the signature and signed date-time in `attributes` for an authorizer);
    `Bearer <token>` → a bearer Identity (a device token, docs/security.md). None when no access
    key or token is given."""
    key = authorization + "\0" + date_time
    ident = _identities.get(key)
    if ident is not None:
        return ident
    scheme, _, rest = authorization.partition(" ")
    if scheme.lower() == "bearer":  # a device token (JWT) as `authorization: Bearer <token>` metadata
        token = rest.strip()
        return Identity(secret=token, mechanism="bearer") if token else None
    fields: dict[str, str] = {}
    for part in rest.split(","):
        k, sep, v = part.strip().partition("=")
        if sep:
            fields[k.strip()] = v.strip()
    ak = fields.get("Credential", "")
    if "/" in ak:  # some clients send Credential=<ak>/<scope>
        ak = ak.split("/", 1)[0]
    if not ak:
        return None
    attrs = [("scheme", scheme), ("signature", fields.get("Signature", ""))]
    if date_time:
        attrs.append(("x-mq-date-time", date_time))
    ident = Identity(username=ak, mechanism="mqv2-hmac-sha1", attributes=tuple(attrs))
    if len(_identities) > 4096:
        _identities.clear()
    _identities[key] = ident
    return ident
