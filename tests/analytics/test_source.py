"""The `gateway` Spark data source (analytics/source.py) against an in-process gateway: batch reads
of telemetry published over MQTT and HTTP CloudEvents, offset options, path filters, and streaming
reads with availableNow, a rate limit, restart from the checkpoint and group commits."""

from __future__ import annotations

import collections
import json

import httpx
import pytest

from analytics.functions import device_id, parse_json_body
from analytics.source import SourceOptions, cap_offsets, commit_last_batch, resolve_offsets, split_ranges
from messaging_processor import ClientContext, Message
from tests.analytics.support import Reading, T, publish_cloudevents, publish_mqtt

T0 = 1_700_000_040  # a minute boundary


def readings(prefix: str, devices: list[str], n: int, start: int = 0) -> list[Reading]:
    return [
        Reading(f"{prefix}/{d}/telemetry", T0 + 5 * i, round(20 + (i * 7 + k) % 11 / 10, 2))
        for i in range(start, start + n)
        for k, d in enumerate(devices)
    ]


def source(spark, gateway, topic: str, **options):
    r = spark.read.format("gateway").option("url", gateway.url).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


@pytest.fixture(scope="module")
def fleet(gateway):
    """Topic `fleet` (4 queues): 3 MQTT devices x 20 readings, 1 HTTP device x 15 CloudEvents."""
    gateway.call(gateway.processor.create_topic("fleet", 4))
    mqtt = readings("fleet", ["d1", "d2", "d3"], 20)
    publish_mqtt(gateway.mqtt_port, mqtt)
    http = readings("fleet", ["h1"], 15)
    publish_cloudevents(gateway.url, "fleet", http)
    return mqtt, http


def test_batch_read_returns_exactly_the_published_messages(spark, gateway, fleet):
    mqtt, http = fleet
    df = source(spark, gateway, "fleet")
    assert df.columns == [
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
    ]
    rows = df.collect()
    assert len(rows) == len(mqtt) + len(http)
    got = collections.Counter((r.path, bytes(r.body)) for r in rows)
    want = collections.Counter([(x.path, x.body()) for x in mqtt]) + collections.Counter(
        (x.path, json.dumps({"ts": x.ts, "value": x.value}, separators=(",", ":")).encode()) for x in http
    )
    assert got == want
    by_origin = collections.Counter("ce.id" in r.properties for r in rows)
    assert by_origin == {False: len(mqtt), True: len(http)}
    for r in rows:
        assert r.topic == "fleet"
        if "ce.id" in r.properties:
            assert r.properties["ce.type"] == "telemetry.reading" and r.properties["ce.subject"] == r.path
        else:
            assert r.properties["mqtt.topic"] == r.path and r.properties["mqtt.qos"] == "1"
    # every queue's offsets are exactly 0..n-1: nothing missing, nothing twice
    per_queue = collections.defaultdict(list)
    for r in rows:
        per_queue[r.queue].append(r.offset)
    queues = httpx.get(f"{gateway.url}/read/topics/fleet/queues", timeout=T).json()["queues"]
    for q in queues:
        assert sorted(per_queue[q["queue_id"]]) == list(range(q["max_offset"]))
    # MQTT ordering: one path's readings are in one queue, in publish order
    d1 = sorted((r.offset, r) for r in rows if r.path == "fleet/d1/telemetry")
    assert len({r.queue for _, r in d1}) == 1
    assert [json.loads(bytes(r.body))["ts"] for _, r in d1] == [x.ts for x in mqtt if x.device == "d1"]


def test_json_helper_and_device_ids(spark, gateway, fleet):
    mqtt, http = fleet
    df = parse_json_body(source(spark, gateway, "fleet"), "ts double, value double")
    df = df.withColumn("device", device_id("path"))
    got = sorted((r.device, r.ts, r.value) for r in df.select("device", "ts", "value").collect())
    assert got == sorted((x.device, x.ts, x.value) for x in mqtt + http)


