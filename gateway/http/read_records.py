"""Replayable range reads of one queue for the read API (`read_api.py`): rows as Arrow record batches.

A range `[start, end)` of a queue is read in chunks of up to `CHUNK_ROWS` rows (and about
`CHUNK_BYTES` of records). Each chunk becomes one Arrow record batch with `WIRE_SCHEMA`, which the
endpoint sends as an Arrow IPC stream or renders as JSON lines.

Two ways to get the rows:

- **Raw range reads (LOCAL mode), the fast path.** `processor.read_raw` gives the records' bytes
  (store/raw_range.py: one `pread` per span of neighbouring records), decoded here column-wise
  with numpy and pyarrow (the record layout of `store/codec.py`, docs/store.md) instead of one
  `Message` object per record, which is what makes the Spark source keep up with Spark's own file
  readers. Every record is checked as `Store.read` checks it (length, magic, queue id and offset,
  CRC32); a record that does not check out is skipped and logged.
- **A StoreClient without raw reads** (CLUSTER mode: `read_raw` answers None): `processor.read`
  (Message objects), converted row by row.

Both give the same rows (`tests/analytics/test_read_api.py` compares them). Decoding runs in a
worker thread; consume queue and commit log reads stay on the event loop, like `Store.read`'s.

The `path` column is the message's topic path: the MQTT topic (`mqtt.topic`), else the CloudEvents
`subject` (`ce.subject`), else `<topic>/<tag>` (`<topic>` without a tag), the path under which
MQTT subscribers see a message from another protocol. `PathFilter` selects rows by it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from messaging_processor import ClientContext, MessagingProcessor
from messaging_processor.properties import P_CE_SUBJECT, P_PATH
from messaging_processor.trace_context import GATEWAY_TRACEPARENT
from store import codec

if TYPE_CHECKING:  # pyarrow and numpy are imported on first use: the gateway starts without them
    import numpy as np
    import pyarrow as pa

    from store import Message

log = logging.getLogger("gateway.read")

CHUNK_ROWS = 4096  # rows per record batch
CHUNK_BYTES = 16 * 1024 * 1024  # about this many record bytes per batch (at least one record)
# batches up to this size are decoded on the event loop (under a millisecond), bigger ones in a
# thread: a thread's decoding holds the GIL the loop then waits for, up to the 5 ms switch interval
INLINE_DECODE_BYTES = 512 * 1024
ARROW_STREAM = "application/vnd.apache.arrow.stream"
NDJSON = "application/x-ndjson"
# Store-internal properties of redirected (delayed / half) messages and a trace context the gateway
# made (never the client's), never shown to readers.
_INTERNAL_PROPS = frozenset(("__REAL_TOPIC", "__REAL_QID", "TRANSACTION_CHECK_TIMES", GATEWAY_TRACEPARENT))
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC end-of-stream marker

COLUMNS = (
    "topic",
    "queue",
    "offset",
    "message_id",
    "keys",
    "tag",
    "properties",
    "body",
    "path",
    "timestamp",
    "born_timestamp",
)


def wire_schema() -> pa.Schema:
    """The rows' Arrow schema: exactly what PySpark expects for the Spark source's schema."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            ("topic", pa.string()),
            ("queue", pa.int32()),
            ("offset", pa.int64()),
            ("message_id", pa.string()),
            ("keys", pa.list_(pa.field("element", pa.string()))),
            ("tag", pa.string()),
            ("properties", pa.map_(pa.string(), pa.string())),
            ("body", pa.binary()),
            ("path", pa.string()),
            ("timestamp", ts),
            ("born_timestamp", ts),
        ]
    )


def path_of(topic: str, tag: str, props: dict[str, str]) -> str:
    """A message's topic path (see the module docstring)."""
    p = props.get(P_PATH) or props.get(P_CE_SUBJECT)
    if p:
        return p
    return f"{topic}/{tag}" if tag else topic


# ----------------------------------------------------------------------------- path filters
_RE_META = frozenset(".^$*+?()[]{}|\\")


def _escape(text: str) -> str:
    # Only the metacharacters: the pattern must mean the same to Python `re` and to RE2 (pyarrow).
    return "".join("\\" + c if c in _RE_META else c for c in text)


