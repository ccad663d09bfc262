"""`gateway analytics telemetry`: per-device windowed statistics and anomaly alerts over a telemetry
topic, as Structured Streaming over the `gateway` source (docs/analytics.md).

Input: messages of `topic` whose body is a JSON object with a numeric metric (`--metric`, default
`value`) and an event time (`--time-field`, default `ts`: epoch seconds or milliseconds, or ISO
8601; the message's born timestamp when absent). The device id is a level of the topic path
(`--device-level`, default 1: `devices/42/telemetry` -> `42`); for messages that did not come
over MQTT the path is the CloudEvents `subject` (see the `path` column of the source).

Two streaming queries read the topic, each with its own checkpoint under `--checkpoint`
(default `<out>/_checkpoints`):

- **windows**: per device and tumbling event-time window (`--window`, default 1 minute) with a
  watermark (`--watermark`, default 30 s): count, avg, min, max and sample stddev of the metric,
  appended to Parquet `<out>/windows` once the watermark passes the window's end (Spark's file
  sink: exactly once across restarts).
- **anomalies**: per device a running mean and variance (Welford) kept in Spark's state store
  (`applyInPandasWithState`, restart-safe); each reading is scored against the state before it
  and flagged when |z| > `--threshold` (default 4) once the device has `--min-samples` (default
  10) readings. Flagged readings are written to Parquet `<out>/anomalies/batch=<id>` (a replayed
  micro-batch overwrites its own directory) and, with `--anomaly-topic`, published back to the
  gateway as CloudEvents (id `<topic>/<queue>/<offset>`, so a replay is recognisable), which MQTT
  subscribers of that topic receive. The state of each device a micro-batch changed (with the next
  offset per queue it includes) is also published to a compacted topic (`--state-topic`, default
  `<group or topic>-state`; key = device id): a job started with an empty checkpoint loads it
  (latest per device, `compacted=latest`) instead of starting from zero, and skips the readings the
  loaded state already includes.

`--once` processes what is stored now (Trigger.AvailableNow) and exits; `--continuous` runs
micro-batches every `--trigger-interval` until Ctrl-C / SIGTERM. With `--group`, the anomaly query
commits the group's offsets after each micro-batch, and a new checkpoint starts from them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.streaming.state import GroupState

_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def interval(text: str) -> str:
    """A Spark interval from `90s`, `1m`, `2h`, `500ms` or Spark's own `1 minute`."""
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)\s*", text)
    if m:
        return f"{m.group(1)} {_UNITS[m.group(2)]}"
    if re.fullmatch(r"\s*\d+\s+[a-zA-Z]+\s*", text):
        return text.strip()
    raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 1m, 2h or '1 minute'")


