# cython: language_level=3, cdivision=True, boundscheck=False, wraparound=False
"""The compiled AMQP 0-9-1 decoder (docs/store.md, "Compiled hot path"): what the gateway reads for
each message under an AMQP load (publish + consume + ack), hand-written because it is the product's
per-message work:

    decode_table            wire.py: a field table (the `headers` property) into a dict
    decode_properties       properties.py: flags word(s) + property list into a BasicProperties
    hot_frame               decoder.py: the per-frame parsing Decoder.next_event does for the hot
                            frames: basic.publish with its content header and single body frame in
                            the same buffer (one Message), basic.ack / nack / reject (one Method);
                            Decoder stays the sans-IO Python class

What the gateway writes is `_encode_speedups.pyx`; the number layout both use is `_bytes.pxd`.
The pure-Python modules are the reference and the fallback: every function here gives equal values
and hands any input off its fast path (an unusual type, a malformed or truncated buffer, a table
nested deeper than MAX_DEPTH) to the pure function, so the errors are the pure ones too (same type,
same message). `hot_frame` never raises: it returns None for anything but a well-formed hot frame,
and Decoder's general path then does the work (and reports any error). wire.py, properties.py and
decoder.py bind their types and pure functions in (`bind_*`) and choose this module unless
`GATEWAY_PURE_PYTHON=1`.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from ._bytes cimport MAX_DEPTH, _F32, _F64, _ld16, _ld32, _ld64

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object v, int* overflow) except? -1

cdef object _NO = object()  # "off the fast path": the caller hands the input to the pure function

# ---------------------------------------------------------------------------- bound in by the modules
cdef object _Timestamp = None
cdef object _Decimal = None
cdef object _py_decode_table = None
cdef object _BasicProperties = None
cdef object _py_decode_properties = None
cdef object _Message = None
cdef object _Method = None
cdef object _BasicPublish = None
cdef object _BasicAck = None
cdef object _BasicNack = None
cdef object _BasicReject = None


cdef object _new = object.__new__


def bind_wire(timestamp, decimal, py_decode_table):
    """wire.py hands in its Timestamp and Decimal types and the pure decode_table once, at import."""
    global _Timestamp, _Decimal, _py_decode_table
    _Timestamp, _Decimal, _py_decode_table = timestamp, decimal, py_decode_table


def bind_properties(basic_properties, py_decode_properties):
    """properties.py hands in BasicProperties and its pure decode_properties once, at import."""
    global _BasicProperties, _py_decode_properties
    _BasicProperties, _py_decode_properties = basic_properties, py_decode_properties


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