@dataclass(frozen=True, slots=True)
class PathFilter:
    """Selects messages by topic path: an MQTT topic filter (`devices/+/telemetry`, `devices/#`) or,
    when the text contains `*`, `?` or `[`, a glob (`devices/*/telemetry`; `*` also crosses `/`)."""

    text: str
    pattern: str  # anchored regular expression, same meaning in Python `re` and RE2
    skip_dollar: bool  # MQTT: a filter starting with a wildcard does not match `$...` paths

    @classmethod
    def parse(cls, text: str) -> PathFilter:
        """Compile `text`; ValueError when it is not a valid MQTT filter or glob."""
        if not text:
            raise ValueError("the path filter is empty")
        if any(c in text for c in "*?["):
            return cls(text, "(?s)^" + _glob_regex(text) + "$", False)
        levels = text.split("/")
        out: list[str] = []
        for i, level in enumerate(levels):
            if level == "#":
                if i != len(levels) - 1:
                    raise ValueError(f"'#' must be the last level of the filter {text!r}")
                # `a/#` also matches `a` itself (MQTT 4.7.1.2); `#` alone matches everything
                return cls(text, "(?s)^" + ("/".join(out) + "(/.*)?" if out else ".*") + "$", i == 0)
            if level == "+":
                out.append("[^/]*")
            elif "+" in level or "#" in level:
                raise ValueError(f"a wildcard must fill a whole level of the filter {text!r}")
            else:
                out.append(_escape(level))
        return cls(text, "(?s)^" + "/".join(out) + "$", levels[0] == "+")

    def matches(self, path: str) -> bool:
        import re

        if self.skip_dollar and path.startswith("$"):
            return False
        return re.match(self.pattern, path) is not None

    def mask(self, paths: pa.Array) -> pa.Array:
        """Boolean mask over a string array of paths."""
        import pyarrow.compute as pc

        m = pc.match_substring_regex(paths, self.pattern)
        if self.skip_dollar:
            m = pc.and_(m, pc.invert(pc.starts_with(paths, "$")))
        return m


def _glob_regex(text: str) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i + 1 if i < n and text[i] in "!^" else i
            if j < n and text[j] == "]":
                j += 1
            j = text.find("]", j)
            if j < 0:  # no closing bracket: a literal "["
                out.append("\\[")
                continue
            body = text[i:j]
            i = j + 1
            neg = body[:1] in ("!", "^")
            if neg:
                body = body[1:]
            body = body.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
            out.append("[" + ("^" if neg else "") + body + "]")
        else:
            out.append(_escape(c))
    return "".join(out)


# ----------------------------------------------------------------------------- Arrow from messages
def messages_to_batch(msgs: Sequence[Message]) -> pa.RecordBatch:
    """Rows of Message objects (the generic path; also the reference for the fast decoder)."""
    import pyarrow as pa

    props = [{k: v for k, v in m.properties.items() if k not in _INTERNAL_PROPS} for m in msgs]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.topic for m in msgs], pa.string()),
            pa.array([m.queue_id for m in msgs], pa.int32()),
            pa.array([m.queue_offset for m in msgs], pa.int64()),
            pa.array([m.message_id for m in msgs], pa.string()),
            pa.array([list(m.keys) for m in msgs], pa.list_(pa.field("element", pa.string()))),
            pa.array([m.tag for m in msgs], pa.string()),
            pa.array([list(p.items()) for p in props], pa.map_(pa.string(), pa.string())),
            pa.array([m.body for m in msgs], pa.binary()),
            pa.array([path_of(m.topic, m.tag, p) for m, p in zip(msgs, props, strict=True)], pa.string()),
            pa.array([m.store_timestamp * 1000 for m in msgs], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array([m.born_timestamp * 1000 for m in msgs], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        ],
        schema=wire_schema(),
    )


# ----------------------------------------------------------------------------- column-wise decoder
_HEAD_FIELDS = [
    ("size", "<u4"),
    ("crc", "<u4"),
    ("magic", "u1"),
    ("mtype", "u1"),
    ("flags", "<u2"),
    ("qid", "<i4"),
    ("qoff", "<i8"),
    ("sts", "<i8"),
    ("bts", "<i8"),
    ("deliver_at", "<i8"),
    ("lt", "<u2"),
    ("lg", "<u2"),
    ("lk", "<u2"),
    ("lgr", "<u2"),
    ("lm", "<u2"),
    ("lh", "<u2"),
    ("lp", "<u4"),
    ("lb", "<u4"),
]
_LENGTHS = ("lt", "lg", "lk", "lgr", "lm", "lh", "lp", "lb")  # in record order
_head: Any = None


def _head_dtype() -> np.dtype:
    global _head
    if _head is None:
        import numpy as np

        dt = np.dtype(_HEAD_FIELDS)
        if dt.itemsize != codec.HEADER_SIZE or codec.PREFIX.size + codec.HEAD.size != dt.itemsize:
            raise RuntimeError("the record header layout changed: update gateway/http/read_records.py")
        _head = dt
    return _head