@dataclass
class TelemetryJob:
    """Settings of one telemetry job (the CLI flags)."""

    topic: str
    gateway: str
    out: str
    checkpoint: str | None = None
    window: str = "1 minute"
    watermark: str = "30 seconds"
    once: bool = True
    trigger_interval: str = "10 seconds"
    anomaly_topic: str | None = None
    threshold: float = 4.0
    min_samples: int = 10
    metric: str = "value"
    time_field: str = "ts"
    device_level: int = 1
    path_filter: str | None = None
    group: str | None = None
    starting_offsets: str | None = None
    max_messages_per_trigger: int | None = None
    state_topic: str | None = None  # None: `<group or topic>-state`
    keep_state: bool = True  # publish the anomaly state to state_topic and restore it from there
    quiet: bool = False
    stats: dict[str, int] = field(default_factory=lambda: {"anomalies": 0, "published": 0, "states": 0})

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint or f"{self.out.rstrip('/')}/_checkpoints"

    @property
    def state_topic_name(self) -> str:
        """The compacted topic holding the per-device anomaly state."""
        return self.state_topic or f"{self.group or self.topic}-state"

    # ------------------------------------------------------------------ inputs
    def _source(self, spark: SparkSession, commit: bool) -> DataFrame:
        r = (
            spark.readStream.format("gateway")
            .option("url", self.gateway)
            .option("topic", self.topic)
            .option("startingOffsets", self.starting_offsets or ("group" if self.group else "earliest"))
        )
        if self.group:
            r = r.option("group", self.group).option("commitOffsets", str(commit).lower())
        if self.path_filter:
            r = r.option("pathFilter", self.path_filter)
        if self.max_messages_per_trigger:
            r = r.option("maxMessagesPerTrigger", str(self.max_messages_per_trigger))
        return r.load()

    def readings(self, raw: DataFrame) -> DataFrame:
        """device_id, path, event_time, value, queue, offset, message_id of parseable readings."""
        from pyspark.sql import functions as F

        from .functions import device_id, event_time, parse_json_body

        t, v = "__t", "__v"
        schema = f"`{self.time_field}` string, `{self.metric}` double"
        parsed = parse_json_body(raw, schema)
        parsed = parsed.withColumnRenamed(self.time_field, t).withColumnRenamed(self.metric, v)
        return parsed.select(
            device_id("path", self.device_level).alias("device_id"),
            "path",
            event_time(t, "born_timestamp").alias("event_time"),
            F.col(v).alias("value"),
            "queue",
            "offset",
            "message_id",
        ).where("device_id IS NOT NULL AND value IS NOT NULL AND event_time IS NOT NULL")

    # ------------------------------------------------------------------ the two queries
    def windows_query(self, spark: SparkSession) -> StreamingQuery:
        """Start the windowed statistics query (Parquet file sink, append mode)."""
        from pyspark.sql import functions as F

        r = self.readings(self._source(spark, commit=False))
        agg = (
            r.withWatermark("event_time", self.watermark)
            .groupBy(F.window("event_time", self.window).alias("w"), "device_id")
            .agg(
                F.count("value").alias("count"),
                F.avg("value").alias("avg"),
                F.min("value").alias("min"),
                F.max("value").alias("max"),
                F.stddev_samp("value").alias("stddev"),
            )
            .select(
                F.col("w.start").alias("window_start"),
                F.col("w.end").alias("window_end"),
                "device_id",
                "count",
                "avg",
                "min",
                "max",
                "stddev",
            )
        )
        w = (
            agg.writeStream.queryName(f"telemetry-windows-{self.topic}")
            .format("parquet")
            .option("path", f"{self.out.rstrip('/')}/windows")
            .option("checkpointLocation", f"{self.checkpoint_dir}/windows")
            .outputMode("append")
        )
        return self._trigger(w).start()

    def anomalies_query(self, spark: SparkSession) -> StreamingQuery:
        """Start the running z-score query (applyInPandasWithState, foreachBatch sink)."""
        from pyspark.sql.streaming.state import GroupStateTimeout

        initial = self.restored_state(spark)
        if initial:
            self._say(f"[anomalies] state of {len(initial)} device(s) restored from {self.state_topic_name}")
        r = self.readings(self._source(spark, commit=True))
        scored = r.groupBy("device_id").applyInPandasWithState(
            _scorer(self.topic, self.threshold, self.min_samples, initial),
            SCORED_SCHEMA,
            STATE_SCHEMA,
            "append",
            GroupStateTimeout.NoTimeout,
        )
        w = (
            scored.writeStream.queryName(f"telemetry-anomalies-{self.topic}")
            .foreachBatch(self._anomaly_batch)
            .option("checkpointLocation", f"{self.checkpoint_dir}/anomalies")
        )
        return self._trigger(w).start()

    def restored_state(self, spark: SparkSession) -> dict[str, DeviceState]:
        """The per-device state to start from: the state topic's latest per device when the anomaly
        checkpoint has no committed micro-batch (a new or deleted checkpoint), else nothing (Spark's
        state store has it)."""
        if not self.keep_state or _has_commits(spark, f"{self.checkpoint_dir}/anomalies"):
            return {}
        from .client import ReadClient

        if ReadClient(self.gateway).topic(self.state_topic_name) is None:
            return {}
        bodies = (
            spark.read.format("gateway")
            .option("url", self.gateway)
            .option("topic", self.state_topic_name)
            .option("compacted", "latest")
            .load()
            .select("body")
            .collect()
        )
        return parse_states(self.topic, (bytes(r.body) for r in bodies))

    def _trigger(self, w: Any) -> Any:
        return w.trigger(availableNow=True) if self.once else w.trigger(processingTime=self.trigger_interval)

    def _anomaly_batch(self, df: DataFrame, batch_id: int) -> None:
        """foreachBatch sink of the anomaly query: the flagged readings, then the state of each
        device the micro-batch changed to the state topic."""
        rows = df.collect()  # flagged readings and one state row per changed device: few
        states = [r.state for r in rows if r.state is not None]
        rows = [r for r in rows if r.state is None]
        if rows:
            self._flagged(df.sparkSession, rows, batch_id)
        if states and self.keep_state:
            from .client import ReadClient

            ReadClient(self.gateway).publish_events(
                self.state_topic_name, [self.state_event(json.loads(s)) for s in states]
            )
            self.stats["states"] += len(states)

    def _flagged(self, spark: SparkSession, rows: list[Any], batch_id: int) -> None:
        """Flagged readings of a micro-batch: Parquet, then the CloudEvents (if configured)."""
        spark.createDataFrame([tuple(r)[:-1] for r in rows], ANOMALY_SCHEMA).write.mode("overwrite").parquet(
            f"{self.out.rstrip('/')}/anomalies/batch={batch_id}"
        )
        self.stats["anomalies"] += len(rows)
        if self.anomaly_topic:
            from .client import ReadClient

            ReadClient(self.gateway).publish_events(
                self.anomaly_topic, [self.event(r.asDict()) for r in rows]
            )
            self.stats["published"] += len(rows)
        self._say(
            f"[anomalies] batch {batch_id}: {len(rows)} flagged"
            + (f", published to {self.anomaly_topic}" if self.anomaly_topic else "")
        )

    def event(self, a: dict[str, Any]) -> dict[str, Any]:
        """The CloudEvent of one flagged reading."""
        t: datetime = a["event_time"]
        if t.tzinfo is None:
            t = t.replace(tzinfo=UTC)
        return {
            "specversion": "1.0",
            "id": f"{self.topic}/{a['queue']}/{a['offset']}",
            "source": f"/gateway/analytics/telemetry/{self.topic}",
            "type": "gateway.analytics.anomaly",
            "subject": a["path"],
            "time": t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
            "datacontenttype": "application/json",
            "data": {
                "device_id": a["device_id"],
                "path": a["path"],
                "event_time": t.astimezone(UTC).isoformat(),
                "value": a["value"],
                "z": a["z"],
                "mean": a["mean"],
                "stddev": a["stddev"],
                "n": a["n"],
                "threshold": self.threshold,
                "message_id": a["message_id"],
            },
        }

    def state_event(self, state: dict[str, Any]) -> dict[str, Any]:
        """The CloudEvent carrying one device's state to the state topic: the CloudEvents
        partitioning extension `partitionkey` is the device id (the compaction key)."""
        device = state["device_id"]
        return {
            "specversion": "1.0",
            "id": f"{self.topic}/{device}/{state['n']}",
            "source": f"/gateway/analytics/telemetry/{self.topic}",
            "type": "gateway.analytics.telemetry.state",
            "subject": f"{self.state_topic_name}/{device}",
            "partitionkey": device,
            "datacontenttype": "application/json",
            "data": state,
        }

    # ------------------------------------------------------------------ running
    def _say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    def run(self, spark: SparkSession, stop: threading.Event | None = None) -> int:
        """Run both queries (until done with --once, else until `stop` is set); 0 when they
        ended cleanly, 1 when one failed."""
        from .client import ReadClient

        if self.anomaly_topic:
            ReadClient(self.gateway).ensure_topic(self.anomaly_topic)
        if self.keep_state:
            # one queue: CloudEvents carry no store key, so the gateway does not place a device's
            # records in one queue by key; with one queue its latest record is well defined
            t = ReadClient(self.gateway).ensure_topic(self.state_topic_name, compacted=True, queues=1)
            if not t.get("compacted"):
                print(
                    f"gateway analytics: state topic {self.state_topic_name} is not compacted: it keeps "
                    "every state record (create it with --compacted)",
                    file=sys.stderr,
                )
        mode = "once (availableNow)" if self.once else f"continuous, every {self.trigger_interval}"
        self._say(
            f"telemetry job on {self.gateway} topic {self.topic}: window {self.window}, watermark "
            f"{self.watermark}, |z| > {self.threshold}; {mode}; output {self.out}"
        )
        queries = [self.windows_query(spark), self.anomalies_query(spark)]
        names = {id(queries[0]): "windows", id(queries[1]): "anomalies"}
        seen = {id(q): 0 for q in queries}
        stop = stop or threading.Event()
        failed = False
        try:
            while True:
                for q in queries:
                    for p in _new_progress(q, seen):
                        self._say(_progress_line(names[id(q)], p))
                if not any(q.isActive for q in queries):
                    break
                if stop.wait(0.5):
                    for q in queries:
                        q.stop()
        finally:
            for q in queries:
                if q.isActive:
                    q.stop()
        for q in queries:
            for p in _new_progress(q, seen):
                self._say(_progress_line(names[id(q)], p))
            err = q.exception()
            if err is not None:
                failed = True
                print(f"gateway analytics: the {names[id(q)]} query failed: {err}", file=sys.stderr)
        if self.group and queries[1].exception() is None:
            from .source import commit_last_batch

            # the source commits a batch only when the next one is planned: commit the last one too
            done = commit_last_batch(queries[1], self.gateway, self.topic, self.group)
            if done is not None:
                self._say(f"group {self.group} committed at {done}")
        self._say(
            f"done: {self.stats['anomalies']} anomalies flagged"
            + (f", {self.stats['published']} published to {self.anomaly_topic}" if self.anomaly_topic else "")
        )
        return 1 if failed else 0


