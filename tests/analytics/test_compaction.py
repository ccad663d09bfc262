"""analytics/compaction.py without Spark: the latest record per key of one queue, folded over
several batches, with keys from `keys[0]`, `mqtt.topic` or `ce.partitionkey`, tombstones and
keyless records; the telemetry job's reading of state-topic bodies."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from analytics.compaction import latest_per_key, record_keys
from analytics.source import SCHEMA, GatewayDataSource, SourceOptions, arrow_schema
from analytics.telemetry import parse_states


def batch(rows: list[tuple[int, list[str], dict[str, str], bytes]]) -> pa.RecordBatch:
    """A batch of the source's schema from (offset, keys, properties, body) rows."""
    n = len(rows)
    cols = {
        "topic": ["t"] * n,
        "queue": [0] * n,
        "offset": [r[0] for r in rows],
        "message_id": [f"m{r[0]}" for r in rows],
        "keys": [r[1] for r in rows],
        "tag": [""] * n,
        "properties": [list(r[2].items()) for r in rows],
        "body": [r[3] for r in rows],
        "path": [None] * n,
        "timestamp": [0] * n,
        "born_timestamp": [0] * n,
    }
    schema = arrow_schema()
    return pa.RecordBatch.from_arrays([pa.array(cols[f.name], f.type) for f in schema], schema=schema)


def test_record_keys_prefer_keys_then_mqtt_topic_then_partitionkey():
    b = batch([
        (0, ["k", "other"], {"mqtt.topic": "t/x"}, b"1"),
        (1, [], {"mqtt.topic": "t/x", "ce.partitionkey": "p"}, b"1"),
        (2, [], {"ce.partitionkey": "p"}, b"1"),
        (3, [], {"ce.subject": "t/s"}, b"1"),
    ])  # fmt: skip
    assert record_keys(b).to_pylist() == ["k", "t/x", "p", None]


def test_latest_per_key_across_batches_with_tombstones():
    first = batch([
        (0, ["a"], {}, b"a1"),
        (1, ["b"], {}, b"b1"),
        (2, [], {"mqtt.topic": "t/m"}, b"m1"),
        (3, [], {}, b"no key"),
        (4, ["c"], {}, b"c1"),
    ])  # fmt: skip
    second = batch([
        (5, ["a"], {}, b"a2"),
        (6, ["b"], {}, b""),  # tombstone: b is deleted
        (7, ["c"], {}, b""),
        (8, [], {"ce.partitionkey": "p"}, b"p1"),
    ])  # fmt: skip
    third = batch([(9, ["c"], {}, b"c2"), (10, ["a"], {}, b"a3")])  # c set again after its tombstone
    out = pa.Table.from_batches(list(latest_per_key([first, second, third])), schema=arrow_schema())
    got = list(zip(out.column("offset").to_pylist(), out.column("body").to_pylist(), strict=True))
    assert got == [(2, b"m1"), (8, b"p1"), (9, b"c2"), (10, b"a3")]  # offset order, one per key
    assert out.schema == arrow_schema()
    assert list(latest_per_key([batch([(0, ["a"], {}, b"")])])) == []
    assert list(latest_per_key([])) == []


def test_compacted_option():
    assert SourceOptions.parse({"topic": "t", "compacted": "Latest"}).compacted is True
    assert SourceOptions.parse({"topic": "t", "compacted": "none"}).compacted is False
    assert SourceOptions.parse({"topic": "t"}).compacted is False
    with pytest.raises(ValueError, match="latest or none"):
        SourceOptions.parse({"topic": "t", "compacted": "yes"})
    with pytest.raises(ValueError, match="batch reads"):
        GatewayDataSource({"url": "http://gw", "topic": "t", "compacted": "latest"}).streamReader(SCHEMA)


def test_parse_states_keeps_the_most_advanced_state_of_each_device():
    def body(device: str, n: int, topic: str = "tele") -> bytes:
        offsets = {"0": n}
        return json.dumps(
            {"device_id": device, "topic": topic, "n": n, "mean": 1.5, "m2": 2.0, "offsets": offsets}
        ).encode()

    got = parse_states("tele", [body("a", 5), body("a", 9), body("a", 7), body("b", 3, "other"), b"not json"])
    assert got == {"a": (9, 1.5, 2.0, '{"0": 9}')}