def _gather(buf: pa.Buffer, starts: np.ndarray, lengths: np.ndarray, typ: pa.DataType) -> pa.Array:
    """The byte strings buf[starts[i] : starts[i] + lengths[i]] (increasing, non-overlapping) as one
    compact array: a 2n-element array over `buf` whose odd elements are the strings, then `take`."""
    import numpy as np
    import pyarrow as pa

    n = len(starts)
    offsets = np.empty(2 * n + 1, dtype=np.int32)
    offsets[0] = 0
    offsets[1::2] = starts
    offsets[2::2] = starts + lengths
    spread = pa.Array.from_buffers(typ, 2 * n, [None, pa.py_buffer(offsets), buf])
    return spread.take(pa.array(np.arange(1, 2 * n, 2, dtype=np.int32)))


def _keys_column(raw: pa.Array) -> pa.Array:
    import pyarrow as pa

    enc = raw.dictionary_encode()
    uniq = [v.decode().split(codec.KEY_SEP) if v else [] for v in enc.dictionary.to_pylist()]
    return pa.array(uniq, pa.list_(pa.field("element", pa.string()))).take(enc.indices)


def _props_and_paths(raw: pa.Array, flags: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """(map column, path from the properties or null) of raw encoded property blocks, with each
    row's record flags (which say how its block is encoded: see store/codec.py)."""
    import numpy as np
    import pyarrow as pa

    enc = raw.dictionary_encode()
    blocks = enc.dictionary.to_pylist()
    # Each distinct (block, encoding) is decoded once: index i + n*json into a virtual dictionary.
    json_rows = (flags & codec.FLAG_JSON_PROPERTIES) != 0
    virtual = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64) + len(blocks) * json_rows
    used, idx = np.unique(virtual, return_inverse=True)
    maps, paths = [], []
    for u in used.tolist():
        v = blocks[u % len(blocks)]
        p = codec.decode_properties(v, codec.FLAG_JSON_PROPERTIES if u >= len(blocks) else 0) if v else {}
        maps.append([(k, x) for k, x in p.items() if k not in _INTERNAL_PROPS])
        paths.append(p.get(P_PATH) or p.get(P_CE_SUBJECT) or None)
    take = pa.array(idx.astype(np.int32))
    return (
        pa.array(maps, pa.map_(pa.string(), pa.string())).take(take),
        pa.array(paths, pa.string()).take(take),
    )