ANOMALY_SCHEMA = (
    "device_id string, path string, event_time timestamp, value double, z double, mean double, "
    "stddev double, n long, queue int, offset long, message_id string"
)
# What the scorer emits: flagged readings (state null) and, per device it changed, one row with the
# state as JSON (its other columns: the device's last reading of the micro-batch).
SCORED_SCHEMA = ANOMALY_SCHEMA + ", state string"
# Spark's state per device: Welford's n, mean, M2, and {"<queue>": next offset} of the readings included.
STATE_SCHEMA = "n long, mean double, m2 double, offsets string"
DeviceState = tuple[int, float, float, str]  # a STATE_SCHEMA row


def parse_states(topic: str, bodies: Iterable[bytes]) -> dict[str, DeviceState]:
    """Device id -> state from state-topic bodies (JSON of `_state_json`) of the job on `topic`; when
    a device has several (a topic not compacted yet, or one read across queues) the one with most
    readings wins. Bodies of other topics' jobs or that do not parse are ignored."""
    out: dict[str, DeviceState] = {}
    for body in bodies:
        try:
            s = json.loads(body)
            if s.get("topic") != topic:
                continue
            state = (int(s["n"]), float(s["mean"]), float(s["m2"]), json.dumps(s.get("offsets") or {}))
            device = str(s["device_id"])
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
        if device not in out or state[0] > out[device][0]:
            out[device] = state
    return out


