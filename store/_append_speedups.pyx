# cython: language_level=3, cdivision=True
"""The compiled append loop of the store (docs/store.md, "Compiled hot path"):
`appending.Appender.append`, `place`, `on_readable`, `on_durable`, packing queue and index entries
in C, and `message.path_hash` as the loop computes it. Records are encoded by the compiled codec,
whose `_encode` and `_crc32` it calls through `_codec_speedups.pxd` (Cython's C-API table, set up
when this module is imported: a C call, no Python frame).

appending.py is the reference: the same steps in the same order (rare branches call the same
Python helpers). It binds what the loop uses in (`bind_append`) and chooses this module whenever
codec.py chose the compiled codec.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from ._codec_speedups cimport MIN_RECORD, _crc32, _encode, _u16, _u32, _u64, _utf8

cdef extern from "Python.h":
    PyObject* PyTuple_GET_ITEM(object t, Py_ssize_t i)  # borrowed

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