def decode_records(
    raw: bytes, starts: np.ndarray, sizes: np.ndarray, queue_id: int, offsets: np.ndarray
) -> pa.RecordBatch:
    """Rows of the records at `starts` (increasing) in `raw`, which the consume queue lists with
    `sizes` at queue `offsets`. Records that do not check out are left out (and logged)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    dt = _head_dtype()
    hs = dt.itemsize
    n = len(starts)
    ok = (sizes >= hs) & (starts + sizes <= len(raw))
    if len(raw) < hs:
        ok[:] = False
    if len(raw) >= hs:  # the headers, copied out of `raw` row by row (a view of every hs-byte window)
        windows = np.lib.stride_tricks.sliding_window_view(np.frombuffer(raw, dtype=np.uint8), hs)
        hdr = windows[np.where(ok, starts, 0)].view(dt).reshape(n)
    else:
        hdr = np.zeros(n, dt)
    total = np.full(n, hs, dtype=np.int64)
    for f in _LENGTHS:
        total += hdr[f]
    ok &= (
        (hdr["magic"] == codec.MAGIC_MESSAGE)
        & (hdr["size"] == sizes)
        & (hdr["qid"] == queue_id)
        & (hdr["qoff"] == offsets)
        & (total == sizes)
    )
    mv = memoryview(raw)
    crcs = hdr["crc"].tolist()
    for i, s, z in zip(np.flatnonzero(ok).tolist(), starts[ok].tolist(), sizes[ok].tolist(), strict=True):
        if zlib.crc32(mv[s + 8 : s + z]) != crcs[i]:
            ok[i] = False
    if not ok.all():
        bad = np.flatnonzero(~ok & (sizes > 0))  # (size 0: a record compaction removed, not an error)
        if len(bad):
            log.error(
                "skipping %d unreadable record(s) of queue %d (first at offset %d)",
                len(bad),
                queue_id,
                int(offsets[bad[0]]),
            )
        hdr, starts = hdr[ok], starts[ok]
    buf = pa.py_buffer(raw)
    pos = starts.astype(np.int64) + hs
    cols: dict[str, pa.Array] = {}
    for name, f, typ in (
        ("topic", "lt", pa.string()),
        ("tag", "lg", pa.string()),
        ("keys", "lk", pa.binary()),
        ("group", "lgr", None),
        ("message_id", "lm", pa.string()),
        ("host", "lh", None),
        ("properties", "lp", pa.binary()),
        ("body", "lb", pa.binary()),
    ):
        lengths = hdr[f].astype(np.int64)
        if typ is not None:
            cols[name] = _gather(buf, pos, lengths, typ)
        pos = pos + lengths
    props, path = _props_and_paths(cols["properties"], hdr["flags"])
    topic, tag = cols["topic"], cols["tag"]
    if path.null_count:
        fallback = pc.if_else(pc.equal(tag, ""), topic, pc.binary_join_element_wise(topic, tag, "/"))
        path = pc.coalesce(path, fallback)
    ts = pa.timestamp("us", tz="UTC")
    return pa.RecordBatch.from_arrays(
        [
            topic,
            pa.array(hdr["qid"].astype(np.int32)),
            pa.array(hdr["qoff"].astype(np.int64)),
            cols["message_id"],
            _keys_column(cols["keys"]),
            tag,
            props,
            cols["body"],
            path,
            pa.array(hdr["sts"].astype(np.int64) * 1000).cast(ts),
            pa.array(hdr["bts"].astype(np.int64) * 1000).cast(ts),
        ],
        schema=wire_schema(),
    )


# ----------------------------------------------------------------------------- reading a range
_arrow_imported = False


def _import_arrow() -> None:
    import numpy as np
    import pyarrow as pa

    # what a first decode imports lazily: `take` the compute kernels, `pa.array` pandas (when it is
    # installed: pyarrow checks whether its argument is a pandas object)
    pa.array(np.arange(2, dtype=np.int32)).take(pa.array(np.zeros(1, dtype=np.int32)))


async def arrow_imported() -> None:
    """Import numpy, pyarrow and what it loads on first use once, in a thread: done by the first
    read on the loop, those imports (about a second) held up every live delivery meanwhile."""
    global _arrow_imported
    if not _arrow_imported:
        await asyncio.to_thread(_import_arrow)
        _arrow_imported = True


async def iter_batches(
    processor: MessagingProcessor,
    ctx: ClientContext,
    topic: str,
    queue_id: int,
    start: int,
    end: int,
    path_filter: PathFilter | None = None,
) -> AsyncIterator[pa.RecordBatch]:
    """Record batches of the queue's messages with offsets in [start, end) that are still stored."""
    await arrow_imported()
    import numpy as np

    off = start
    raw_reads = True  # until the StoreClient says it has none (CLUSTER mode)
    while off < end:
        raw = None
        if raw_reads:
            raw = await processor.read_raw(ctx, topic, queue_id, off, end, CHUNK_ROWS, CHUNK_BYTES)
            raw_reads = raw is not None
            if raw is not None and not len(raw):
                return
        if raw is None:
            msgs = await processor.read(ctx, topic, queue_id, off, end, min(CHUNK_ROWS, end - off))
            if not msgs:
                return
            off = msgs[-1].queue_offset + 1
            batch = messages_to_batch(msgs)
        else:
            offsets = np.arange(raw.first, raw.first + len(raw), dtype=np.int64)
            off = raw.first + len(raw)
            readable = raw.starts >= 0
            if not readable.all():
                log.error(
                    "skipping %d record(s) of %s/%d no longer stored", int((~readable).sum()), topic, queue_id
                )
            args = (raw.data, raw.starts[readable], raw.sizes[readable], queue_id, offsets[readable])
            if len(raw.data) <= INLINE_DECODE_BYTES:  # (a cold read's small step: store/cold_reads.py)
                batch = decode_records(*args)
                await asyncio.sleep(0)
            else:
                batch = await asyncio.to_thread(decode_records, *args)
            processor.metrics.messages_out[(ctx.protocol, topic)] += batch.num_rows
        if path_filter is not None and batch.num_rows:
            batch = batch.filter(path_filter.mask(batch.column(8)))
        yield batch


# ----------------------------------------------------------------------------- encodings
def arrow_schema_message() -> bytes:
    """The IPC stream's first message (the schema)."""
    return wire_schema().serialize().to_pybytes()


def arrow_batch_message(batch: pa.RecordBatch) -> bytes:
    return batch.serialize().to_pybytes()


def arrow_end() -> bytes:
    return _EOS


def batch_to_jsonl(batch: pa.RecordBatch) -> bytes:
    """JSON lines: one object per row; `body` base64, timestamps as epoch milliseconds."""
    cols = batch.to_pydict()
    out = []
    ts = [c.cast("int64").to_pylist() for c in (batch.column(9), batch.column(10))]
    for i in range(batch.num_rows):
        out.append(
            json.dumps(
                {
                    "topic": cols["topic"][i],
                    "queue": cols["queue"][i],
                    "offset": cols["offset"][i],
                    "message_id": cols["message_id"][i],
                    "keys": cols["keys"][i],
                    "tag": cols["tag"][i],
                    "properties": dict(cols["properties"][i]),
                    "body": base64.b64encode(cols["body"][i]).decode(),
                    "path": cols["path"][i],
                    "timestamp": ts[0][i] // 1000,
                    "born_timestamp": ts[1][i] // 1000,
                },
                separators=(",", ":"),
                ensure_ascii=False,
            )
        )
    return ("\n".join(out) + "\n").encode() if out else b""
