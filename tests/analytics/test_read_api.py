"""The gateway's HTTP read API (gateway/http/read_api.py, read_records.py) without Spark: queue
listing, replayable range reads as Arrow and JSON lines (compared with the store's own reads),
path filters, offsets by time, group commits, errors, and records that fail their checks."""

from __future__ import annotations

import base64
import itertools
import json
import os

import httpx
import pyarrow as pa
import pytest

from gateway.http import read_records as rr
from messaging_processor import ClientContext
from store import Message, raw_range
from tests.analytics.support import T

CTX = ClientContext("test")
_names = itertools.count(1)


def topic_name(prefix: str = "rt") -> str:
    return f"{prefix}{next(_names)}"


def create(gateway, topic: str, queues: int) -> None:
    gateway.call(gateway.processor.create_topic(topic, queues))


def send(gateway, msgs: list[Message]) -> list:
    return gateway.call(gateway.processor.send(CTX, msgs))


def arrow(gateway, topic: str, queue: int, **params) -> tuple[pa.Table, httpx.Headers]:
    r = httpx.get(
        f"{gateway.url}/read/topics/{topic}/queues/{queue}/messages",
        params={"format": "arrow", **params},
        timeout=T,
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == rr.ARROW_STREAM
    return pa.ipc.open_stream(r.content).read_all(), r.headers


def generic(gateway, topic: str, queue: int, start: int, end: int) -> pa.Table:
    """The same range through processor.read (Message objects), converted row by row."""
    msgs = gateway.call(gateway.processor.read(CTX, topic, queue, start, end, 1 << 30))
    return pa.Table.from_batches([rr.messages_to_batch(msgs)], schema=rr.wire_schema())


def varied(topic: str, n: int, queues: int) -> list[Message]:
    """Messages exercising every column: keys, tags, unicode, binary bodies, CE and MQTT paths."""
    out = []
    for i in range(n):
        props: dict[str, str] = {}
        if i % 3 == 0:
            props = {"mqtt.topic": f"{topic}/dev{i % 5}/telemetry", "mqtt.qos": str(i % 3)}
        elif i % 3 == 1:
            props = {"ce.id": f"e{i}", "ce.source": "/s", "ce.type": "t", "ce.subject": f"{topic}/h{i % 2}/x"}
        if i % 7 == 0:
            props["ünï"] = "çödé ✓"
        out.append(
            Message(
                topic,
                bytes((i + k) % 256 for k in range(i % 300)) or b"\x00",
                tag="" if i % 4 else f"tag{i % 3}",
                keys=tuple(f"k{i}-{j}" for j in range(i % 3)),
                properties=props,
                queue_id=i % queues,
            )
        )
    return out


def test_queues_offsets_and_time_search(gateway):
    topic = topic_name()
    create(gateway, topic, 3)
    first = send(gateway, [Message(topic, b"a", queue_id=q) for q in (0, 0, 1)])
    later = send(gateway, [Message(topic, b"b", queue_id=0)])
    r = httpx.get(f"{gateway.url}/read/topics/{topic}/queues", timeout=T)
    assert r.status_code == 200
    assert r.json() == {
        "topic": topic,
        "queues": [
            {"queue_id": 0, "min_offset": 0, "max_offset": 3},
            {"queue_id": 1, "min_offset": 0, "max_offset": 1},
            {"queue_id": 2, "min_offset": 0, "max_offset": 0},
        ],
    }
    ts = later[0].store_timestamp
    r = httpx.get(f"{gateway.url}/read/topics/{topic}/offsets", params={"timestamp": ts}, timeout=T)
    by_q = {q["queue_id"]: q["offset"] for q in r.json()["queues"]}
    assert by_q[0] <= 2 and by_q[1] <= 1 and by_q[2] == 0
    assert first[0].store_timestamp <= ts
    r = httpx.get(f"{gateway.url}/read/topics/{topic}/offsets", params={"timestamp": ts + 60_000}, timeout=T)
    assert [q["offset"] for q in r.json()["queues"]] == [3, 1, 0]  # nothing that late: the max offsets


def test_arrow_rows_match_the_stores_messages(gateway):
    topic = topic_name()
    create(gateway, topic, 2)
    msgs = varied(topic, 300, 2)
    receipts = send(gateway, msgs)
    for q in (0, 1):
        table, headers = arrow(gateway, topic, q, max=1000)
        ref = generic(gateway, topic, q, 0, 1000)
        assert table.num_rows == 150 and headers["X-Next-Offset"] == "150"
        assert table.equals(ref), (table.slice(0, 2).to_pylist(), ref.slice(0, 2).to_pylist())
    # and the values are what was sent, path rule included
    table, _ = arrow(gateway, topic, 0)
    rows = {r["message_id"]: r for r in table.to_pylist()}
    for m, rec in zip(msgs, receipts, strict=True):
        if rec.queue_id != 0:
            continue
        row = rows[rec.message_id]
        assert row["body"] == m.body and row["tag"] == m.tag and row["keys"] == list(m.keys)
        assert dict(row["properties"]) == m.properties
        assert row["offset"] == rec.queue_offset and row["queue"] == 0 and row["topic"] == topic
        want = (
            m.properties.get("mqtt.topic")
            or m.properties.get("ce.subject")
            or (f"{topic}/{m.tag}" if m.tag else topic)
        )
        assert row["path"] == want
        assert int(row["timestamp"].timestamp() * 1000) == rec.store_timestamp


def test_a_trace_context_the_gateway_made_is_not_a_readers_property(gateway):
    topic = topic_name()
    create(gateway, topic, 1)
    shared = {
        "site": "north"
    }  # one publish's copies share their properties: the gateway gives them a context
    send(gateway, [Message(topic, b"a", properties=shared), Message(topic, b"b", properties=shared)])
    assert set(shared) > {"site"}  # (stored with the gateway's own context beside the client's property)
    table, _ = arrow(gateway, topic, 0)
    assert [dict(r["properties"]) for r in table.to_pylist()] == [{"site": "north"}] * 2
    assert table.equals(generic(gateway, topic, 0, 0, 10))


def test_jsonl_is_the_same_rows(gateway):
    topic = topic_name()
    create(gateway, topic, 1)
    send(gateway, varied(topic, 40, 1))
    r = httpx.get(
        f"{gateway.url}/read/topics/{topic}/queues/0/messages", params={"start": 3, "end": 30}, timeout=T
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith(rr.NDJSON)
    lines = [json.loads(x) for x in r.text.splitlines()]
    table, _ = arrow(gateway, topic, 0, start=3, end=30)
    assert [x["offset"] for x in lines] == list(range(3, 30))
    for line, row in zip(lines, table.to_pylist(), strict=True):
        assert base64.b64decode(line["body"]) == row["body"]
        assert line["properties"] == dict(row["properties"]) and line["path"] == row["path"]
        assert line["keys"] == row["keys"] and line["message_id"] == row["message_id"]
        assert line["timestamp"] == int(row["timestamp"].timestamp() * 1000)
    # content negotiation: Accept picks Arrow when no format is given
    r = httpx.get(
        f"{gateway.url}/read/topics/{topic}/queues/0/messages", headers={"accept": rr.ARROW_STREAM}, timeout=T
    )
    assert pa.ipc.open_stream(r.content).read_all().num_rows == 40


def test_range_bounds_are_replayable(gateway):
    topic = topic_name()
    create(gateway, topic, 1)
    send(gateway, [Message(topic, str(i).encode(), queue_id=0) for i in range(50)])
    t1, h = arrow(gateway, topic, 0, start=10, end=40, max=7)
    assert t1.column("offset").to_pylist() == list(range(10, 17))
    assert (h["X-Start-Offset"], h["X-Next-Offset"], h["X-Min-Offset"], h["X-Max-Offset"]) == (
        "10",
        "17",
        "0",
        "50",
    )
    t2, _ = arrow(gateway, topic, 0, start=10, end=40, max=7)
    assert t2.equals(t1)  # the same request, the same rows
    t3, h = arrow(gateway, topic, 0, start=45)  # end defaults to the max
    assert t3.column("offset").to_pylist() == list(range(45, 50)) and h["X-Next-Offset"] == "50"
    t4, h = arrow(gateway, topic, 0, start=70, end=90)  # past the end: nothing yet, continue at 70
    assert t4.num_rows == 0 and h["X-Next-Offset"] == "70"
    t5, h = arrow(gateway, topic, 0, start=30, end=20)
    assert t5.num_rows == 0 and h["X-Next-Offset"] == "30"


def test_chunks_spans_and_interleaved_topics(gateway, monkeypatch):
    """Many chunks and read spans (small limits), queues interleaved with another topic's records."""
    monkeypatch.setattr(rr, "CHUNK_ROWS", 37)
    monkeypatch.setattr(rr, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(raw_range, "MAX_GAP", 300)
    topic, other = topic_name(), topic_name()
    create(gateway, topic, 3)
    create(gateway, other, 1)
    for i in range(0, 600, 50):
        send(gateway, varied(topic, 50, 3))
        send(gateway, [Message(other, b"x" * (i % 700 + 1), queue_id=0) for _ in range(3)])
    for q in range(3):
        table, h = arrow(gateway, topic, q, start=5, end=190, max=1000)
        assert table.column("offset").to_pylist() == list(range(5, 190))
        assert table.equals(generic(gateway, topic, q, 5, 190))


def test_path_filters(gateway):
    topic = topic_name("pf")
    create(gateway, topic, 1)
    paths = [f"{topic}/a/t", f"{topic}/b/t", f"{topic}/a/t/x", f"{topic}/a", f"{topic}/ab/t", "$x/y"]
    send(
        gateway,
        [Message(topic, p.encode(), properties={"mqtt.topic": p}, queue_id=0) for p in paths]
        + [Message(topic, b"tagged", tag="a", queue_id=0)],  # path <topic>/a
    )

    def select(f: str) -> list[str]:
        table, h = arrow(gateway, topic, 0, path=f)
        assert h["X-Next-Offset"] == "7"  # filtered rows count as read
        return table.column("path").to_pylist()

    assert select(f"{topic}/+/t") == [f"{topic}/a/t", f"{topic}/b/t", f"{topic}/ab/t"]
    assert select(f"{topic}/a/#") == [f"{topic}/a/t", f"{topic}/a/t/x", f"{topic}/a", f"{topic}/a"]
    assert select(f"{topic}/a") == [f"{topic}/a", f"{topic}/a"]
    assert select("#") == paths[:5] + [f"{topic}/a"]  # a leading wildcard never matches $ paths
    assert select("+/y") == []
    assert select(f"{topic}/a*") == [
        f"{topic}/a/t",
        f"{topic}/a/t/x",
        f"{topic}/a",
        f"{topic}/ab/t",
        f"{topic}/a",
    ]
    assert select(f"{topic}/?/t") == [f"{topic}/a/t", f"{topic}/b/t"]
    assert select(f"{topic}/[!a]/t") == [f"{topic}/b/t"]
    assert select("$x/*") == ["$x/y"]
    for bad in ("a/#/b", "a/b+", "a#"):
        r = httpx.get(f"{gateway.url}/read/topics/{topic}/queues/0/messages", params={"path": bad}, timeout=T)
        assert r.status_code == 400 and r.json()["kind"] == "bad_request", bad


@pytest.mark.parametrize(
    ("text", "yes", "no"),
    [
        ("a/+/c", ["a/b/c", "a//c"], ["a/b/c/d", "a/c", "x/b/c"]),
        ("a/#", ["a", "a/b", "a/b/c"], ["ab", "b/a"]),
        ("+", ["a"], ["a/b", "$SYS"]),
        ("a.b/(c)", ["a.b/(c)"], ["axb/(c)", "a.b/c"]),
        ("a/*", ["a/b", "a/b/c"], ["b/a"]),
        ("a/[bc]?", ["a/bx", "a/cy"], ["a/dx", "a/b"]),
    ],
)
def test_path_filter_semantics(text, yes, no):
    f = rr.PathFilter.parse(text)
    arr = pa.array(yes + no)
    assert f.mask(arr).to_pylist() == [True] * len(yes) + [False] * len(no)
    assert [f.matches(p) for p in yes + no] == [True] * len(yes) + [False] * len(no)


def test_group_offsets_commit(gateway):
    topic = topic_name()
    create(gateway, topic, 2)
    send(gateway, [Message(topic, b"m", queue_id=i % 2) for i in range(10)])
    url = f"{gateway.url}/read/groups/spark-g/topics/{topic}/offsets"
    assert httpx.get(url, timeout=T).json()["queues"] == [
        {"queue_id": 0, "offset": -1},
        {"queue_id": 1, "offset": -1},
    ]
    r = httpx.post(url, json={"offsets": {"0": 3, "1": 99}}, timeout=T)
    assert r.status_code == 200
    assert r.json() == {
        "group": "spark-g",
        "topic": topic,
        "queues": [{"queue_id": 0, "offset": 3}, {"queue_id": 1, "offset": 5}],
    }  # clamped to the max
    assert httpx.get(url, timeout=T).json() == r.json()
    for bad in ({"offsets": {"2": 1}}, {"offsets": {"0": -1}}, {"offsets": {"x": 1}}, {}):
        r = httpx.post(url, json=bad, timeout=T)
        assert r.status_code == 400, bad
    assert httpx.get(url, timeout=T).json()["queues"][0]["offset"] == 3


def test_errors(gateway):
    topic = topic_name()
    create(gateway, topic, 1)
    base = f"{gateway.url}/read/topics"
    for path in ("nope/queues", "nope/queues/0/messages", "nope/offsets?timestamp=1"):
        r = httpx.get(f"{base}/{path}", timeout=T)
        assert r.status_code == 404 and r.json()["kind"] == "topic_not_found", path
    assert httpx.get(f"{base}/{topic}/queues/1/messages", timeout=T).status_code == 400
    assert httpx.get(f"{base}/{topic}/queues/0/messages?format=csv", timeout=T).status_code == 400
    assert httpx.get(f"{base}/{topic}/queues/0/messages?start=-1", timeout=T).status_code == 400
    assert httpx.get(f"{base}/{topic}/offsets", timeout=T).status_code == 400  # timestamp is required


def test_records_from_before_json_properties_read_the_same(gateway, monkeypatch):
    """A range whose first records were written in the older property layout (pairs, no flag),
    as a data directory from an earlier release holds them, and whose others are JSON blocks,
    with the same property sets in both (one block, two encodings)."""
    from store import codec
    from tests.store.support import write_legacy_records

    topic = topic_name()
    create(gateway, topic, 1)
    msgs = varied(topic, 60, 1)
    with monkeypatch.context() as m:
        write_legacy_records(m)
        old = send(gateway, msgs[:30])
    new = send(gateway, msgs[30:])
    st = gateway.gw.store
    json_flag = [
        codec.HEAD.unpack_from(st.commitlog.read(r.commitlog_offset, victim_size(st, r)), 8)[2]
        & codec.FLAG_JSON_PROPERTIES
        for r in old + new
    ]
    assert not any(json_flag[:30])
    assert all(f for f, m in zip(json_flag[30:], msgs[30:], strict=True) if m.properties)
    table, _ = arrow(gateway, topic, 0)
    assert table.equals(generic(gateway, topic, 0, 0, 60))
    assert [dict(p) for p in table.column("properties").to_pylist()] == [m.properties for m in msgs]


def test_a_corrupt_record_is_skipped_like_the_store_does(gateway):
    topic = topic_name()
    create(gateway, topic, 1)
    receipts = send(gateway, [Message(topic, b"payload-%03d" % i, queue_id=0) for i in range(20)])
    victim = receipts[7]
    st = gateway.gw.store
    seg = st.commitlog.segment_for(victim.commitlog_offset)
    pos = victim.commitlog_offset - seg.base + victim_size(st, victim) - 3  # inside the body
    fd = os.open(seg.path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, pos)
        os.pwrite(fd, bytes([old[0] ^ 0xFF]), pos)
        table, h = arrow(gateway, topic, 0)
        offsets = table.column("offset").to_pylist()
        assert offsets == [i for i in range(20) if i != 7] and h["X-Next-Offset"] == "20"
        assert generic(gateway, topic, 0, 0, 20).column("offset").to_pylist() == offsets
    finally:
        os.pwrite(fd, old, pos)
        os.close(fd)
    assert arrow(gateway, topic, 0)[0].num_rows == 20


def victim_size(st, receipt) -> int:
    cq = st._queue(receipt.topic, receipt.queue_id)
    ((_clo, size, _th, _ts),) = list(cq.entries(receipt.queue_offset, 1))
    return size


def test_generic_store_client_path_gives_the_same_rows(gateway, monkeypatch):
    """With a StoreClient that has no raw range reads, rows come from processor.read."""
    topic = topic_name()
    create(gateway, topic, 2)
    send(gateway, varied(topic, 120, 2))
    fast = [arrow(gateway, topic, q, start=3, end=50, max=40) for q in (0, 1)]
    fast_filtered = arrow(gateway, topic, 0, path=f"{topic}/+/telemetry")[0]
    calls = []
    real_read = gateway.processor.read

    async def counting_read(*args, **kw):
        calls.append(args)
        return await real_read(*args, **kw)

    async def no_raw_reads(*args, **kw):  # a StoreClient without raw range reads (CLUSTER mode's)
        return None

    monkeypatch.setattr(gateway.processor.store, "read_raw", no_raw_reads)
    monkeypatch.setattr(gateway.processor, "read", counting_read)
    for q in (0, 1):
        table, headers = arrow(gateway, topic, q, start=3, end=50, max=40)
        assert table.equals(fast[q][0]) and headers["X-Next-Offset"] == fast[q][1]["X-Next-Offset"] == "43"
    assert arrow(gateway, topic, 0, path=f"{topic}/+/telemetry")[0].equals(fast_filtered)
    assert fast_filtered.num_rows == 20 and calls
