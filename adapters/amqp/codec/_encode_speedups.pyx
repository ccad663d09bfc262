# cython: language_level=3, cdivision=True, boundscheck=False, wraparound=False
"""The compiled AMQP 0-9-1 encoder (docs/store.md, "Compiled hot path"): what the gateway writes for
each message under an AMQP load (publish + consume + ack), hand-written because it is the product's
per-message work:

    encode_table            wire.py: a field table (the `headers` property), built in one C buffer
    encode_properties       properties.py: flags word + property list
    encode_deliver          encoder.py: basic.deliver + content header + body frame(s), built in one
                            bytes object (the content tail and the properties included)

What the gateway reads is `_decode_speedups.pyx`; the number layout both use is `_bytes.pxd`.
The pure-Python modules are the reference and the fallback: every function here gives the same bytes
and hands any input off its fast path (an unusual type, a value out of a field's range, a table nested
deeper than MAX_DEPTH) to the pure function, so the errors are the pure ones too (same type, same
message). wire.py, properties.py and encoder.py bind their types and pure functions in (`bind_*`) and
choose this module unless `GATEWAY_PURE_PYTHON=1`.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from ._bytes cimport MAX_DEPTH, _F64, _st16, _st32, _st64

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    long long PyLong_AsLongLongAndOverflow(object v, int* overflow) except? -1
    unsigned long long PyLong_AsUnsignedLongLong(object v) except? -1

DEF U32_MAX = 0xFFFFFFFF

# ---------------------------------------------------------------------------- bound in by the modules
cdef object _Timestamp = None
cdef object _py_encode_table = None
cdef object _BasicProperties = None
cdef bytes _EMPTY_PROPERTIES = b"\x00\x00"
cdef object _datetime = None
cdef object _py_encode_properties = None
cdef object _py_encode_deliver = None


def bind_wire(timestamp, py_encode_table):
    """wire.py hands in its Timestamp type and the pure encode_table (the fallback) once, at import."""
    global _Timestamp, _py_encode_table
    _Timestamp, _py_encode_table = timestamp, py_encode_table


def bind_properties(basic_properties, empty_properties, datetime, py_encode_properties):
    """properties.py hands in BasicProperties and its pure encode_properties once, at import."""
    global _BasicProperties, _EMPTY_PROPERTIES, _datetime, _py_encode_properties
    _BasicProperties, _EMPTY_PROPERTIES, _datetime = basic_properties, empty_properties, datetime
    _py_encode_properties = py_encode_properties


def bind_encoder(py_encode_deliver):
    """encoder.py hands in the pure encode_deliver (the fallback) once, at import."""
    global _py_encode_deliver
    _py_encode_deliver = py_encode_deliver


# ---------------------------------------------------------------------------- a growing output buffer
cdef struct _W:
    uint8_t* buf
    Py_ssize_t n
    Py_ssize_t cap


cdef int _w_init(_W* w, Py_ssize_t cap) except -1:
    w.n = 0
    w.cap = cap
    w.buf = <uint8_t*>malloc(cap)
    if w.buf == NULL:
        raise MemoryError()
    return 0


cdef int _w_grow(_W* w, Py_ssize_t k) except -1:
    cdef Py_ssize_t cap = w.cap * 2
    while cap < w.n + k:
        cap *= 2
    cdef uint8_t* p = <uint8_t*>realloc(w.buf, cap)
    if p == NULL:
        raise MemoryError()
    w.buf = p
    w.cap = cap
    return 0


cdef inline uint8_t* _w_room(_W* w, Py_ssize_t k) except NULL:
    """k bytes at the end of the buffer, to be written (the length already counts them)."""
    if w.n + k > w.cap:
        _w_grow(w, k)
    cdef uint8_t* p = w.buf + w.n
    w.n += k
    return p


cdef inline int _w_put(_W* w, const void* src, Py_ssize_t k) except -1:
    memcpy(_w_room(w, k), src, k)
    return 0


cdef inline int _w_tag_len(_W* w, uint8_t tag, Py_ssize_t k) except -1:
    cdef uint8_t* p = _w_room(w, 5)
    p[0] = tag
    _st32(p + 1, k)
    return 0


# ---------------------------------------------------------------------------- strings
cdef const char* _utf8(object s, Py_ssize_t* n):
    """The UTF-8 of a str (cached in the str), or NULL when it has surrogates (the pure code's
    "surrogateescape" encoding, or its error, is then the pure function's)."""
    try:
        return PyUnicode_AsUTF8AndSize(s, n)
    except UnicodeEncodeError:
        return NULL


cdef inline bint _text(object s, const char** p, Py_ssize_t* n):
    """A short-string value as the fast path takes it: str (UTF-8) or bytes, at most 255 bytes."""
    if type(s) is bytes:
        p[0] = PyBytes_AS_STRING(s)
        n[0] = PyBytes_GET_SIZE(s)
    elif type(s) is str:
        p[0] = _utf8(s, n)
        if p[0] == NULL:
            return False
    else:
        return False
    return n[0] <= 255



# ---------------------------------------------------------------------------- field tables: encoding
cdef int _enc_value(_W* w, object v, int depth) except -1:
    """wire._encode_value of one value into w: 0, or 1 when the value is off the fast path."""
    cdef type t = type(v)
    cdef const char* s
    cdef Py_ssize_t k
    cdef long long x
    cdef unsigned long long u
    cdef int ovf
    cdef uint8_t* o
    cdef _F64 f
    if t is str:
        s = _utf8(v, &k)
        if s == NULL or k > U32_MAX:
            return 1
        _w_tag_len(w, 83, k)  # S
        _w_put(w, s, k)
    elif t is bool:
        o = _w_room(w, 2)
        o[0] = 116  # t
        o[1] = 1 if v is True else 0
    elif t is int:
        x = PyLong_AsLongLongAndOverflow(v, &ovf)
        if ovf:
            return 1
        if -0x80000000 <= x <= 0x7FFFFFFF:
            o = _w_room(w, 5)
            o[0] = 73  # I
            _st32(o + 1, <uint64_t>x)
        else:
            o = _w_room(w, 9)
            o[0] = 108  # l
            _st64(o + 1, <uint64_t>x)
    elif t is _Timestamp:
        try:
            u = PyLong_AsUnsignedLongLong(v)
        except OverflowError:
            return 1
        o = _w_room(w, 9)
        o[0] = 84  # T
        _st64(o + 1, u)
    elif t is bytes:
        k = PyBytes_GET_SIZE(v)
        if k > U32_MAX:
            return 1
        _w_tag_len(w, 120, k)  # x
        _w_put(w, PyBytes_AS_STRING(v), k)
    elif v is None:
        o = _w_room(w, 1)
        o[0] = 86  # V
    elif t is dict:
        o = _w_room(w, 1)
        o[0] = 70  # F
        return _enc_table(w, v, depth + 1)
    elif t is list or t is tuple:
        o = _w_room(w, 1)
        o[0] = 65  # A
        return _enc_array(w, v, depth + 1)
    elif t is float:
        f.d = v
        o = _w_room(w, 9)
        o[0] = 100  # d
        _st64(o + 1, f.u)
    else:
        return 1
    return 0


cdef int _enc_table(_W* w, dict table, int depth) except -1:
    """wire.encode_table of a dict into w: 0, or 1 when it is off the fast path."""
    cdef const char* s
    cdef Py_ssize_t k, at
    cdef uint8_t* o
    if depth > MAX_DEPTH:
        return 1
    at = w.n
    _w_room(w, 4)
    for key, value in table.items():
        if type(key) is str:
            s = _utf8(key, &k)
            if s == NULL:
                return 1
        elif type(key) is bytes:
            s = PyBytes_AS_STRING(key)
            k = PyBytes_GET_SIZE(key)
        else:
            return 1
        if k > 255:
            return 1
        o = _w_room(w, 1 + k)
        o[0] = <uint8_t>k
        memcpy(o + 1, s, k)
        if _enc_value(w, value, depth):
            return 1
    k = w.n - at - 4
    if k > U32_MAX:
        return 1
    _st32(w.buf + at, k)
    return 0


cdef int _enc_array(_W* w, object items, int depth) except -1:
    """wire.encode_array of a list or tuple into w: 0, or 1 when it is off the fast path."""
    cdef Py_ssize_t k, at
    if depth > MAX_DEPTH:
        return 1
    at = w.n
    _w_room(w, 4)
    for value in items:
        if _enc_value(w, value, depth):
            return 1
    k = w.n - at - 4
    if k > U32_MAX:
        return 1
    _st32(w.buf + at, k)
    return 0


def encode_table(table):
    """wire.encode_table: a field table with its 4-byte length prefix."""
    cdef _W w
    if type(table) is not dict:
        return _py_encode_table(table)
    _w_init(&w, 256)
    try:
        if _enc_table(&w, table, 0):
            return _py_encode_table(table)
        return PyBytes_FromStringAndSize(<const char*>w.buf, w.n)
    finally:
        free(w.buf)


# ---------------------------------------------------------------------------- content properties
cdef inline int _enc_short(_W* w, object v) except -1:
    """A short-string property (length octet + bytes) into w: 0, or 1 when off the fast path."""
    cdef const char* s = NULL
    cdef Py_ssize_t k
    cdef uint8_t* o
    if not _text(v, &s, &k):
        return 1
    o = _w_room(w, 1 + k)
    o[0] = <uint8_t>k
    memcpy(o + 1, s, k)
    return 0


cdef inline int _enc_octet(_W* w, object v) except -1:
    """delivery_mode / priority (bytes((v,))): 0, or 1 when off the fast path."""
    cdef long long x
    cdef int ovf
    if type(v) is not int and type(v) is not bool:
        return 1
    x = PyLong_AsLongLongAndOverflow(v, &ovf)
    if ovf or not 0 <= x <= 255:
        return 1
    _w_room(w, 1)[0] = <uint8_t>x
    return 0


cdef int _enc_props(_W* w, object props) except -1:
    """properties.encode_properties of a BasicProperties into w (flags word first): 0, or 1 when off
    the fast path. w is left empty when no property is set."""
    cdef uint32_t flags = 0
    cdef unsigned long long u
    cdef Py_ssize_t at = w.n
    _w_room(w, 2)
    v = props.content_type
    if v is not None:
        flags = 0x8000
        if _enc_short(w, v):
            return 1
    v = props.content_encoding
    if v is not None:
        flags |= 0x4000
        if _enc_short(w, v):
            return 1
    v = props.headers
    if v is not None:
        flags |= 0x2000
        if type(v) is not dict or _enc_table(w, v, 0):
            return 1
    v = props.delivery_mode
    if v is not None:
        flags |= 0x1000
        if _enc_octet(w, v):
            return 1
    v = props.priority
    if v is not None:
        flags |= 0x0800
        if _enc_octet(w, v):
            return 1
    v = props.correlation_id
    if v is not None:
        flags |= 0x0400
        if _enc_short(w, v):
            return 1
    v = props.reply_to
    if v is not None:
        flags |= 0x0200
        if _enc_short(w, v):
            return 1
    v = props.expiration
    if v is not None:
        flags |= 0x0100
        if _enc_short(w, v):
            return 1
    v = props.message_id
    if v is not None:
        flags |= 0x0080
        if _enc_short(w, v):
            return 1
    v = props.timestamp
    if v is not None:
        flags |= 0x0040
        if isinstance(v, _datetime):
            v = int(v.timestamp())
        elif type(v) is not int and type(v) is not _Timestamp and type(v) is not bool:
            return 1
        try:
            u = PyLong_AsUnsignedLongLong(v)
        except OverflowError:
            return 1
        _st64(_w_room(w, 8), u)
    v = props.type
    if v is not None:
        flags |= 0x0020
        if _enc_short(w, v):
            return 1
    v = props.user_id
    if v is not None:
        flags |= 0x0010
        if _enc_short(w, v):
            return 1
    v = props.app_id
    if v is not None:
        flags |= 0x0008
        if _enc_short(w, v):
            return 1
    v = props.cluster_id
    if v is not None:
        flags |= 0x0004
        if _enc_short(w, v):
            return 1
    if not flags:
        w.n = at
        return 0
    _st16(w.buf + at, flags)
    return 0


def encode_properties(props):
    """properties.encode_properties: flags word + property list."""
    cdef _W w
    if props is None:
        return _EMPTY_PROPERTIES
    if type(props) is not _BasicProperties:
        return _py_encode_properties(props)
    _w_init(&w, 256)
    try:
        if _enc_props(&w, props):
            return _py_encode_properties(props)
        if not w.n:
            return _EMPTY_PROPERTIES
        return PyBytes_FromStringAndSize(<const char*>w.buf, w.n)
    finally:
        free(w.buf)


# ---------------------------------------------------------------------------- basic.deliver
def encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties,
                   body, frame_max=131072):
    """encoder.encode_deliver: basic.deliver + content header + body frame(s), as one bytes object."""
    cdef const char* pc = NULL
    cdef const char* pe = NULL
    cdef const char* pr = NULL
    cdef const char* pp
    cdef Py_ssize_t lc, le, lr, lp, size, chunk, nframes, total, i, k
    cdef long long ch, fm
    cdef unsigned long long tag
    cdef int ovf
    cdef bint redo
    cdef uint8_t* o
    cdef const char* src
    cdef _W w
    w.buf = NULL
    if (type(channel) is not int or type(delivery_tag) is not int or type(body) is not bytes
            or type(frame_max) is not int
            or (redelivered is not True and redelivered is not False and type(redelivered) is not int)
            or not _text(consumer_tag, &pc, &lc) or not _text(exchange, &pe, &le)
            or not _text(routing_key, &pr, &lr)):
        return _py_encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                                  properties, body, frame_max)
    ch = PyLong_AsLongLongAndOverflow(channel, &ovf)
    if ovf or not 0 <= ch <= 0xFFFF:
        return _py_encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                                  properties, body, frame_max)
    fm = PyLong_AsLongLongAndOverflow(frame_max, &ovf)
    if ovf:
        return _py_encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                                  properties, body, frame_max)
    try:
        tag = PyLong_AsUnsignedLongLong(delivery_tag)
    except OverflowError:
        return _py_encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                                  properties, body, frame_max)
    redo = bool(redelivered)
    size = PyBytes_GET_SIZE(body)
    if not size:
        nframes = 0
        chunk = 0
    elif not fm or size <= fm - 8:
        nframes = 1
        chunk = size
    else:
        chunk = fm - 8
        if chunk <= 0:
            return _py_encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                                      properties, body, frame_max)
        nframes = (size + chunk - 1) // chunk
    try:
        if type(properties) is bytes:
            pp = PyBytes_AS_STRING(properties)
            lp = PyBytes_GET_SIZE(properties)
        elif properties is None:
            pp = PyBytes_AS_STRING(_EMPTY_PROPERTIES)
            lp = PyBytes_GET_SIZE(_EMPTY_PROPERTIES)
        elif type(properties) is _BasicProperties:
            _w_init(&w, 256)
            if _enc_props(&w, properties):
                return _py_encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange,
                                          routing_key, properties, body, frame_max)
            if w.n:
                pp = <const char*>w.buf
                lp = w.n
            else:
                pp = PyBytes_AS_STRING(_EMPTY_PROPERTIES)
                lp = PyBytes_GET_SIZE(_EMPTY_PROPERTIES)
        else:
            return _py_encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                                      properties, body, frame_max)
        if size > U32_MAX or 12 + lp > U32_MAX:
            return _py_encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                                      properties, body, frame_max)
        # method frame head + ids + tag length, tag, delivery tag + redelivered + exchange length,
        # exchange, key length, key, frame end + header frame head + class, weight, body size, properties,
        # frame end, then per body frame a head, the part and its frame end
        total = 12 + lc + 10 + le + 1 + lr + 20 + lp + 1 + nframes * 8 + size
        out = PyBytes_FromStringAndSize(NULL, total)
        o = <uint8_t*>PyBytes_AS_STRING(out)
        o[0] = 1
        _st16(o + 1, <uint64_t>ch)
        _st32(o + 3, 16 + lc + le + lr)
        _st16(o + 7, 60)
        _st16(o + 9, 60)
        o[11] = <uint8_t>lc
        memcpy(o + 12, pc, lc)
        o += 12 + lc
        _st64(o, tag)
        o[8] = 1 if redo else 0
        o[9] = <uint8_t>le
        memcpy(o + 10, pe, le)
        o += 10 + le
        o[0] = <uint8_t>lr
        memcpy(o + 1, pr, lr)
        o += 1 + lr
        o[0] = 0xCE
        o[1] = 2
        _st16(o + 2, <uint64_t>ch)
        _st32(o + 4, 12 + lp)
        _st16(o + 8, 60)
        _st16(o + 10, 0)
        _st64(o + 12, <uint64_t>size)
        memcpy(o + 20, pp, lp)
        o += 20 + lp
        o[0] = 0xCE
        o += 1
        src = PyBytes_AS_STRING(body)
        i = 0
        while i < size:
            k = chunk if size - i > chunk else size - i
            o[0] = 3
            _st16(o + 1, <uint64_t>ch)
            _st32(o + 3, k)
            memcpy(o + 7, src + i, k)
            o[7 + k] = 0xCE
            o += 8 + k
            i += k
        return out
    finally:
        free(w.buf)
