# What the two extensions of the compiled AMQP 0-9-1 codec (docs/store.md, "Compiled hot path") share:
# `_encode_speedups.pyx` (what the gateway writes) and `_decode_speedups.pyx` (what it reads) cimport
# the wire's number layout from here: big-endian loads and stores, the views of IEEE 754 floats, and
# the depth limit of field tables. All inline, so each extension compiles its own copy (no C-API
# table, no import at run time). Everything else stays in the one extension that uses it.

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

cdef enum:
    MAX_DEPTH = 32  # deeper tables go to the pure functions (which recurse, and raise RecursionError)

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
