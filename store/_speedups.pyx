# cython: language_level=3, cdivision=True
"""The compiled hot path of the store (docs/store.md, "Compiled hot path"): the record codec
(`codec.encode`, `decode`, `check`, `decode_checked`) and the CRC-32 they use, and the append loop
(`appending.Appender.append`, `place`, `on_readable`, `on_durable`; bound in by `bind_append`).

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
from cpython.object cimport PyObject
from libc.string cimport memcpy

import zlib

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    PyObject* PyTuple_GET_ITEM(object t, Py_ssize_t i)  # borrowed

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


cdef inline uint32_t _crc32(const uint8_t* p, Py_ssize_t n) noexcept:
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


# ---------------------------------------------------------------------------- little-endian stores/loads
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
DEF MIN_RECORD = 10
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


cdef inline const char* _utf8(object s, Py_ssize_t* n) except NULL:
    """The UTF-8 of a str (cached in the str: no copy for ASCII), as str.encode() gives it."""
    return PyUnicode_AsUTF8AndSize(s, n)


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


# ---------------------------------------------------------------------------- the append path
# appending.Appender's append, place, on_readable and on_durable, compiled: the same steps in the
# same order (appending.py is the reference; rare branches call the same Python helpers).

cdef object _appending = None  # the module: its time_ns is read per call (tests replace the clock)
cdef object _Record = None
cdef object _AppendResult = None
cdef object _StoreError = None
cdef object _MessageTooLarge = None
cdef object _hold = None
cdef object _compaction_key = None
cdef object _key_queue = None
cdef object _index_encode = None
cdef object _TRANSACTION = None
cdef object _SCHEDULE_TOPIC = None
cdef object _HALF_TOPIC = None
cdef str _PATH_PROPERTY = None  # the record property of a path (bound: store/message.py)
cdef object _new_tuple = tuple.__new__
DEF PATH_HASH_BIT = 1 << 62


cdef inline object _at(object t, Py_ssize_t i):
    """Item i of a tuple (a Record or an AppendResult: NamedTuples), without a bounds check."""
    return <object>PyTuple_GET_ITEM(t, i)


def bind_append(appending, record, append_result, store_error, message_too_large, hold, compaction_key,
                key_queue, index_encode, transaction, schedule_topic, half_topic, path_property):
    """appending.py hands in what its hot path uses, once, at import."""
    global _appending, _Record, _AppendResult, _StoreError, _MessageTooLarge, _hold, _compaction_key
    global _key_queue, _index_encode, _TRANSACTION, _SCHEDULE_TOPIC, _HALF_TOPIC, _PATH_PROPERTY
    _appending, _Record, _AppendResult, _StoreError = appending, record, append_result, store_error
    _MessageTooLarge, _hold, _compaction_key, _key_queue = message_too_large, hold, compaction_key, key_queue
    _index_encode, _TRANSACTION, _SCHEDULE_TOPIC, _HALF_TOPIC = index_encode, transaction, schedule_topic, half_topic
    _PATH_PROPERTY = path_property


cdef inline uint32_t _adler32(const uint8_t* p, Py_ssize_t n) noexcept:
    """zlib.adler32 (from 1)."""
    cdef uint32_t a = 1, b = 0
    cdef Py_ssize_t k
    while n > 0:
        k = 5552 if n > 5552 else n
        n -= k
        while k > 0:
            a += p[0]
            b += a
            p += 1
            k -= 1
        a %= 65521
        b %= 65521
    return (b << 16) | a


cdef uint32_t _crc_str(object s) except? 0:
    """zlib.crc32(s.encode()) of a str (s.encode() for anything else, as the pure code calls it)."""
    cdef Py_ssize_t n
    cdef const char* p
    if type(s) is str:
        p = _utf8(s, &n)
        return _crc32(<const uint8_t*>p, n)
    b = s.encode()
    return _crc32(<const uint8_t*>PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))


def path_hash(path):
    """message.path_hash, as the append loop computes it."""
    cdef Py_ssize_t n
    cdef const char* p
    b = path.encode()
    p = PyBytes_AS_STRING(b)
    n = PyBytes_GET_SIZE(b)
    return PATH_HASH_BIT | (<uint64_t>_crc32(<const uint8_t*>p, n) << 30) | (_adler32(<const uint8_t*>p, n) & 0x3FFFFFFF)


cdef inline bytes _entry(int64_t clo, uint32_t size, uint64_t th, int64_t now):
    """consumequeue.ENTRY.pack(clo, size, th, now): 28 bytes."""
    out = PyBytes_FromStringAndSize(NULL, 28)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    _u64(o, <uint64_t>clo)
    _u32(o + 8, size)
    _u64(o + 12, th)
    _u64(o + 20, <uint64_t>now)
    return out


cdef inline bytes _id32(const char* mb, int64_t clo):
    """index.ID32.pack(KIND_ID, 32, mb, clo): 43 bytes."""
    out = PyBytes_FromStringAndSize(NULL, 43)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    o[0] = 0
    _u16(o + 1, 32)
    memcpy(o + 3, mb, 32)
    _u64(o + 35, <uint64_t>clo)
    return out


def append(self, msg):
    """Appender.append."""
    if self.closed:
        raise _StoreError("store is closed")
    broken = self.writer.broken
    if broken is not None:
        raise _StoreError(f"store failed and must be reopened: {broken}")
    now = _appending.time_ns() // 1_000_000
    free_space = self.free_space
    if free_space.low:
        free_space.refuse()
    if msg.msg_type == _TRANSACTION or msg.deliver_at > now:
        return self.submit(_hold(msg, self.catalog), now, msg.topic)
    n = len(msg.body)
    if n > self.max_size:
        raise _MessageTooLarge(f"body of {n} bytes exceeds {self.max_size}")
    fut = self.loop.create_future()
    _place(self, (msg,), now, fut, None)
    return fut


def place(self, msgs, now, fut, real=None):
    """Appender.place: encode, place and queue records for the writer, in order."""
    return _place(self, msgs, now, fut, real)


cdef list _place(object self, object msgs, object now, object fut, object real):
    cdef Py_ssize_t i, last, nq, lmb
    cdef int64_t qid, qoff, clo, start, size, seg_size, largest, c_now
    cdef uint64_t th
    cdef const char* pmb
    cdef Py_ssize_t plen
    cdef const char* pp
    catalog = self.catalog
    tq = catalog.topic_queues
    queues = catalog.queues
    compacted = catalog.compacted
    cdef dict rr = self.rr
    next_id = self.ids.next
    cl = self.commitlog
    seg_size = self.seg_size
    largest = seg_size - MIN_RECORD
    done = self.done
    c_now = now
    last = len(msgs) - 1
    cdef list out = []
    cdef list recs = []
    try:
        for i in range(last + 1):
            msg = msgs[i]
            topic = msg.topic
            qs = tq.get(topic) or queues(topic)
            nq = len(qs)
            qid = msg.queue_id
            if qid < 0:
                group = msg.message_group
                if group:
                    if nq == 0:
                        raise ZeroDivisionError("integer modulo by zero")
                    qid = _crc_str(group) % nq
                elif compacted and topic in compacted and (key := _compaction_key(msg)) is not None:
                    qid = _key_queue(key, nq)  # a key's records stay in one queue
                elif okey := msg.order_key:  # (set above the store: messaging_processor/ordering.py)
                    if nq == 0:
                        raise ZeroDivisionError("integer modulo by zero")
                    qid = _crc_str(okey) % nq  # one queue per order key: its order
                else:
                    if nq == 0:
                        raise ZeroDivisionError("integer modulo by zero")
                    qid = rr.get(topic, 0) % nq  # (% : the topic may have shrunk)
                    rr[topic] = (qid + 1) % nq
            elif qid >= nq:
                qid = self._writable(topic, qid, nq)
            cq = qs[qid]
            mid = msg.message_id or next_id()
            qoff = cq.next_offset
            born = msg.born_timestamp or now
            rec = _encode(msg, qid, qoff, now, mid, born, 0)
            size = len(rec)
            if size > largest:
                raise _MessageTooLarge(f"a record of {size} bytes does not fit a {seg_size}-byte segment")
            clo = cl.write_pos
            if clo % seg_size + size <= seg_size:
                cl.write_pos = clo + size
                start = clo
            else:
                clo_o, filler = cl.reserve(size)
                clo = clo_o
                start = clo - len(filler)
                rec = filler + rec
            cq.next_offset = qoff + 1
            tag = msg.tag
            if tag:
                th = <uint64_t>_crc_str(tag) + 1
            elif (props := msg.properties) and (path := props.get(_PATH_PROPERTY)):
                # message.path_hash, inlined in the append loop (tests check they agree)
                if type(path) is str:
                    pp = _utf8(path, &plen)
                else:
                    pb = path.encode()
                    pp = PyBytes_AS_STRING(pb)
                    plen = PyBytes_GET_SIZE(pb)
                th = (PATH_HASH_BIT | (<uint64_t>_crc32(<const uint8_t*>pp, plen) << 30)
                      | (_adler32(<const uint8_t*>pp, plen) & 0x3FFFFFFF))
            else:
                th = 0
            keys = msg.keys
            if type(mid) is str:
                pmb = _utf8(mid, &lmb)
            else:
                mb = mid.encode()
                pmb = PyBytes_AS_STRING(mb)
                lmb = PyBytes_GET_SIZE(mb)
            if not keys and lmb == 32:
                idx = _id32(pmb, clo)
            else:
                idx = _index_encode(mid, keys, clo)
            res = _new_tuple(_AppendResult, (mid, real[i] if real else topic, qid, qoff, clo, size, now))
            recs.append(
                _new_tuple(
                    _Record,
                    (start, rec, cq, _entry(clo, <uint32_t>size, th, c_now), idx, fut if i == last else done,
                     res, keys, th),
                )
            )
            out.append(res)
    finally:
        if recs:
            self.writer.put(recs)
    return out


def on_readable(self, list recs):
    """Appender.on_readable: a batch is written to the page cache: make it readable and index it."""
    index = self.index
    cdef dict ids = index.ids
    index_add = index.add
    index_mem = index.mem
    waiters = self.waiters
    cdef dict touched = {}
    cdef bint special = False
    for r in recs:
        cq = _at(r, 2)
        res = _at(r, 6)
        cq.mem += _at(r, 3)
        cq.max_offset = _at(res, 3) + 1
        index_mem += _at(r, 4)
        mid = _at(res, 0)
        keys = _at(r, 7)
        topic = cq.topic
        if type(keys) is list:  # a batch record (place_batch): each of its messages
            mids, poss, keyed = keys
            if ids.keys().isdisjoint(mids):
                ids.update(zip(mids, poss, strict=True))
            else:
                keyed = keyed + [(m, (), p) for m, p in zip(mids, poss, strict=True)]
            for mid, keys, clo in keyed:  # the batch's own, in turn
                index_add(mid, keys, clo)
            if waiters and topic in waiters:
                touched.setdefault(topic, set()).update(_at(r, 8))
            continue
        if keys or mid in ids:
            index_add(mid, keys, _at(res, 4))
        else:
            ids[mid] = _at(res, 4)
        if topic[0] == "%":
            special = True
        if waiters and topic in waiters:
            hs = touched.get(topic)
            if hs is None:
                hs = touched[topic] = set()
            hs.add(_at(r, 8))
    if special:
        for r in recs:
            topic = _at(r, 2).topic
            if topic == _SCHEDULE_TOPIC:
                self.on_delayed(_at(r, 6))
            elif topic == _HALF_TOPIC:
                self.on_half(_at(r, 6))
    if touched:
        self.wake_topics(touched)


def on_durable(self, list recs, seconds):
    """Appender.on_durable: a batch (already readable) is durable: answer its appenders, count its
    bytes per segment."""
    cdef dict per_topic = {}  # topic -> [bytes, last store ts]
    cdef int64_t seg_size, first, last_
    for r in recs:
        res = _at(r, 6)
        topic = _at(r, 2).topic
        st = per_topic.get(topic)
        if st is None:
            per_topic[topic] = [_at(res, 5), _at(res, 6)]
        else:
            st[0] += _at(res, 5)
            st[1] = _at(res, 6)
        fut = _at(r, 5)
        if not fut.done():
            fut.set_result(res)
    metrics = self.metrics
    metrics["appends"] += len(recs)
    metrics["flushes"] += 1
    cdef list fl = self.flush_latency_ms
    fl.append(seconds * 1000)
    if len(fl) > 4096:
        del fl[:2048]
    seg_size = self.seg_size
    first, last_ = _at(_at(recs[0], 6), 4), _at(_at(recs[-1], 6), 4)
    if first - first % seg_size == last_ - last_ % seg_size:
        self.segments.add(last_ - last_ % seg_size, per_topic)
    else:
        count = self.segments.count
        for r in recs:
            res = _at(r, 6)
            count(_at(res, 4), _at(r, 2).topic, _at(res, 5), _at(res, 6))
