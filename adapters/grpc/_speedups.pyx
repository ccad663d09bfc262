# cython: language_level=3, cdivision=True
"""The compiled gRPC delivery encoder (docs/store.md, "Compiled hot path"): delivery_bytes.py's
`delivery_response`, the serialized `ReceiveMessageResponse{message}` of one delivery, built in one bytes
object. Every message an official RocketMQ 5 client receives costs one call, on the event loop that also
runs grpc; the pure function spends most of it on small bytes objects, joins and the MD5 digest object.

Compiled: the sizes of every field first, then one allocation and one pass that writes the varints, the
field keys and lengths, the timestamps (seconds and nanos of epoch milliseconds), the user properties map
(its common case: no `CHECK_IMMUNITY_TIME_IN_SECONDS`, no `mqtt.user_properties`), the trace context (the
client's `traceparent` property only: none when the producer sent none), the MD5 body digest (hashlib's
digest, written here in upper-case hex) and the body copy. The pure function's caches
of repeated values (topic, tag, hosts, seconds) are not needed here: the UTF-8 of a str is kept in the str
(no copy at all for ASCII) and a field costs a few byte stores and a memcpy.

delivery_bytes.py's pure function is the reference and the fallback: anything off the fast path (a field of
another type than the store gives, an integer beyond int64, a str that is not UTF-8, any error) is handed to
it, so the output and the errors are the pure function's. Properties holding the orphaned-transaction
recovery time or MQTT 5 user property pairs go through `convert.split_properties`, as the pure function
does. delivery_bytes.py binds the pure
function, those helpers and the protobuf constants in (`bind`) and chooses this module unless
`GATEWAY_PURE_PYTHON=1`; this module imports nothing of the project."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcpy

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

# Field keys, `(number << 3) | wire_type`, as varint values: from field 16 on two bytes (0x80 is 0x80 0x01),
# the bytes of delivery_bytes.py's keys.
DEF RESPONSE_MESSAGE = 0x12  # ReceiveMessageResponse.message (2)
DEF TOPIC = 0x0A  # Message.topic (1), a Resource
DEF RESOURCE_NAME = 0x12  # Resource.name (2)
DEF USER_PROPERTY = 0x12  # Message.user_properties (2), map entries
DEF ENTRY_KEY = 0x0A
DEF ENTRY_VALUE = 0x12
DEF SYSTEM_PROPERTIES = 0x1A  # Message.system_properties (3)
DEF BODY = 0x22  # Message.body (4)
DEF TAG = 0x0A  # SystemProperties fields from here
DEF KEY = 0x12
DEF MESSAGE_ID = 0x1A
DEF BORN_TIMESTAMP = 0x3A
DEF BORN_HOST = 0x42
DEF STORE_TIMESTAMP = 0x4A
DEF STORE_HOST = 0x52
DEF DELIVERY_TIMESTAMP = 0x5A
DEF RECEIPT_HANDLE = 0x62
DEF QUEUE_ID = 0x68  # varint
DEF QUEUE_OFFSET = 0x70  # varint
DEF DELIVERY_ATTEMPT = 0x80  # field 16, varint: two bytes
DEF MESSAGE_GROUP = 0x8A  # field 17
DEF TRACE_CONTEXT = 0x92  # field 18
DEF ORPHANED_RECOVERY = 0x9A  # field 19, a Duration
DEF SECONDS = 0x08  # Timestamp.seconds, Duration.seconds
DEF NANOS = 0x10  # Timestamp.nanos
DEF DIGEST_HEX = 32  # MD5 checksum: 32 upper-case hex digits

# The interface of `bind` and the rules encoded here, checked by delivery_bytes.py: a build of an older
# source (another API) is not used, its pure function is (2: no trace context derived from the id).
API = 2

cdef object _py_delivery_response = None
cdef object _proto_type = None
cdef object _split_properties = None
cdef dict _message_types = None
cdef frozenset _hidden = None
cdef str _trace_property = None
cdef str _immunity_property = None
cdef str _user_pairs_property = None
cdef bytes _digest_head = None
cdef bytes _identity = None
cdef object _md5 = None


def bind(py_delivery_response, proto_type, split_properties, message_types, hidden_properties,
         trace_property, immunity_property, user_pairs_property, digest_head, identity, md5):
    """delivery_bytes.py hands in, once at import: the pure delivery_response (the fallback); the helpers
    `convert.proto_type`, `convert.split_properties`; the encoded message types
    ({proto MessageType: field}); the property names `split_properties` hides, the trace context's, the
    recovery time's and that of the MQTT 5 user property pairs; the head of the body digest field (up to
    its 32 hex digits) and the body encoding field; `hashlib.md5`."""
    global _py_delivery_response, _proto_type, _split_properties, _message_types, _hidden
    global _trace_property, _immunity_property, _user_pairs_property, _digest_head, _identity, _md5
    _py_delivery_response, _proto_type = py_delivery_response, proto_type
    _split_properties = split_properties
    _message_types, _hidden = dict(message_types), frozenset(hidden_properties)
    _trace_property, _immunity_property = trace_property, immunity_property
    _user_pairs_property = user_pairs_property
    _digest_head, _identity = bytes(digest_head), bytes(identity)
    _md5 = md5


def delivery_response(dl, store_host=""):
    """delivery_bytes.delivery_response: `ReceiveMessageResponse(message=...)` serialized."""
    cdef object out
    try:
        out = _encode(dl, store_host)
    except Exception:  # the pure function raises its own error (outside this handler: no chaining)
        out = None
    if out is None:
        return _py_delivery_response(dl, store_host)
    return out


def fast_path(dl, store_host=""):
    """The response when the delivery is on the fast path, else None; errors are raised as they come (for
    the tests: ordinary messages must not be handed to the pure function)."""
    return _encode(dl, store_host)


# ---------------------------------------------------------------------------- varints and fields
cdef inline Py_ssize_t _vlen(uint64_t v) noexcept nogil:
    """The size of a varint (a negative int64 is 10 bytes: its two's complement)."""
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline uint8_t* _varint(uint8_t* o, uint64_t v) noexcept nogil:
    while v >= 0x80:
        o[0] = (v & 0x7F) | 0x80
        v >>= 7
        o += 1
    o[0] = <uint8_t>v
    return o + 1


cdef inline Py_ssize_t _flen(Py_ssize_t n) noexcept nogil:
    """The size of a length-delimited field of n bytes with a one-byte key."""
    return 1 + _vlen(n) + n


cdef inline uint8_t* _head(uint8_t* o, uint64_t key, Py_ssize_t n) noexcept nogil:
    """The key and length of a length-delimited field (the key a varint: 0x92 is 0x92 0x01)."""
    o = _varint(o, key)
    return _varint(o, <uint64_t>n)


cdef inline uint8_t* _field(uint8_t* o, uint64_t key, const char* p, Py_ssize_t n) noexcept nogil:
    o = _head(o, key, n)
    memcpy(o, p, n)
    return o + n


cdef inline const char* _utf8(object s, Py_ssize_t* n) except NULL:
    """The UTF-8 of a str, as str.encode() gives it (kept in the str: no copy for ASCII); a str that is
    not UTF-8 (a lone surrogate) raises, and the pure function raises its own error."""
    return PyUnicode_AsUTF8AndSize(s, n)


# ---------------------------------------------------------------------------- timestamps
cdef inline int64_t _seconds(int64_t ms) noexcept nogil:
    """ms // 1000 (Python's floor division)."""
    cdef int64_t s = ms / 1000
    if ms % 1000 < 0:
        s -= 1
    return s


cdef inline int64_t _nanos(int64_t ms) noexcept nogil:
    """(ms % 1000) * 1_000_000 (Python's modulo: never negative)."""
    cdef int64_t r = ms % 1000
    if r < 0:
        r += 1000
    return r * 1000000


cdef inline Py_ssize_t _ts_inner(int64_t ms) noexcept nogil:
    """The size of a `google.protobuf.Timestamp` of epoch ms (zero fields left out)."""
    cdef int64_t s = _seconds(ms), ns = _nanos(ms)
    return (1 + _vlen(<uint64_t>s) if s else 0) + (1 + _vlen(<uint64_t>ns) if ns else 0)


cdef inline uint8_t* _timestamp(uint8_t* o, uint64_t key, int64_t ms) noexcept nogil:
    cdef int64_t s = _seconds(ms), ns = _nanos(ms)
    o = _head(o, key, _ts_inner(ms))
    if s:
        o[0] = SECONDS
        o = _varint(o + 1, <uint64_t>s)
    if ns:
        o[0] = NANOS
        o = _varint(o + 1, <uint64_t>ns)
    return o


# ---------------------------------------------------------------------------- body digest
cdef const char* _HEX = "0123456789ABCDEF"


# ---------------------------------------------------------------------------- user properties
cdef inline Py_ssize_t _entry_inner(object k, object v) except -1:
    """The size of a map entry's key and value fields."""
    cdef Py_ssize_t kn, vn
    _utf8(k, &kn)
    _utf8(v, &vn)
    return _flen(kn) + _flen(vn)


cdef inline uint8_t* _entry(uint8_t* o, object k, object v) except NULL:
    cdef Py_ssize_t kn, vn
    cdef const char* kp = _utf8(k, &kn)
    cdef const char* vp = _utf8(v, &vn)
    o = _head(o, USER_PROPERTY, _flen(kn) + _flen(vn))
    o = _field(o, ENTRY_KEY, kp, kn)
    return _field(o, ENTRY_VALUE, vp, vn)


cdef uint8_t* _user(uint8_t* o, dict props, list pairs) except NULL:
    """The user properties: `pairs` (from split_properties), or, when None, the properties that are not
    hidden (all str: checked by the caller, which added up their size)."""
    cdef Py_ssize_t pos = 0
    cdef PyObject* kp
    cdef PyObject* vp
    if pairs is not None:
        for kv in pairs:
            o = _entry(o, (<tuple>kv)[0], (<tuple>kv)[1])
        return o
    while PyDict_Next(props, &pos, &kp, &vp):
        if <object>kp not in _hidden:
            o = _entry(o, <object>kp, <object>vp)
    return o


cdef inline bint _is_str(object v) noexcept:
    return type(v) is str


# ---------------------------------------------------------------------------- the response
cdef object _encode(object dl, object store_host):
    """The response, or None: off the fast path (the caller hands the delivery to the pure function)."""
    cdef object m = dl.message
    cdef object topic = m.topic, body = m.body, tag = m.tag, keys = m.keys, mid = m.message_id
    cdef object born_host = m.born_host, host = m.store_host, group = m.message_group
    cdef object handle = dl.receipt_handle, props = m.properties
    cdef object o_born = m.born_timestamp, o_store = m.store_timestamp, o_deliver = m.deliver_at
    cdef object o_qid = m.queue_id, o_offset = m.queue_offset, o_attempt = dl.delivery_attempt
    cdef object trace = None, recovery = None
    cdef bytes type_field
    cdef list pairs = None
    cdef int64_t born, store_ts, deliver, qid, offset, attempt, rec = 0
    cdef Py_ssize_t topic_n, tag_n = 0, mid_n = 0, born_host_n = 0, host_n = 0, group_n = 0, handle_n
    cdef Py_ssize_t trace_n = 0, body_n, key_n, topic_inner, user_n = 0, sp_n, msg_n, total
    cdef const char* topic_p
    cdef const char* tag_p = NULL
    cdef const char* mid_p = NULL
    cdef const char* born_host_p = NULL
    cdef const char* host_p = NULL
    cdef const char* group_p = NULL
    cdef const char* handle_p
    cdef const char* trace_p = NULL
    cdef const char* key_p
    cdef const char* body_p
    cdef bint has_recovery = False
    cdef PyObject* kp
    cdef PyObject* vp
    cdef Py_ssize_t pos = 0

    if not (_is_str(topic) and _is_str(tag) and _is_str(mid) and _is_str(born_host) and _is_str(host)
            and _is_str(group) and _is_str(handle) and type(body) is bytes and type(keys) is tuple
            and type(props) is dict and type(o_born) is int and type(o_store) is int
            and type(o_deliver) is int and type(o_qid) is int and type(o_offset) is int
            and type(o_attempt) is int):
        return None
    if not host:
        if not _is_str(store_host):
            return None
        host = store_host
    born, store_ts, deliver = o_born, o_store, o_deliver  # OverflowError beyond int64: the pure way
    qid, offset, attempt = o_qid, o_offset, o_attempt

    cdef bytes dg = _md5(body).digest()  # (hashlib: OpenSSL's MD5, without the GIL for large bodies)
    cdef const uint8_t* dgp = <const uint8_t*>PyBytes_AS_STRING(dg)
    type_field = _message_types[_proto_type(m)]
    # Properties: the user ones (their size), the trace context, the recovery time; through split_properties
    # for the recovery time and MQTT 5 pairs, else as it would split them.
    if props and (_immunity_property in props or _user_pairs_property in props):
        split = _split_properties(props)
        pairs, trace, recovery = split
        for kv in pairs:
            if not (type(kv) is tuple and len(<tuple>kv) == 2 and _is_str((<tuple>kv)[0])
                    and _is_str((<tuple>kv)[1])):
                return None
            user_n += _flen(_entry_inner((<tuple>kv)[0], (<tuple>kv)[1]))
        if recovery is not None:
            if type(recovery) is not int:
                return None
            rec = recovery
            has_recovery = True
    else:
        while PyDict_Next(props, &pos, &kp, &vp):
            if not (_is_str(<object>kp) and _is_str(<object>vp)):
                return None
            if <object>kp in _hidden:  # split_properties: not a user property
                if <object>kp == _trace_property:
                    trace = <object>vp
            else:
                user_n += _flen(_entry_inner(<object>kp, <object>vp))
        # (No Python code runs from here until the properties are written: the dict stays as sized.)
    if trace is not None:
        if not _is_str(trace):
            return None
        trace_p = _utf8(trace, &trace_n)

    topic_p = _utf8(topic, &topic_n)
    if tag:
        tag_p = _utf8(tag, &tag_n)
    if mid:
        mid_p = _utf8(mid, &mid_n)
    if born_host:
        born_host_p = _utf8(born_host, &born_host_n)
    if host:
        host_p = _utf8(host, &host_n)
    if group:
        group_p = _utf8(group, &group_n)
    handle_p = _utf8(handle, &handle_n)
    body_p = PyBytes_AS_STRING(body)
    body_n = PyBytes_GET_SIZE(body)

    # Sizes: system properties, user properties, the message, the response.
    sp_n = 0
    if tag_n:
        sp_n += _flen(tag_n)
    for k in <tuple>keys:
        if not _is_str(k):
            return None
        _utf8(k, &key_n)
        sp_n += _flen(key_n)
    if mid_n:
        sp_n += _flen(mid_n)
    sp_n += PyBytes_GET_SIZE(_digest_head) + DIGEST_HEX + PyBytes_GET_SIZE(_identity)
    sp_n += PyBytes_GET_SIZE(type_field)
    sp_n += _flen(_ts_inner(born))
    if born_host_n:
        sp_n += _flen(born_host_n)
    if store_ts:
        sp_n += _flen(_ts_inner(store_ts))
    if host_n:
        sp_n += _flen(host_n)
    if deliver:
        sp_n += _flen(_ts_inner(deliver))
    sp_n += _flen(handle_n)
    if qid:
        sp_n += 1 + _vlen(<uint64_t>qid)
    sp_n += 1 + _vlen(<uint64_t>offset)
    sp_n += 2 + _vlen(<uint64_t>attempt)
    if group_n:
        sp_n += 1 + _flen(group_n)
    if trace_p != NULL:
        sp_n += 1 + _flen(trace_n)
    if has_recovery:
        sp_n += 1 + _flen(1 + _vlen(<uint64_t>rec) if rec else 0)
    topic_inner = _flen(topic_n) if topic_n else 0
    msg_n = _flen(topic_inner) + user_n + _flen(sp_n) + (_flen(body_n) if body_n else 0)
    total = _flen(msg_n)

    out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    cdef uint8_t* digest
    cdef Py_ssize_t di
    o = _head(o, RESPONSE_MESSAGE, msg_n)
    o = _head(o, TOPIC, topic_inner)
    if topic_n:
        o = _field(o, RESOURCE_NAME, topic_p, topic_n)
    if user_n:
        o = _user(o, <dict>props, pairs)
    o = _head(o, SYSTEM_PROPERTIES, sp_n)
    if tag_n:
        o = _field(o, TAG, tag_p, tag_n)
    for k in <tuple>keys:
        key_p = _utf8(k, &key_n)
        o = _field(o, KEY, key_p, key_n)
    if mid_n:
        o = _field(o, MESSAGE_ID, mid_p, mid_n)
    memcpy(o, PyBytes_AS_STRING(_digest_head), PyBytes_GET_SIZE(_digest_head))
    digest = o + PyBytes_GET_SIZE(_digest_head)
    for di in range(DIGEST_HEX // 2):
        digest[2 * di] = _HEX[dgp[di] >> 4]
        digest[2 * di + 1] = _HEX[dgp[di] & 0xF]
    o = digest + DIGEST_HEX
    memcpy(o, PyBytes_AS_STRING(_identity), PyBytes_GET_SIZE(_identity))
    o += PyBytes_GET_SIZE(_identity)
    memcpy(o, PyBytes_AS_STRING(type_field), PyBytes_GET_SIZE(type_field))
    o += PyBytes_GET_SIZE(type_field)
    o = _timestamp(o, BORN_TIMESTAMP, born)
    if born_host_n:
        o = _field(o, BORN_HOST, born_host_p, born_host_n)
    if store_ts:
        o = _timestamp(o, STORE_TIMESTAMP, store_ts)
    if host_n:
        o = _field(o, STORE_HOST, host_p, host_n)
    if deliver:
        o = _timestamp(o, DELIVERY_TIMESTAMP, deliver)
    o = _field(o, RECEIPT_HANDLE, handle_p, handle_n)
    if qid:
        o[0] = QUEUE_ID
        o = _varint(o + 1, <uint64_t>qid)
    o[0] = QUEUE_OFFSET
    o = _varint(o + 1, <uint64_t>offset)
    o = _varint(o, DELIVERY_ATTEMPT)
    o = _varint(o, <uint64_t>attempt)
    if group_n:
        o = _field(o, MESSAGE_GROUP, group_p, group_n)
    if trace_p != NULL:
        o = _field(o, TRACE_CONTEXT, trace_p, trace_n)
    if has_recovery:
        o = _head(o, ORPHANED_RECOVERY, 1 + _vlen(<uint64_t>rec) if rec else 0)
        if rec:
            o[0] = SECONDS
            o = _varint(o + 1, <uint64_t>rec)
    if body_n:
        o = _field(o, BODY, body_p, body_n)
    return out