def test_offset_options_and_path_filter(spark, gateway, fleet):
    mqtt, http = fleet
    queues = {
        q["queue_id"]: q["max_offset"]
        for q in httpx.get(f"{gateway.url}/read/topics/fleet/queues").json()["queues"]
    }
    busy = max(queues, key=queues.get)
    df = source(
        spark,
        gateway,
        "fleet",
        startingOffsets=json.dumps({str(busy): 2}),
        endingOffsets=json.dumps({str(busy): 5}),
    )
    got = sorted((r.queue, r.offset) for r in df.select("queue", "offset").collect())
    others = {q: n for q, n in queues.items() if q != busy}
    assert got == sorted(
        [(busy, o) for o in range(2, 5)] + [(q, o) for q, n in others.items() for o in range(n)]
    )
    assert source(spark, gateway, "fleet", startingOffsets="latest").count() == 0
    assert source(spark, gateway, "fleet", pathFilter="fleet/+/telemetry").count() == len(mqtt) + len(http)
    assert source(spark, gateway, "fleet", pathFilter="fleet/d2/#").count() == 20
    assert source(spark, gateway, "fleet", pathFilter="fleet/h*").count() == len(http)
    assert source(spark, gateway, "fleet", startingTimestamp="4102444800000").count() == 0  # year 2100
    assert source(spark, gateway, "fleet", maxRowsPerPartition="7").rdd.getNumPartitions() > 4
    with pytest.raises(Exception, match="unknown option"):
        source(spark, gateway, "fleet", startingOffset="earliest").count()


def test_compacted_read_returns_one_row_per_key(spark, gateway):
    """A compacted topic read with compacted=latest is a table: the latest value of each key, keys
    whose latest record is a tombstone (empty body) left out, whatever compaction has done yet."""
    made = httpx.post(
        f"{gateway.url}/admin/topics", json={"name": "table1", "queues": 2, "compacted": True}, timeout=T
    )
    assert made.status_code == 201 and made.json()["compacted"] is True, made.text
    latest: dict[str, bytes] = {}
    msgs = []
    for version in range(4):  # keys k0..k5, 4 versions each; one key one queue, as the store places them
        for k in range(6):
            body = b"" if (k, version) in {(3, 3), (4, 1)} else f"k{k}-v{version}".encode()
            msgs.append(Message("table1", body, keys=(f"k{k}",), queue_id=k % 2))
            latest[f"k{k}"] = body
    msgs.append(Message("table1", b"m-v0", properties={"mqtt.topic": "table1/m"}, queue_id=0))
    msgs.append(Message("table1", b"m-v1", properties={"mqtt.topic": "table1/m"}, queue_id=0))
    msgs.append(Message("table1", b"no key", queue_id=1))
    latest["table1/m"] = b"m-v1"
    for m in msgs:  # one by one: several batches and (fetchSize 5) several range requests per queue
        gateway.call(gateway.processor.send(ClientContext("http"), [m]))
    assert latest["k3"] == b"" and latest["k4"] == b"k4-v3"  # k3 deleted; k4 deleted, then set again

    rows = source(spark, gateway, "table1", compacted="latest", fetchSize="5").collect()
    got = {(r["keys"][0] if r["keys"] else r.properties["mqtt.topic"]): bytes(r.body) for r in rows}
    assert len(rows) == len(got)  # one row per key
    assert got == {k: v for k, v in latest.items() if v}
    assert source(spark, gateway, "table1").count() == len(msgs)  # without the option: every record


def test_offset_helpers():
    queues = {0: (0, 10), 1: (5, 8)}

    class NoCalls:
        def __getattr__(self, name):
            raise AssertionError(name)

    c = NoCalls()
    assert resolve_offsets("earliest", c, "t", queues, None, -2) == {0: 0, 1: 5}
    assert resolve_offsets("latest", c, "t", queues, None, -2) == {0: 10, 1: 8}
    assert resolve_offsets('{"0": 3, "1": 1}', c, "t", queues, None, -2) == {0: 3, 1: 5}  # clamped
    assert resolve_offsets('{"1": -1}', c, "t", queues, None, -2) == {0: 0, 1: 8}
    assert resolve_offsets('{"0": 99}', c, "t", queues, None, -1) == {0: 10, 1: 8}
    for bad in ('{"2": 1}', "[1]", "soon", '{"0": -3}'):
        with pytest.raises(ValueError):
            resolve_offsets(bad, c, "t", queues, None, -2)
    assert cap_offsets({0: 0, 1: 0}, {0: 30, 1: 10}, 8) == {0: 6, 1: 2}
    assert cap_offsets({0: 0, 1: 0}, {0: 30, 1: 10}, 100) == {0: 30, 1: 10}
    assert sum(cap_offsets({0: 1, 1: 2, 2: 0}, {0: 8, 1: 9, 2: 7}, 10).values()) - 3 == 10
    assert [(p.queue_id, p.start, p.end) for p in split_ranges({0: 0, 1: 4}, {0: 5, 1: 4}, 2)] == [
        (0, 0, 2),
        (0, 2, 4),
        (0, 4, 5),
    ]
    o = SourceOptions.parse({"Topic": "t", "maxMessagesPerTrigger": "5", "failOnDataLoss": "false"})
    assert (o.topic, o.max_per_trigger, o.fail_on_data_loss) == ("t", 5, False)
    with pytest.raises(ValueError, match="topic"):
        SourceOptions.parse({})