def _state_json(topic: str, device: str, n: int, mean: float, m2: float, offsets: dict[int, int]) -> str:
    """The body of a state-topic record (and the `state` column of the scorer's state rows)."""
    return json.dumps(
        {
            "device_id": device,
            "topic": topic,
            "n": n,
            "mean": mean,
            "m2": m2,
            "offsets": {str(q): o for q, o in sorted(offsets.items())},
        }
    )


def _has_commits(spark: SparkSession, checkpoint: str) -> bool:
    """Whether the streaming checkpoint at `checkpoint` has a committed micro-batch (on any file
    system Spark's Hadoop configuration reaches; the local file system without a JVM gateway)."""
    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
        path = jvm.org.apache.hadoop.fs.Path(f"{checkpoint}/commits")
        fs = path.getFileSystem(spark._jsc.hadoopConfiguration())  # type: ignore[attr-defined]
        if not fs.exists(path):
            return False
        return any(not st.getPath().getName().startswith(".") for st in fs.listStatus(path))
    except AttributeError:  # Spark Connect: no JVM here
        commits = os.path.join(checkpoint.removeprefix("file:"), "commits")
        return os.path.isdir(commits) and any(not n.startswith(".") for n in os.listdir(commits))


def _scorer(topic: str, threshold: float, min_samples: int, initial: dict[str, DeviceState]) -> Any:
    """The applyInPandasWithState function: running z-score per device (plain values only, so that
    it pickles to executors). A device without Spark state starts from `initial` (restored from the
    state topic) and skips readings at offsets that state already includes."""

    def score(key: tuple[str], pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        import pandas as pd

        device = key[0]
        n, mean, m2, offsets = state.get if state.exists else initial.get(device, (0, 0.0, 0.0, "{}"))
        frames = [p for p in pdfs if len(p)]
        if not frames:
            return
        included = {int(q): int(o) for q, o in json.loads(offsets).items()}
        nxt = dict(included)
        pdf = pd.concat(frames).sort_values(["event_time", "queue", "offset"], kind="stable")
        out = []
        last = None
        for row in pdf.itertuples(index=False):
            q, off = int(row.queue), int(row.offset)
            if off < included.get(q, 0):
                continue  # already in the restored state
            last = row
            nxt[q] = max(nxt.get(q, 0), off + 1)
            x = float(row.value)
            if n >= min_samples and n > 1:
                std = math.sqrt(m2 / (n - 1))
                if std > 0:
                    z = (x - mean) / std
                    if abs(z) > threshold:
                        out.append(
                            (
                                row.device_id,
                                row.path,
                                row.event_time,
                                x,
                                z,
                                mean,
                                std,
                                n,
                                row.queue,
                                row.offset,
                                row.message_id,
                                None,
                            )
                        )
            n += 1
            d = x - mean
            mean += d / n
            m2 += d * (x - mean)
        state.update((n, mean, m2, json.dumps({str(q): o for q, o in sorted(nxt.items())})))
        if last is not None:
            std = math.sqrt(m2 / (n - 1)) if n > 1 else 0.0
            out.append(
                (
                    device,
                    last.path,
                    last.event_time,
                    float(last.value),
                    0.0,
                    mean,
                    std,
                    n,
                    last.queue,
                    last.offset,
                    last.message_id,
                    _state_json(topic, device, n, mean, m2, nxt),
                )
            )
        cols = [
            "device_id",
            "path",
            "event_time",
            "value",
            "z",
            "mean",
            "stddev",
            "n",
            "queue",
            "offset",
            "message_id",
            "state",
        ]
        yield pd.DataFrame(out, columns=cols)

    return score


def _new_progress(q: StreamingQuery, seen: dict[int, int]) -> list[dict[str, Any]]:
    """Progress reports of `q` not printed yet (recentProgress keeps the last 100)."""
    out = []
    for p in q.recentProgress:
        if p["batchId"] >= seen[id(q)] and p["numInputRows"] >= 0:
            out.append(p)
    if out:
        seen[id(q)] = out[-1]["batchId"] + 1
    return out


def _progress_line(name: str, p: dict[str, Any]) -> str:
    rate = p.get("processedRowsPerSecond") or 0.0
    parts = [f"[{name}] batch {p['batchId']}: {p['numInputRows']} rows", f"{rate:,.0f} rows/s"]
    wm = (p.get("eventTime") or {}).get("watermark")
    if wm:
        parts.append(f"watermark {wm}")
    ops = p.get("stateOperators") or []
    if ops:
        parts.append(f"state rows {ops[0].get('numRowsTotal', 0)}")
    return ", ".join(parts)


def main(job: TelemetryJob, master: str | None = None, conf: dict[str, str] | None = None) -> int:
    """Run `job` on the active SparkSession, or a new one (`master`, default local[*]) that is
    stopped at the end. SIGTERM/SIGINT stop a continuous job cleanly."""
    from pyspark.sql import SparkSession

    from .session import spark_session

    own = SparkSession.getActiveSession() is None
    spark = spark_session("gateway-analytics-telemetry", master, conf)
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        return job.run(spark, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if own:
            spark.stop()


__all__ = ["ANOMALY_SCHEMA", "STATE_SCHEMA", "TelemetryJob", "interval", "main", "parse_states"]
