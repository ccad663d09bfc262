"""The `gateway` PySpark data source: batch and streaming reads of a gateway topic over the
gateway's HTTP read API (docs/analytics.md).

    spark.dataSource.register(GatewayDataSource)
    df = spark.read.format("gateway").option("url", "http://gw:8082").option("topic", "devices").load()

Each input partition is an offset range `[start, end)` of one queue, read by the executor with one
or more HTTP range requests answered as Arrow record batches. Ranges are replayable: the same range
gives the same rows while the gateway retains them, which is what lets a streaming query restart
from its checkpoint with no loss and no duplicates. Streaming offsets are JSON objects
`{"<queue id>": <next offset>, ...}`. A batch read with `option("compacted", "latest")` reads a
compacted topic as a table: the latest record per key (analytics/compaction.py).

Readers hold only their parsed options (plain data: they are pickled to executors); HTTP clients
are created where they are used.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .client import ReadClient, authorization, default_url

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("analytics.source")

NAME = "gateway"
SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("queue", IntegerType()),
        StructField("offset", LongType()),
        StructField("message_id", StringType()),
        StructField("keys", ArrayType(StringType())),
        StructField("tag", StringType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("body", BinaryType()),
        StructField("path", StringType()),
        StructField("timestamp", TimestampType()),
        StructField("born_timestamp", TimestampType()),
    ]
)
EARLIEST, LATEST = -2, -1  # in JSON offsets, as Spark's Kafka source


def _bool(text: str, name: str) -> bool:
    v = text.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name} must be true or false, not {text!r}")


def _positive(text: str, name: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"option {name} must be an integer, not {text!r}") from None
    if v < 1:
        raise ValueError(f"option {name} must be positive, not {v}")
    return v


def _compacted(text: str) -> bool:
    v = text.strip().lower()
    if v in ("latest", "none"):
        return v == "latest"
    raise ValueError(f"option compacted must be latest or none, not {text!r}")


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed (see docs/analytics.md for each)."""

    url: str
    topic: str
    group: str | None = None
    starting: str | None = None
    ending: str | None = None
    path_filter: str | None = None
    max_per_trigger: int = 0  # 0: everything available
    max_rows_per_partition: int = 500_000
    fetch_rows: int = 500_000
    fail_on_data_loss: bool = True
    commit_offsets: bool = True  # with a group: commit its offsets when a micro-batch commits
    compacted: bool = False  # batch: the latest record per key only (option compacted=latest)
    timeout_s: float = 60.0
    # Authorization header for a gateway with auth on: options token, or user + password, else the
    # driver's GATEWAY_TOKEN / GATEWAY_USER + GATEWAY_PASSWORD (resolved on the driver: executors
    # get the header with the options). Spark redacts options named *password*/*token* in plans.
    auth: str | None = field(default=None, repr=False)

    KNOWN = (
        "url",
        "gateway",
        "topic",
        "group",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "endingtimestamp",
        "pathfilter",
        "maxmessagespertrigger",
        "maxoffsetspertrigger",
        "maxrowsperpartition",
        "fetchsize",
        "failondataloss",
        "commitoffsets",
        "compacted",
        "timeout",
        "user",
        "password",
        "token",
        "path",  # what DataFrameReader.load(path) passes: the topic
    )

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        o = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(o) - set(cls.KNOWN))
        if unknown:
            raise ValueError(f"unknown option(s) of the gateway source: {', '.join(unknown)}")
        topic = o.get("topic") or o.get("path")
        if not topic:
            raise ValueError('the gateway source needs option("topic", ...)')
        starting = o.get("startingoffsets")
        if o.get("startingtimestamp"):
            starting = "timestamp:" + o["startingtimestamp"]
        ending = o.get("endingoffsets")
        if o.get("endingtimestamp"):
            ending = "timestamp:" + o["endingtimestamp"]
        limit = o.get("maxmessagespertrigger") or o.get("maxoffsetspertrigger")
        return cls(
            url=(o.get("url") or o.get("gateway") or default_url()).rstrip("/"),
            topic=topic,
            group=o.get("group") or None,
            starting=starting,
            ending=ending,
            path_filter=o.get("pathfilter") or None,
            max_per_trigger=_positive(limit, "maxMessagesPerTrigger") if limit else 0,
            max_rows_per_partition=_positive(o.get("maxrowsperpartition", "500000"), "maxRowsPerPartition"),
            fetch_rows=_positive(o.get("fetchsize", "500000"), "fetchSize"),
            fail_on_data_loss=_bool(o.get("failondataloss", "true"), "failOnDataLoss"),
            commit_offsets=_bool(o.get("commitoffsets", "true"), "commitOffsets"),
            compacted=_compacted(o.get("compacted", "none")),
            timeout_s=float(o.get("timeout", "60")),
            auth=authorization(o.get("user") or None, o.get("password"), o.get("token") or None),
        )

    def client(self) -> ReadClient:
        return ReadClient(self.url, self.timeout_s, self.auth or "")


