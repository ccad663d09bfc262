# cython: language_level=3, cdivision=True
"""The compiled record codec of the store (docs/store.md, "Compiled hot path"): `codec.encode`,
`decode`, `check`, `decode_checked` and the CRC-32 they use (zlib's polynomial, slicing by 8).
Its C functions `_encode` and `_crc32` are declared in `_codec_speedups.pxd`, with the inline
little-endian stores and UTF-8 view both extensions use, for the append loop
(`_append_speedups.pyx`) to call.

The pure-Python functions in codec.py are the reference: every function here gives byte-identical
records and equal results, and hands any input off its fast path (an unusual type, a value out of a
field's range, a record that does not hold) to the pure function, so errors are the pure ones too.
codec.py binds the pure functions and types in (`bind_codec`) and chooses this module unless
`GATEWAY_PURE_PYTHON=1`.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

import zlib

# ---------------------------------------------------------------------------- CRC-32 (zlib's)
cdef uint32_t _crc_table[8][256]


cdef void _crc_init() noexcept:
    cdef uint32_t c
    cdef int i, k
    for i in range(256):
        c = i
        for k in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        _crc_table[0][i] = c
    for i in range(256):
        c = _crc_table[0][i]
        for k in range(1, 8):
            c = _crc_table[0][c & 0xFF] ^ (c >> 8)
            _crc_table[k][i] = c


_crc_init()
_zlib_crc32 = zlib.crc32
DEF _ZLIB_FROM = 4096  # longer data: zlib's own (vectorised) loop


cdef uint32_t _crc32(const uint8_t* p, Py_ssize_t n) noexcept:
    """zlib.crc32 (slicing by 8): the same value for the same bytes."""
    cdef uint32_t c = 0xFFFFFFFF
    cdef uint32_t lo, hi
    while n >= 8:
        lo = (p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)) ^ c
        hi = p[4] | (<uint32_t>p[5] << 8) | (<uint32_t>p[6] << 16) | (<uint32_t>p[7] << 24)
        c = (_crc_table[7][lo & 0xFF] ^ _crc_table[6][(lo >> 8) & 0xFF]
             ^ _crc_table[5][(lo >> 16) & 0xFF] ^ _crc_table[4][lo >> 24]
             ^ _crc_table[3][hi & 0xFF] ^ _crc_table[2][(hi >> 8) & 0xFF]
             ^ _crc_table[1][(hi >> 16) & 0xFF] ^ _crc_table[0][hi >> 24])
        p += 8
        n -= 8
    while n > 0:
        c = _crc_table[0][(c ^ p[0]) & 0xFF] ^ (c >> 8)
        p += 1
        n -= 1
    return c ^ 0xFFFFFFFF


cdef uint32_t _crc_of(object buf, const uint8_t* p, Py_ssize_t start, Py_ssize_t end) except? 0:
    if end - start < _ZLIB_FROM:
        return _crc32(p + start, end - start)
    return _zlib_crc32(memoryview(buf)[start:end])


def crc32(data) -> int:
    """zlib.crc32(data) of a bytes-like object."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return _crc_of(data, <const uint8_t*>view.buf, 0, view.len)
    finally:
        PyBuffer_Release(&view)


# ---------------------------------------------------------------------------- little-endian loads
# (the stores, _u16, _u32 and _u64, are inline in _codec_speedups.pxd)
cdef inline uint32_t _ld32(const uint8_t* p) noexcept:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint16_t _ld16(const uint8_t* p) noexcept:
    return p[0] | (<uint16_t>p[1] << 8)


cdef inline int64_t _ld64(const uint8_t* p) noexcept:
    return <int64_t>(<uint64_t>_ld32(p) | (<uint64_t>_ld32(p + 4) << 32))


# ---------------------------------------------------------------------------- codec
DEF MAGIC_MESSAGE = 0xA5
DEF MAGIC_BLANK = 0xB1
DEF MAGIC_BATCH = 0xA7
DEF HEADER_SIZE = 68  # PREFIX (8) + HEAD (60)
DEF BATCH_HEADER_SIZE = 12
DEF FLAG_JSON_PROPERTIES = 1

cdef object _Message = None
cdef object _CorruptRecord = None
cdef tuple _MESSAGE_TYPES = ()
cdef object _py_encode = None
cdef object _py_decode = None
cdef object _py_check = None
cdef object _decode_properties = None
cdef object _dumps = None
cdef str _KEY_SEP = "\x1f"


def bind_codec(message, corrupt_record, message_types, py_encode, py_decode, py_check, decode_properties,
               dumps):
    """codec.py hands in its types and pure functions (the fallbacks) once, at import."""
    global _Message, _CorruptRecord, _MESSAGE_TYPES, _py_encode, _py_decode, _py_check
    global _decode_properties, _dumps
    _Message, _CorruptRecord, _MESSAGE_TYPES = message, corrupt_record, tuple(message_types)
    _py_encode, _py_decode, _py_check = py_encode, py_decode, py_check
    _decode_properties, _dumps = decode_properties, dumps


