# cython: language_level=3
"""The compiled message lists of the store node protocol (docs/store.md, "Compiled hot path"):
`store_wire.encode_messages` and `store_wire.decode_popped`, which every append from a proxy (or a
`--workers` worker) and every read reply cross, once on each side. The records inside are the
store's own (store/codec.py `encode` / `decode`, compiled too); what is compiled here is the framing
around them: one bytes object built with memcpy, the counts and offsets read in C.

store_wire.py's pure functions are the reference and the fallback: anything off the fast path (a
value out of its field's range, a type that is not the usual one, a body that does not parse) is
handed to them, so the output and the errors are theirs. store_wire.py binds them in (`bind`) and
chooses this module unless `GATEWAY_PURE_PYTHON=1`."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from "Python.h":
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)

cdef object _py_encode_messages = None
cdef object _py_decode_popped = None
cdef object _encode_record = None
cdef object _decode_record = None
cdef object _Popped = None
cdef object _WireError = None
cdef tuple _WRAPPED = ()  # the errors decode_popped reports as WireError


def bind(py_encode_messages, py_decode_popped, encode_record, decode_record, popped_message,
         wire_error, wrapped_errors):
    """store_wire.py hands in its pure functions (the fallback), the store's record codec, the
    PoppedMessage class and the error types, once, at import."""
    global _py_encode_messages, _py_decode_popped, _encode_record, _decode_record, _Popped
    global _WireError, _WRAPPED
    _py_encode_messages = py_encode_messages
    _py_decode_popped = py_decode_popped
    _encode_record = encode_record
    _decode_record = decode_record
    _Popped = popped_message
    _WireError = wire_error
    _WRAPPED = tuple(wrapped_errors)


cdef inline void _be16(uint8_t* p, uint64_t v) noexcept:
    p[0] = <uint8_t>(v >> 8)
    p[1] = <uint8_t>v


cdef inline void _be32(uint8_t* p, uint64_t v) noexcept:
    p[0] = <uint8_t>(v >> 24)
    p[1] = <uint8_t>(v >> 16)
    p[2] = <uint8_t>(v >> 8)
    p[3] = <uint8_t>v


cdef inline void _be64(uint8_t* p, uint64_t v) noexcept:
    _be32(p, v >> 32)
    _be32(p + 4, v & 0xFFFFFFFF)


cdef inline uint64_t _ld32(const uint8_t* p) noexcept:
    return (<uint64_t>p[0] << 24) | (<uint64_t>p[1] << 16) | (<uint64_t>p[2] << 8) | p[3]


cdef inline uint64_t _ld64(const uint8_t* p) noexcept:
    return (_ld32(p) << 32) | _ld32(p + 4)


cdef inline bint _int64(object v) noexcept:
    return type(v) is int and -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF


def encode_messages(items):
    """store_wire.encode_messages: messages (or popped messages with their handles) as one body."""
    cdef list rows = []
    cdef Py_ssize_t total = 4, hl, rl
    cdef uint8_t* o
    items = list(items)  # (a pure fallback needs them again)
    for it in items:
        if isinstance(it, _Popped):
            m = it.message
            handle = it.receipt_handle
            if type(handle) is not str:
                return _py_encode_messages(items)
            handle = (<str>handle).encode()
            until = it.invisible_until
        else:
            m = it
            handle = b""
            until = 0
        clo = m.commitlog_offset
        reconsume = m.reconsume_times
        if (not _int64(until) or not _int64(clo) or type(reconsume) is not int
                or not -0x80000000 <= reconsume <= 0x7FFFFFFF or len(<bytes>handle) > 0xFFFF):
            return _py_encode_messages(items)
        rec = _encode_record(m, m.queue_id, m.queue_offset, m.store_timestamp, m.message_id,
                             m.born_timestamp)
        if type(rec) is not bytes or len(<bytes>rec) > 0xFFFFFFFF:
            return _py_encode_messages(items)
        rows.append((handle, until, clo, reconsume, rec))
        total += 2 + len(<bytes>handle) + 20 + 4 + len(<bytes>rec)
    if len(rows) > 0xFFFFFFFF:
        return _py_encode_messages(items)
    out = PyBytes_FromStringAndSize(NULL, total)
    o = <uint8_t*>PyBytes_AS_STRING(out)
    _be32(o, len(rows))
    o += 4
    for handle, until, clo, reconsume, rec in rows:
        hl = PyBytes_GET_SIZE(handle)
        _be16(o, hl)
        memcpy(o + 2, PyBytes_AS_STRING(handle), hl)
        o += 2 + hl
        _be64(o, <uint64_t><int64_t>until)
        _be64(o + 8, <uint64_t><int64_t>clo)
        _be32(o + 16, <uint32_t><int32_t>reconsume)
        rl = PyBytes_GET_SIZE(rec)
        _be32(o + 20, rl)
        memcpy(o + 24, PyBytes_AS_STRING(rec), rl)
        o += 24 + rl
    return out


def decode_popped(body):
    """store_wire.decode_popped: what `encode_messages` wrote (plain messages come back with an
    empty handle)."""
    cdef const uint8_t* b
    cdef Py_ssize_t size, pos, hl, rl
    cdef uint64_t n, i
    if type(body) is not bytes:
        return _py_decode_popped(body)
    b = <const uint8_t*>PyBytes_AS_STRING(body)
    size = PyBytes_GET_SIZE(body)
    if size < 4:
        return _py_decode_popped(body)
    n = _ld32(b)
    pos = 4
    cdef list out = []
    try:
        for i in range(n):
            if pos + 2 > size:
                return _py_decode_popped(body)
            hl = (b[pos] << 8) | b[pos + 1]
            pos += 2
            if pos + hl + 24 > size:
                return _py_decode_popped(body)
            handle = PyUnicode_DecodeUTF8(<const char*>b + pos, hl, NULL)
            pos += hl
            until = <int64_t>_ld64(b + pos)
            clo = <int64_t>_ld64(b + pos + 8)
            reconsume = <int32_t><uint32_t>_ld32(b + pos + 16)
            rl = <Py_ssize_t>_ld32(b + pos + 20)
            pos += 24
            if pos + rl > size:
                return _py_decode_popped(body)
            m = _decode_record(body, pos, clo)
            m.reconsume_times = reconsume
            pos += rl
            out.append(_Popped(m, handle, until))
    except _WRAPPED as e:
        raise _WireError(f"malformed message list: {e}") from None
    return out