# ----------------------------------------------------------------------------- offsets
def parse_timestamp_ms(text: str) -> int:
    """Epoch milliseconds from an integer (ms) or an ISO 8601 time (UTC when it has no offset)."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is neither epoch milliseconds nor an ISO 8601 time") from None
    if dt.tzinfo is None:
        from datetime import UTC

        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def resolve_offsets(
    spec: str,
    client: ReadClient,
    topic: str,
    queues: Mapping[int, tuple[int, int]],
    group: str | None,
    missing: int,
) -> dict[int, int]:
    """Offsets per queue for a startingOffsets / endingOffsets value: `earliest`, `latest`,
    `group` (the group's committed offsets; earliest where it never committed), `timestamp:<ms or
    ISO 8601>` (first offset stored at or after), or JSON `{"<queue>": offset}` with -2 = earliest,
    -1 = latest (queues left out: `missing`, EARLIEST or LATEST). Clamped to what is stored."""
    s = spec.strip()
    low = s.lower()
    if low == "earliest":
        want = dict.fromkeys(queues, EARLIEST)
    elif low == "latest":
        want = dict.fromkeys(queues, LATEST)
    elif low == "group":
        if not group:
            raise ValueError('offsets "group" need option("group", ...)')
        committed = client.committed(group, topic)
        want = {q: committed.get(q, -1) if committed.get(q, -1) >= 0 else EARLIEST for q in queues}
    elif low.startswith("timestamp:"):
        ts = parse_timestamp_ms(s[len("timestamp:") :])
        want = {q: o for q, o in client.offsets_for_timestamp(topic, ts).items() if q in queues}
    else:
        try:
            raw = json.loads(s)
        except ValueError:
            raise ValueError(
                f"offsets must be earliest, latest, group, timestamp:<ms> or JSON, not {spec!r}"
            ) from None
        if not isinstance(raw, dict):
            raise ValueError(f'JSON offsets must be an object like {{"0": 12, "1": -2}}, not {spec!r}')
        want = {}
        for k, v in raw.items():
            try:
                q, off = int(k), int(v)
            except (TypeError, ValueError):
                raise ValueError(f"bad queue offset {k!r}: {v!r} in {spec!r}") from None
            if q not in queues:
                raise ValueError(f"topic {topic} has no queue {q} (offsets {spec!r})")
            if off < EARLIEST:
                raise ValueError(f"bad offset {off} for queue {q}: use >= 0, -2 (earliest) or -1 (latest)")
            want[q] = off
        for q in queues:
            want.setdefault(q, missing)
    out = {}
    for q, off in want.items():
        lo, hi = queues[q]
        out[q] = lo if off == EARLIEST else hi if off == LATEST else min(max(off, lo), hi)
    return out


def encode_offsets(offsets: Mapping[int, int]) -> dict[str, int]:
    """Spark offset JSON: {"<queue id>": offset}."""
    return {str(q): int(o) for q, o in sorted(offsets.items())}


def decode_offsets(offsets: Mapping[str, Any]) -> dict[int, int]:
    """Spark offset JSON (as Spark hands it back) -> {queue id: offset}."""
    return {int(q): int(o) for q, o in offsets.items()}


def cap_offsets(start: Mapping[int, int], end: Mapping[int, int], max_rows: int) -> dict[int, int]:
    """`end` lowered so that at most `max_rows` messages lie between `start` and it, shared among the
    queues in proportion to their backlog (rounding down, the remainder to the largest backlogs;
    deterministic)."""
    begin = {q: start.get(q, e) for q, e in end.items()}
    avail = {q: max(0, e - begin[q]) for q, e in end.items()}
    total = sum(avail.values())
    if total <= max_rows:
        return dict(end)
    share = {q: math.floor(max_rows * a / total) for q, a in avail.items()}
    left = max_rows - sum(share.values())
    for q in sorted(avail, key=lambda q: (-(avail[q] - share[q]), q)):
        if left <= 0:
            break
        if share[q] < avail[q]:
            share[q] += 1
            left -= 1
    return {q: begin[q] + share[q] for q in end}


# ----------------------------------------------------------------------------- partitions and reading
@dataclass
class QueueRange(InputPartition):
    """One input partition: offsets [start, end) of one queue (plain data, pickled to executors)."""

    queue_id: int
    start: int
    end: int


def split_ranges(start: Mapping[int, int], end: Mapping[int, int], max_rows: int) -> list[QueueRange]:
    """Input partitions covering [start, end) per queue, each at most `max_rows` offsets."""
    out = []
    for q in sorted(end):
        s, e = start[q], end[q]
        while s < e:
            out.append(QueueRange(q, s, min(e, s + max_rows)))
            s += max_rows
    return out


_arrow_schema: Any = None


def arrow_schema() -> pa.Schema:
    """The Arrow schema PySpark expects of `read()`'s record batches."""
    global _arrow_schema
    if _arrow_schema is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        _arrow_schema = to_arrow_schema(SCHEMA, timezone="UTC")
    return _arrow_schema


def read_partition(o: SourceOptions, p: QueueRange) -> Iterator[pa.RecordBatch]:
    """Executor side: the partition's rows as Arrow record batches."""
    if not isinstance(p, QueueRange):  # Spark reads one empty InputPartition when there is none
        return
    target = arrow_schema()
    batches = o.client().read_range(
        o.topic,
        p.queue_id,
        p.start,
        p.end,
        path_filter=o.path_filter,
        fetch_rows=o.fetch_rows,
        fail_on_data_loss=o.fail_on_data_loss,
    )
    cast = (batch if batch.schema.equals(target) else batch.cast(target) for batch in batches)
    if o.compacted:  # records of one key share a queue: a queue's latest per key is the topic's
        from .compaction import latest_per_key

        yield from latest_per_key(cast)
    else:
        yield from cast


def _check_schema(schema: StructType) -> None:
    """Refuse a user-specified schema other than SCHEMA (the rows always have SCHEMA's columns)."""
    if schema != SCHEMA and schema.simpleString() != SCHEMA.simpleString():
        raise ValueError(f"the gateway source has a fixed schema: {SCHEMA.simpleString()}")


class GatewayBatchReader(DataSourceReader):
    """Batch reads: startingOffsets (default earliest) to endingOffsets (default latest). With
    `compacted=latest`, one partition per queue (its latest record per key is computed in one
    place)."""

    def __init__(self, options: SourceOptions) -> None:
        self.o = options

    def partitions(self) -> list[QueueRange]:
        c = self.o.client()
        queues = c.queues(self.o.topic)
        start = resolve_offsets(
            self.o.starting or "earliest", c, self.o.topic, queues, self.o.group, EARLIEST
        )
        end = resolve_offsets(self.o.ending or "latest", c, self.o.topic, queues, self.o.group, LATEST)
        end = {q: max(e, start[q]) for q, e in end.items()}
        per_partition = max((e - start[q] for q, e in end.items()), default=1) or 1
        return split_ranges(start, end, per_partition if self.o.compacted else self.o.max_rows_per_partition)

    def read(self, partition: QueueRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        yield from read_partition(self.o, partition)


class GatewayStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reads. Offsets {"<queue>": next offset}; a new query starts at startingOffsets
    (default: the group's committed offsets with a group, else latest); `maxMessagesPerTrigger`
    caps a micro-batch; `commit` stores the group's offsets when a group is set (Spark calls it
    for a batch when it plans the next one: see `commit_last_batch`)."""

    def __init__(self, options: SourceOptions) -> None:
        self.o = options
        self._target: dict[int, int] | None = None  # availableNow: offsets frozen at the start
        self._latest: dict[int, int] | None = None

    def _queues(self) -> dict[int, tuple[int, int]]:
        return self.o.client().queues(self.o.topic)

    def initialOffset(self) -> dict[str, int]:
        c = self.o.client()
        queues = c.queues(self.o.topic)
        spec = self.o.starting or ("group" if self.o.group else "latest")
        return encode_offsets(resolve_offsets(spec, c, self.o.topic, queues, self.o.group, EARLIEST))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.o.max_per_trigger) if self.o.max_per_trigger else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {q: hi for q, (_lo, hi) in self._queues().items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        queues = self._queues()
        begin = decode_offsets(start)
        latest = {q: hi for q, (_lo, hi) in queues.items()}
        self._latest = latest
        end = (
            dict(latest) if self._target is None else {q: min(latest[q], t) for q, t in self._target.items()}
        )
        for q, (lo, _hi) in queues.items():  # a queue added since `start`: read it from its beginning
            begin.setdefault(q, lo)
            end.setdefault(q, begin[q])
        end = {q: max(e, begin[q]) for q, e in end.items()}
        if isinstance(limit, ReadMaxRows):
            end = cap_offsets(begin, end, limit.max_rows)
        return encode_offsets(end)

    def reportLatestOffset(self) -> dict[str, int] | None:
        return encode_offsets(self._latest) if self._latest is not None else None

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[QueueRange]:
        begin, stop = decode_offsets(start), decode_offsets(end)
        new = [q for q in stop if q not in begin]
        if new:
            queues = self._queues()
            for q in new:
                begin[q] = queues[q][0] if q in queues else stop[q]
        return split_ranges(begin, stop, self.o.max_rows_per_partition)

    def read(self, partition: QueueRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        yield from read_partition(self.o, partition)

    def commit(self, end: dict[str, int]) -> None:
        if self.o.group and self.o.commit_offsets:
            try:
                self.o.client().commit(self.o.group, self.o.topic, decode_offsets(end))
            except Exception as e:  # noqa: BLE001 - progress is in the checkpoint; the next commit catches up
                log.warning("could not commit offsets of group %s on %s: %s", self.o.group, self.o.topic, e)

    def stop(self) -> None:
        """Nothing to release: no connection outlives a call."""
        return None


def commit_last_batch(query: Any, url: str, topic: str, group: str) -> dict[int, int] | None:
    """Commit `group`'s offsets to the end of `query`'s last completed micro-batch; returns them
    (None when the query completed no batch or did not read `topic` with this source).

    Spark tells a source that a micro-batch is done (`commit`) only when it plans the next one, so
    the offsets committed by the source trail the query by one micro-batch; call this after the
    query stopped (e.g. after an availableNow run) to commit the rest."""
    p = query.lastProgress
    if not p:
        return None
    for src in p.get("sources") or []:
        end = src.get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        if isinstance(end, dict) and end and all(str(k).isdigit() for k in end):
            return ReadClient(url).commit(group, topic, decode_offsets(end))
    return None


class GatewayDataSource(DataSource):
    """`spark.read.format("gateway")` / `spark.readStream.format("gateway")`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> GatewayBatchReader:
        _check_schema(schema)
        return GatewayBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> GatewayStreamReader:
        _check_schema(schema)
        options = SourceOptions.parse(self.options)
        if options.compacted:
            raise ValueError('option("compacted", "latest") is for batch reads (spark.read)')
        return GatewayStreamReader(options)