cdef const char* _EMPTY = ""


def encode(msg, queue_id, queue_offset, store_ts, message_id, born_ts, flags=0):
    """codec.encode: one message record, built in place in one bytes object."""
    return _encode(msg, queue_id, queue_offset, store_ts, message_id, born_ts, flags)


cdef object _encode(object msg, object queue_id, object queue_offset, object store_ts, object message_id,
                    object born_ts, object flags):
    cdef Py_ssize_t lt, lg = 0, lk = 0, lgr = 0, lm, lh = 0, lp = 0, lb, total
    cdef const char* pt
    cdef const char* pg = _EMPTY
    cdef const char* pk = _EMPTY
    cdef const char* pgr = _EMPTY
    cdef const char* pm
    cdef const char* ph = _EMPTY
    cdef const char* pp = _EMPTY
    cdef int64_t qid, qoff, sts, bts, dat
    cdef int64_t mtype, fl
    cdef object body = msg.body
    cdef object keys_b = None
    cdef object props_b = None
    tag = msg.tag
    group = msg.message_group
    host = msg.born_host
    if (type(body) is not bytes or type(msg.topic) is not str or type(message_id) is not str
            or (tag and type(tag) is not str) or (group and type(group) is not str)
            or (host and type(host) is not str)):
        return _py_encode(msg, queue_id, queue_offset, store_ts, message_id, born_ts, flags)
    try:
        qid = queue_id
        qoff = queue_offset
        sts = store_ts
        bts = born_ts
        dat = msg.deliver_at
        mtype = msg.msg_type
        fl = flags
    except (OverflowError, TypeError):
        return _py_encode(msg, queue_id, queue_offset, store_ts, message_id, born_ts, flags)
    if qid < -0x80000000 or qid > 0x7FFFFFFF or not 0 <= mtype <= 0xFF or not 0 <= fl <= 0xFFFF:
        return _py_encode(msg, queue_id, queue_offset, store_ts, message_id, born_ts, flags)
    pt = _utf8(msg.topic, &lt)
    if tag:
        pg = _utf8(tag, &lg)
    keys = msg.keys
    if keys:
        keys_b = _KEY_SEP.join(keys).encode()
        pk = PyBytes_AS_STRING(keys_b)
        lk = PyBytes_GET_SIZE(keys_b)
    if group:
        pgr = _utf8(group, &lgr)
    pm = _utf8(message_id, &lm)
    if host:
        ph = _utf8(host, &lh)
    props = msg.properties
    if props:
        try:
            props_b = _dumps(props)
        except TypeError as e:  # orjson.JSONEncodeError: a lone surrogate (not UTF-8), a non-string
            raise ValueError(f"properties cannot be stored: {e}") from None
        pp = PyBytes_AS_STRING(props_b)
        lp = PyBytes_GET_SIZE(props_b)
        fl |= FLAG_JSON_PROPERTIES
    lb = PyBytes_GET_SIZE(body)
    if (lt > 0xFFFF or lg > 0xFFFF or lk > 0xFFFF or lgr > 0xFFFF or lm > 0xFFFF or lh > 0xFFFF
            or lp > 0xFFFFFFFF or lb > 0xFFFFFFFF):
        return _py_encode(msg, queue_id, queue_offset, store_ts, message_id, born_ts, flags)
    total = HEADER_SIZE + lt + lg + lk + lgr + lm + lh + lp + lb
    if total > 0xFFFFFFFF:
        return _py_encode(msg, queue_id, queue_offset, store_ts, message_id, born_ts, flags)
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    o[8] = MAGIC_MESSAGE
    o[9] = <uint8_t>mtype
    _u16(o + 10, <uint64_t>fl)
    _u32(o + 12, <uint64_t><uint32_t><int32_t>qid)
    _u64(o + 16, <uint64_t>qoff)
    _u64(o + 24, <uint64_t>sts)
    _u64(o + 32, <uint64_t>bts)
    _u64(o + 40, <uint64_t>dat)
    _u16(o + 48, lt)
    _u16(o + 50, lg)
    _u16(o + 52, lk)
    _u16(o + 54, lgr)
    _u16(o + 56, lm)
    _u16(o + 58, lh)
    _u32(o + 60, lp)
    _u32(o + 64, lb)
    cdef uint8_t* w = o + HEADER_SIZE
    memcpy(w, pt, lt)
    w += lt
    memcpy(w, pg, lg)
    w += lg
    memcpy(w, pk, lk)
    w += lk
    memcpy(w, pgr, lgr)
    w += lgr
    memcpy(w, pm, lm)
    w += lm
    memcpy(w, ph, lh)
    w += lh
    memcpy(w, pp, lp)
    w += lp
    memcpy(w, PyBytes_AS_STRING(body), lb)
    _u32(o, total)
    _u32(o + 4, _crc32(o + 8, total - 8))
    return out