def run_stream(spark, gateway, topic: str, checkpoint: str, **options):
    """An availableNow query over `topic`: the (queue, offset) pairs of each micro-batch with rows,
    and the query."""
    batches: list[list[tuple[int, int]]] = []

    def collect(df, batch_id):
        batches.append(sorted((r.queue, r.offset) for r in df.select("queue", "offset").collect()))

    r = spark.readStream.format("gateway").option("url", gateway.url).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    q = (
        r.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    return [b for b in batches if b], q


def test_stream_rate_limit_restart_and_group_commit(spark, gateway, tmp_path):
    topic = "stream1"
    gateway.call(gateway.processor.create_topic(topic, 3))
    publish_mqtt(gateway.mqtt_port, readings(topic, [f"s{i}" for i in range(5)], 20))  # 100 messages
    cp = str(tmp_path / "cp")
    opts = {"startingOffsets": "earliest", "maxMessagesPerTrigger": "40", "group": "spark-stream"}
    batches, q = run_stream(spark, gateway, topic, cp, **opts)
    assert [len(b) for b in batches] == [40, 40, 20]
    seen = [x for b in batches for x in b]
    assert len(seen) == len(set(seen)) == 100
    maxes = queue_maxes(gateway, topic)
    assert set(seen) == {(q, o) for q, n in maxes.items() for o in range(n)}
    # the source commits a batch when Spark plans the next one: the last batch is not committed yet
    assert committed(gateway, topic) == ends(batches[:2], maxes)
    assert commit_last_batch(q, gateway.url, topic, "spark-stream") == maxes
    assert committed(gateway, topic) == maxes

    # nothing new: a restart reads nothing
    assert run_stream(spark, gateway, topic, cp, **opts)[0] == []
    # 30 more: the restarted query reads exactly those
    publish_mqtt(gateway.mqtt_port, readings(topic, [f"s{i}" for i in range(5)], 6, start=20))
    again, q = run_stream(spark, gateway, topic, cp, **opts)
    new = [x for b in again for x in b]
    assert len(new) == len(set(new)) == 30 and not set(new) & set(seen)
    maxes2 = queue_maxes(gateway, topic)
    assert set(seen) | set(new) == {(q, o) for q, n in maxes2.items() for o in range(n)}
    commit_last_batch(q, gateway.url, topic, "spark-stream")
    assert committed(gateway, topic) == maxes2

    # a new checkpoint with the group starts where the group's offsets are: nothing left
    assert run_stream(spark, gateway, topic, str(tmp_path / "cp2"), group="spark-stream")[0] == []
    # ... and without offsets or group a new query starts at the latest offsets
    assert run_stream(spark, gateway, topic, str(tmp_path / "cp3"))[0] == []


def queue_maxes(gateway, topic: str) -> dict[int, int]:
    out = httpx.get(f"{gateway.url}/read/topics/{topic}/queues", timeout=T).json()["queues"]
    return {q["queue_id"]: q["max_offset"] for q in out}


def committed(gateway, topic: str, group: str = "spark-stream") -> dict[int, int]:
    out = httpx.get(f"{gateway.url}/read/groups/{group}/topics/{topic}/offsets", timeout=T).json()["queues"]
    return {q["queue_id"]: q["offset"] for q in out}


def ends(batches: list[list[tuple[int, int]]], queues: dict[int, int]) -> dict[int, int]:
    """Per queue, the offset after the last one read by `batches` (0: none read)."""
    out = dict.fromkeys(queues, 0)
    for b in batches:
        for q, o in b:
            out[q] = max(out[q], o + 1)
    return out
