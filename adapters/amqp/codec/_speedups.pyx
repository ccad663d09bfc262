# cython: language_level=3, cdivision=True, boundscheck=False, wraparound=False
"""The compiled AMQP 0-9-1 codec hot path (docs/store.md, "Compiled hot path"), hand-written because
it is the product's per-message work under an AMQP load (publish + consume + ack):

    encode_table, decode_table      wire.py: field tables (the `headers` property), one C buffer
    encode_properties,              properties.py: flags word + property list
    decode_properties
    encode_deliver                  encoder.py: basic.deliver + content header + body frame(s),
                                    built in one bytes object (the content tail included)
    hot_frame                       decoder.py: the per-frame parsing Decoder.next_event does for
                                    the hot frames: basic.publish with its content header and single
                                    body frame in the same buffer (one Message), basic.ack / nack /
                                    reject (one Method); Decoder stays the sans-IO Python class

The pure-Python modules are the reference and the fallback: every function here gives the same bytes
or equal values, and hands any input off its fast path (an unusual type, a value out of a field's
range, a malformed or truncated buffer, a table nested deeper than MAX_DEPTH) to the pure function, so
the errors are the pure ones too (same type, same message). `hot_frame` never raises: it returns None
for anything but a well-formed hot frame, and Decoder's general path then does the work (and reports
any error). The codec modules bind the pure functions and types in (`bind_*`) and choose this module
unless `GATEWAY_PURE_PYTHON=1`.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    long long PyLong_AsLongLongAndOverflow(object v, int* overflow) except? -1
    unsigned long long PyLong_AsUnsignedLongLong(object v) except? -1

DEF MAX_DEPTH = 32  # deeper tables go to the pure functions (which recurse, and raise RecursionError)
DEF U32_MAX = 0xFFFFFFFF

cdef object _NO = object()  # "off the fast path": the caller hands the input to the pure function

# ---------------------------------------------------------------------------- bound in by the modules
cdef object _Timestamp = None
cdef object _Decimal = None
cdef object _py_encode_table = None
cdef object _py_decode_table = None
cdef object _BasicProperties = None
cdef bytes _EMPTY_PROPERTIES = b"\x00\x00"
cdef object _datetime = None
cdef object _py_encode_properties = None
cdef object _py_decode_properties = None
cdef object _py_encode_deliver = None
cdef object _Message = None
cdef object _Method = None
cdef object _BasicPublish = None
cdef object _BasicAck = None
cdef object _BasicNack = None
cdef object _BasicReject = None


cdef object _new = object.__new__


def bind_wire(timestamp, decimal, py_encode_table, py_decode_table):
    """wire.py hands in its types and pure functions (the fallbacks) once, at import."""
    global _Timestamp, _Decimal, _py_encode_table, _py_decode_table
    _Timestamp, _Decimal, _py_encode_table, _py_decode_table = timestamp, decimal, py_encode_table, py_decode_table


def bind_properties(basic_properties, empty_properties, datetime, py_encode_properties, py_decode_properties):
    """properties.py hands in BasicProperties and its pure functions once, at import."""
    global _BasicProperties, _EMPTY_PROPERTIES, _datetime, _py_encode_properties, _py_decode_properties
    _BasicProperties, _EMPTY_PROPERTIES, _datetime = basic_properties, empty_properties, datetime
    _py_encode_properties, _py_decode_properties = py_encode_properties, py_decode_properties


def bind_encoder(py_encode_deliver):
    """encoder.py hands in the pure encode_deliver (the fallback) once, at import."""
    global _py_encode_deliver
    _py_encode_deliver = py_encode_deliver


def bind_decoder(message, method, basic_publish, basic_ack, basic_nack, basic_reject):
    """decoder.py hands in the event and method types hot_frame builds, once, at import."""
    global _Message, _Method, _BasicPublish, _BasicAck, _BasicNack, _BasicReject
    _Message, _Method, _BasicPublish = message, method, basic_publish
    _BasicAck, _BasicNack, _BasicReject = basic_ack, basic_nack, basic_reject


# ---------------------------------------------------------------------------- building the results
# The result types are slotted classes whose __init__ only stores its arguments: they are built here
# with object.__new__ and the slots set directly (a Python __init__ call costs more than the decoding).
# Every slot is set, as __init__ would (the tests compare every field with the pure path's results).

cdef object _properties(ct, ce, hd, dm, pr, ci, rt, ex, mi, ts, ty, ui, ai, ci2):
    """BasicProperties(ct, ce, ...)."""
    p = _new(_BasicProperties)
    p.content_type = ct
    p.content_encoding = ce
    p.headers = hd
    p.delivery_mode = dm
    p.priority = pr
    p.correlation_id = ci
    p.reply_to = rt
    p.expiration = ex
    p.message_id = mi
    p.timestamp = ts
    p.type = ty
    p.user_id = ui
    p.app_id = ai
    p.cluster_id = ci2
    return p


cdef object _message(object channel, object method, object props, object body, object raw):
    """events.Message(channel, method, props, body, raw)."""
    m = _new(_Message)
    m.channel = channel
    m.method = method
    m._properties = props
    m.body = body
    m.raw_properties = raw
    m.dropped = 0
    return m


cdef object _method(object channel, object method):
    """events.Method(channel, method)."""
    m = _new(_Method)
    m.channel = channel
    m.method = method
    return m


# ---------------------------------------------------------------------------- big-endian loads and stores
cdef inline uint16_t _ld16(const uint8_t* p) noexcept:
    return (<uint16_t>p[0] << 8) | p[1]


cdef inline uint32_t _ld32(const uint8_t* p) noexcept:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t _ld64(const uint8_t* p) noexcept:
    return (<uint64_t>_ld32(p) << 32) | _ld32(p + 4)


cdef inline void _st16(uint8_t* p, uint64_t v) noexcept:
    p[0] = (v >> 8) & 0xFF
    p[1] = v & 0xFF


cdef inline void _st32(uint8_t* p, uint64_t v) noexcept:
    p[0] = (v >> 24) & 0xFF
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cdef inline void _st64(uint8_t* p, uint64_t v) noexcept:
    _st32(p, v >> 32)
    _st32(p + 4, v & 0xFFFFFFFF)


cdef union _F32:
    uint32_t u
    float f


cdef union _F64:
    uint64_t u
    double d


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


cdef inline str _short_at(const uint8_t* p, Py_ssize_t n):
    return PyUnicode_DecodeUTF8(<const char*>p, n, "surrogateescape")


cdef inline object _short_field(const uint8_t* b, Py_ssize_t* p, Py_ssize_t end):
    """The short string (length octet, then its bytes) at b[p[0]], moving p[0] past it; _NO when
    it does not fit before `end`."""
    cdef Py_ssize_t at = p[0]
    if at >= end or at + 1 + b[at] > end:
        return _NO
    p[0] = at + 1 + b[at]
    return _short_at(b + at + 1, b[at])


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


# ---------------------------------------------------------------------------- field tables: decoding
cdef object _dec_value(const uint8_t* b, Py_ssize_t* at, Py_ssize_t stop, uint8_t tag, int depth):
    """The value of type `tag` at b[*at] (which is advanced past it), all of it before `stop`; _NO
    when the value is malformed or off the fast path (wire._READERS and _table's inlined types)."""
    cdef Py_ssize_t p = at[0]
    cdef Py_ssize_t q
    cdef uint32_t k
    cdef _F32 f4
    cdef _F64 f8
    cdef const uint8_t* s = b + p
    if tag == 83 or tag == 120:  # S, x
        if p + 4 > stop:
            return _NO
        k = _ld32(s)
        q = p + 4 + k
        if q > stop:
            return _NO
        at[0] = q
        if tag == 120:
            return PyBytes_FromStringAndSize(<const char*>s + 4, k)
        try:
            return PyUnicode_DecodeUTF8(<const char*>s + 4, k, NULL)
        except UnicodeDecodeError:
            return PyBytes_FromStringAndSize(<const char*>s + 4, k)
    if tag == 73:  # I
        if p + 4 > stop:
            return _NO
        at[0] = p + 4
        return <int32_t>_ld32(s)
    if tag == 116:  # t
        if p + 1 > stop:
            return _NO
        at[0] = p + 1
        return s[0] != 0
    if tag == 70 or tag == 65:  # F, A
        if p + 4 > stop:
            return _NO
        q = p + 4 + _ld32(s)
        if q > stop:
            return _NO
        at[0] = q
        if tag == 70:
            return _dec_table(b, p + 4, q, depth + 1)
        return _dec_array(b, p + 4, q, depth + 1)
    if tag == 98 or tag == 66:  # b, B
        if p + 1 > stop:
            return _NO
        at[0] = p + 1
        return <int8_t>s[0] if tag == 98 else s[0]
    if tag == 115 or tag == 117:  # s, u
        if p + 2 > stop:
            return _NO
        at[0] = p + 2
        return <int16_t>_ld16(s) if tag == 115 else _ld16(s)
    if tag == 105:  # i
        if p + 4 > stop:
            return _NO
        at[0] = p + 4
        return _ld32(s)
    if tag == 108 or tag == 76:  # l, L
        if p + 8 > stop:
            return _NO
        at[0] = p + 8
        return <int64_t>_ld64(s)
    if tag == 84:  # T
        if p + 8 > stop:
            return _NO
        at[0] = p + 8
        return _Timestamp(_ld64(s))
    if tag == 100:  # d
        if p + 8 > stop:
            return _NO
        at[0] = p + 8
        f8.u = _ld64(s)
        return f8.d
    if tag == 102:  # f
        if p + 4 > stop:
            return _NO
        at[0] = p + 4
        f4.u = _ld32(s)
        return <double>f4.f
    if tag == 68:  # D
        if p + 5 > stop:
            return _NO
        at[0] = p + 5
        return _Decimal(_ld32(s + 1)).scaleb(-<int>s[0])
    if tag == 86:  # V
        return None
    return _NO


cdef object _dec_table(const uint8_t* b, Py_ssize_t p, Py_ssize_t stop, int depth):
    """wire._table: the name/value pairs of b[p:stop]; _NO when malformed or off the fast path."""
    cdef Py_ssize_t q
    cdef dict table = {}
    if depth > MAX_DEPTH:
        return _NO
    while p < stop:
        q = p + 1 + b[p]
        if q >= stop:
            return _NO
        key = _short_at(b + p + 1, q - p - 1)
        p = q + 1
        value = _dec_value(b, &p, stop, b[q], depth)
        if value is _NO:
            return _NO
        table[key] = value
    return table


cdef object _dec_array(const uint8_t* b, Py_ssize_t p, Py_ssize_t stop, int depth):
    """wire._array: the tagged values of b[p:stop]; _NO when malformed or off the fast path."""
    cdef list items = []
    cdef uint8_t tag
    if depth > MAX_DEPTH:
        return _NO
    while p < stop:
        tag = b[p]
        p += 1
        value = _dec_value(b, &p, stop, tag, depth)
        if value is _NO:
            return _NO
        items.append(value)
    return items


cdef inline bint _span(object buf, object p, object end, Py_ssize_t* start, Py_ssize_t* stop):
    """(p, end) as C offsets into a bytes `buf` when 0 <= p and end <= len(buf) (end None: the
    length), else False (negative offsets, other types: the pure function's business)."""
    cdef Py_ssize_t n
    if type(buf) is not bytes or type(p) is not int:
        return False
    n = PyBytes_GET_SIZE(buf)
    try:
        start[0] = p
        stop[0] = n if end is None else end
    except (OverflowError, TypeError):
        return False
    return 0 <= start[0] and stop[0] <= n


def decode_table(buf, p, end):
    """wire.decode_table: the field table at p (4-byte length, then pairs), and the offset after it."""
    cdef Py_ssize_t start, stop, q
    cdef const uint8_t* b
    if not _span(buf, p, end, &start, &stop) or start + 4 > stop:
        return _py_decode_table(buf, p, end)
    b = <const uint8_t*>PyBytes_AS_STRING(buf)
    q = start + 4 + _ld32(b + start)
    if q > stop:
        return _py_decode_table(buf, p, end)
    table = _dec_table(b, start + 4, q, 0)
    if table is _NO:
        return _py_decode_table(buf, p, end)
    return table, q


# ---------------------------------------------------------------------------- content properties
cdef object _dec_props(const uint8_t* b, Py_ssize_t p, Py_ssize_t end):
    """properties.decode_properties of b[p:end]; _NO when malformed or off the fast path."""
    cdef uint32_t flags, more
    cdef Py_ssize_t q
    ct = ce = hd = dm = pr = ci = rt = ex = mi = ts = ty = ui = ai = ci2 = None
    if p + 2 > end:
        return _NO
    flags = _ld16(b + p)
    p += 2
    if flags & 1:
        while True:
            if p + 2 > end:
                return _NO
            more = _ld16(b + p)
            p += 2
            if more & 0xFFFE:
                return _NO
            if not more & 1:
                break
    # each value: a short string (length octet), an octet, a uint64, or a field table
    if flags & 0x8000:
        ct = _short_field(b, &p, end)
        if ct is _NO:
            return _NO
    if flags & 0x4000:
        ce = _short_field(b, &p, end)
        if ce is _NO:
            return _NO
    if flags & 0x2000:
        if p + 4 > end:
            return _NO
        q = p + 4 + _ld32(b + p)
        if q > end:
            return _NO
        hd = _dec_table(b, p + 4, q, 0)
        if hd is _NO:
            return _NO
        p = q
    if flags & 0x1000:
        if p >= end:
            return _NO
        dm = b[p]
        p += 1
    if flags & 0x0800:
        if p >= end:
            return _NO
        pr = b[p]
        p += 1
    if flags & 0x0400:
        ci = _short_field(b, &p, end)
        if ci is _NO:
            return _NO
    if flags & 0x0200:
        rt = _short_field(b, &p, end)
        if rt is _NO:
            return _NO
    if flags & 0x0100:
        ex = _short_field(b, &p, end)
        if ex is _NO:
            return _NO
    if flags & 0x0080:
        mi = _short_field(b, &p, end)
        if mi is _NO:
            return _NO
    if flags & 0x0040:
        if p + 8 > end:
            return _NO
        ts = _ld64(b + p)
        p += 8
    if flags & 0x0020:
        ty = _short_field(b, &p, end)
        if ty is _NO:
            return _NO
    if flags & 0x0010:
        ui = _short_field(b, &p, end)
        if ui is _NO:
            return _NO
    if flags & 0x0008:
        ai = _short_field(b, &p, end)
        if ai is _NO:
            return _NO
    if flags & 0x0004:
        ci2 = _short_field(b, &p, end)
        if ci2 is _NO:
            return _NO
    if p != end:
        return _NO
    return _properties(ct, ce, hd, dm, pr, ci, rt, ex, mi, ts, ty, ui, ai, ci2)


def decode_properties(buf, p=0, end=None):
    """properties.decode_properties: flags word(s) + property list of buf[p:end]."""
    cdef Py_ssize_t start, stop
    if not _span(buf, p, end, &start, &stop):
        return _py_decode_properties(buf, p, end)
    props = _dec_props(<const uint8_t*>PyBytes_AS_STRING(buf), start, stop)
    if props is _NO:
        return _py_decode_properties(buf, p, end)
    return props


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


# ---------------------------------------------------------------------------- the decoder's hot frames
DEF K_PUBLISH = (60 << 16) | 40
DEF K_ACK = (60 << 16) | 80
DEF K_NACK = (60 << 16) | 120
DEF K_REJECT = (60 << 16) | 90


cdef inline bint _within(uint64_t v, object limit) except -1:
    """v <= limit, for a Python number `limit`."""
    cdef long long x
    cdef int ovf
    if type(limit) is not int:
        return v <= limit
    x = PyLong_AsLongLongAndOverflow(limit, &ovf)
    if ovf:
        return ovf > 0
    return x >= 0 and v <= <uint64_t>x


def hot_frame(dec, buf, Py_ssize_t pos, Py_ssize_t n):
    """The event of the frame at buf[pos:n] when it is a hot one that Decoder.next_event would decode
    without error (a basic.publish whose content header and single body frame follow in buf, folded
    into one Message; a basic.ack, nack or reject), with dec._pos moved past it; else None and no
    change, and the decoder's general path takes the frame. For a decoder past its protocol header,
    not closing, with no partial frame pending (dec._more empty)."""
    cdef const uint8_t* b
    cdef uint32_t size, key, hsize, bsize
    cdef uint16_t channel
    cdef uint64_t body_size, tag
    cdef Py_ssize_t start, end, p, q, h, hend, bstart, bend
    cdef uint8_t bits
    if type(buf) is not bytes or pos < 0 or n > PyBytes_GET_SIZE(buf) or n - pos < 11:
        return None
    b = <const uint8_t*>PyBytes_AS_STRING(buf)
    if b[pos] != 1:
        return None
    channel = _ld16(b + pos + 1)
    size = _ld32(b + pos + 3)
    if size < 4 or not _within(size, dec._limit):
        return None
    start = pos + 7
    end = start + size
    if end >= n or b[end] != 0xCE:
        return None
    key = _ld32(b + start)
    pending = dec._pending
    if pending and channel in pending:
        return None
    if key == K_PUBLISH:
        if not channel or not dec._server or not dec.assemble:
            return None
        # ticket, exchange, routing key, bits
        p = start + 6
        if p >= end:
            return None
        q = p + 1 + b[p]
        if q >= end:
            return None
        exchange = _short_at(b + p + 1, q - p - 1)
        p = q + 1 + b[q]
        if p + 1 != end:
            return None
        routing_key = _short_at(b + q + 1, p - q - 1)
        bits = b[p]
        # the content header and the single body frame, already in buf and regular
        h = end + 1
        if h + 20 > n or b[h] != 2 or _ld16(b + h + 1) != channel:
            return None
        hsize = _ld32(b + h + 3)
        hend = h + 7 + hsize
        if (hsize < 12 or not _within(hsize, dec._limit) or hend >= n or b[hend] != 0xCE
                or _ld16(b + h + 7) != 60 or _ld16(b + h + 9) != 0):
            return None
        body_size = _ld64(b + h + 11)
        if not _within(body_size, dec.keep_body_size):
            return None
        if not body_size:
            body = b""
            bend = hend
        else:
            bstart = hend + 1
            if bstart + 7 > n or b[bstart] != 3 or _ld16(b + bstart + 1) != channel:
                return None
            bsize = _ld32(b + bstart + 3)
            bend = bstart + 7 + bsize
            if bsize != body_size or not _within(bsize, dec._limit) or bend >= n or b[bend] != 0xCE:
                return None
            body = PyBytes_FromStringAndSize(<const char*>b + bstart + 7, bsize)
        raw = PyBytes_FromStringAndSize(<const char*>b + h + 19, hend - h - 19)
        if dec.decode_properties:
            props = _dec_props(<const uint8_t*>PyBytes_AS_STRING(raw), 0, hend - h - 19)
            if props is _NO:
                return None
        else:
            props = None
        method = _new(_BasicPublish)
        method.exchange = exchange
        method.routing_key = routing_key
        method.mandatory = (bits & 1) != 0
        method.immediate = (bits & 2) != 0
        dec._pos = bend + 1
        return _message(channel, method, props, body, raw)
    if (key == K_ACK or key == K_NACK or key == K_REJECT) and channel and size == 13:
        tag = _ld64(b + start + 4)
        bits = b[start + 12]
        if key == K_ACK:
            method = _new(_BasicAck)
            method.multiple = (bits & 1) != 0
        elif key == K_NACK:
            method = _new(_BasicNack)
            method.multiple = (bits & 1) != 0
            method.requeue = (bits & 2) != 0
        elif dec._server:
            method = _new(_BasicReject)
            method.requeue = (bits & 1) != 0
        else:
            return None
        method.delivery_tag = tag
        dec._pos = end + 1
        return _method(channel, method)
    return None
