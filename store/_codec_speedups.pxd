# The compiled record codec's part the append loop shares (docs/store.md, "Compiled hot path"):
# declared here, defined in `_codec_speedups.pyx` and cimported by `_append_speedups.pyx`. The
# functions declared without a body (`_crc32`, `_encode`) are called through Cython's C-API table;
# the inline ones (little-endian stores, the UTF-8 view of a str) are compiled into each extension.

from libc.stdint cimport uint8_t, uint32_t, uint64_t

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

cdef enum:
    MIN_RECORD = 10  # codec.MIN_RECORD: the smallest record (a blank one)


cdef uint32_t _crc32(const uint8_t* p, Py_ssize_t n) noexcept  # zlib.crc32 of n bytes at p
cdef object _encode(object msg, object queue_id, object queue_offset, object store_ts, object message_id,
                    object born_ts, object flags)  # codec.encode (the pure one off its fast path)


cdef inline const char* _utf8(object s, Py_ssize_t* n) except NULL:
    """The UTF-8 of a str (cached in the str: no copy for ASCII), as str.encode() gives it."""
    return PyUnicode_AsUTF8AndSize(s, n)


cdef inline void _u16(uint8_t* p, uint64_t v) noexcept:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF


cdef inline void _u32(uint8_t* p, uint64_t v) noexcept:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = (v >> 24) & 0xFF


cdef inline void _u64(uint8_t* p, uint64_t v) noexcept:
    _u32(p, v & 0xFFFFFFFF)
    _u32(p + 4, v >> 32)
