# cython: language_level=3
"""The compiled PUBLISH encoder (docs/store.md, "Compiled hot path"): `encoder.encode_publish` built
in one bytes object. encoder.py's pure function is the reference and the fallback: anything off the
fast path (properties to encode, a bytes-like payload that is not `bytes`, a field out of range, any
error) is handed to it, so the output and the errors are the pure function's. encoder.py binds it in
(`bind`) and chooses this module unless `GATEWAY_PURE_PYTHON=1`."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t
from libc.string cimport memcpy

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

cdef object _py_encode_publish = None


def bind(py_encode_publish):
    """encoder.py hands in the pure encode_publish (the fallback) once, at import."""
    global _py_encode_publish
    _py_encode_publish = py_encode_publish


def encode_publish(topic, payload, qos=0, packet_id=None, retain=False, dup=False, version=4,
                   properties=None):
    """encoder.encode_publish: a PUBLISH packet."""
    cdef Py_ssize_t tl, pl, rl, n, vl
    cdef const char* t
    cdef long q, pid = 0
    cdef bint v5
    cdef uint8_t first
    cdef uint8_t vbi[4]
    if (type(payload) is not bytes or type(qos) is not int or type(version) is not int
            or (properties and version == 5)):
        return _py_encode_publish(topic, payload, qos, packet_id, retain, dup, version, properties)
    q = qos
    if q:
        if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF or not 0 < q <= 2:
            return _py_encode_publish(topic, payload, qos, packet_id, retain, dup, version, properties)
        pid = packet_id
    elif q < 0:
        return _py_encode_publish(topic, payload, qos, packet_id, retain, dup, version, properties)
    if type(topic) is str:
        t = PyUnicode_AsUTF8AndSize(topic, &tl)
    elif type(topic) is bytes:
        t = PyBytes_AS_STRING(topic)
        tl = PyBytes_GET_SIZE(topic)
    else:
        return _py_encode_publish(topic, payload, qos, packet_id, retain, dup, version, properties)
    pl = PyBytes_GET_SIZE(payload)
    v5 = version == 5
    rl = 2 + tl + (2 if q else 0) + (1 if v5 else 0) + pl
    if tl > 0xFFFF or rl > 268435455:
        return _py_encode_publish(topic, payload, qos, packet_id, retain, dup, version, properties)
    first = 0x30 | (q << 1) | (1 if retain else 0) | (8 if dup else 0)
    vl = 0
    n = rl
    while True:
        vbi[vl] = n & 0x7F
        n >>= 7
        if n:
            vbi[vl] |= 0x80
            vl += 1
        else:
            vl += 1
            break
    out = PyBytes_FromStringAndSize(NULL, 1 + vl + rl)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    o[0] = first
    memcpy(o + 1, vbi, vl)
    o += 1 + vl
    o[0] = (tl >> 8) & 0xFF
    o[1] = tl & 0xFF
    memcpy(o + 2, t, tl)
    o += 2 + tl
    if q:
        o[0] = (pid >> 8) & 0xFF
        o[1] = pid & 0xFF
        o += 2
    if v5:
        o[0] = 0  # no properties
        o += 1
    memcpy(o, PyBytes_AS_STRING(payload), pl)
    return out