cdef object _check(object buf, const uint8_t* p, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t limit):
    """check on a buffer `p` of `n` bytes, for 0 <= pos and limit <= n: (size, magic)."""
    cdef uint32_t size, crc
    cdef uint8_t magic
    if limit - pos < MIN_RECORD:
        raise _CorruptRecord("short")
    size = _ld32(p + pos)
    crc = _ld32(p + pos + 4)
    if size < MIN_RECORD or pos + <Py_ssize_t>size > limit:
        raise _CorruptRecord(f"bad size {size}")
    if _crc_of(buf, p, pos + 8, pos + size) != crc:
        raise _CorruptRecord("crc mismatch")
    magic = p[pos + 8]
    if magic == MAGIC_BLANK:
        return size, magic
    if magic == MAGIC_BATCH:
        if size < BATCH_HEADER_SIZE + HEADER_SIZE:
            raise _CorruptRecord(f"batch of {size} bytes")
        return size, magic
    if magic != MAGIC_MESSAGE or size < HEADER_SIZE:
        raise _CorruptRecord(f"bad magic {magic}")
    return size, magic


def check(buf, pos, limit):
    """codec.check: validate the record at `pos`; (size, magic), or CorruptRecord."""
    cdef Py_buffer view
    cdef Py_ssize_t p, lim
    try:
        p = pos
        lim = limit
    except (OverflowError, TypeError):
        return _py_check(buf, pos, limit)
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if p < 0 or lim > view.len or (lim - p >= MIN_RECORD and p + 8 > view.len):
            return _py_check(buf, pos, limit)
        return _check(buf, <const uint8_t*>view.buf, view.len, p, lim)
    finally:
        PyBuffer_Release(&view)


cdef inline str _text(const uint8_t* p, Py_ssize_t n):
    return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)


cdef object _decode(const uint8_t* b, Py_ssize_t n, Py_ssize_t pos, object commitlog_offset, object buf):
    """decode of the record at `pos` of a buffer of `n` bytes; the pure decode when it is not whole."""
    cdef uint32_t size
    cdef uint8_t mtype
    cdef uint16_t flags, lt, lg, lk, lgr, lm, lh
    cdef uint32_t lp, lb
    cdef const uint8_t* h
    cdef const uint8_t* s
    if pos < 0 or pos + HEADER_SIZE > n:
        return _py_decode(buf, pos, commitlog_offset)
    h = b + pos
    size = _ld32(h)
    mtype = h[9]
    flags = _ld16(h + 10)
    lt, lg, lk, lgr, lm, lh = _ld16(h + 48), _ld16(h + 50), _ld16(h + 52), _ld16(h + 54), _ld16(h + 56), _ld16(h + 58)
    lp, lb = _ld32(h + 60), _ld32(h + 64)
    if (size < HEADER_SIZE or pos + <Py_ssize_t>size > n or mtype >= len(_MESSAGE_TYPES)
            or <uint64_t>HEADER_SIZE + lt + lg + lk + lgr + lm + lh + lp + lb != size):
        return _py_decode(buf, pos, commitlog_offset)
    s = h + HEADER_SIZE
    topic = _text(s, lt)
    s += lt
    tag = _text(s, lg) if lg else ""
    s += lg
    keys = tuple(_text(s, lk).split(_KEY_SEP)) if lk else ()
    s += lk
    group = _text(s, lgr) if lgr else ""
    s += lgr
    mid = _text(s, lm)
    s += lm
    host = _text(s, lh) if lh else ""
    s += lh
    props = _decode_properties(PyBytes_FromStringAndSize(<const char*>s, lp), flags) if lp else {}
    s += lp
    body = PyBytes_FromStringAndSize(<const char*>s, lb)
    return _Message(
        topic,
        body,
        tag,
        keys,
        props,
        group,
        _ld64(h + 40),
        mid,
        _ld64(h + 32),
        host,
        <int32_t>_ld32(h + 12),
        _MESSAGE_TYPES[mtype],
        _ld64(h + 24),
        "",
        _ld64(h + 16),
        commitlog_offset,
        size,
    )


def decode(buf, pos=0, commitlog_offset=-1):
    """codec.decode: the message record at `pos` (already checked, or trusted)."""
    cdef Py_buffer view
    cdef Py_ssize_t p
    try:
        p = pos
    except (OverflowError, TypeError):
        return _py_decode(buf, pos, commitlog_offset)
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        return _decode(<const uint8_t*>view.buf, view.len, p, commitlog_offset, buf)
    finally:
        PyBuffer_Release(&view)


def decode_checked(buf, commitlog_offset):
    """codec.decode_checked: check, then decode, the one record `buf` holds."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        _check(buf, <const uint8_t*>view.buf, view.len, 0, view.len)
        return _decode(<const uint8_t*>view.buf, view.len, 0, commitlog_offset, buf)
    finally:
        PyBuffer_Release(&view)
