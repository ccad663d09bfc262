"""`gateway analytics telemetry` (analytics/telemetry.py) end to end: devices publish telemetry over
MQTT and HTTP CloudEvents, the job runs with availableNow (`--once`) through the gateway CLI, its
window aggregates and anomalies are compared with a reference computed here, anomaly events reach an
MQTT subscriber, and a restart from the checkpoint processes only the messages published since; a
restart with a deleted checkpoint resumes the anomaly state from the compacted state topic."""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import statistics
from collections import defaultdict

import httpx
import pytest

from analytics.telemetry import TelemetryJob, interval
from gateway.cli import build_parser
from gateway.cli import main as gateway_main
from tests.analytics.support import Reading, Subscriber, T, publish_cloudevents, publish_mqtt

T0 = 1_700_000_040  # a minute boundary (epoch-aligned windows start here)
STEP = 5  # seconds between readings
WINDOW = 60
WATERMARK = 30
THRESHOLD = 4.0
MIN_SAMPLES = 10
SPIKES = {("d1", 30): 35.0, ("h1", 25): 5.0, ("d2", 60): 36.0}  # (device, step) -> injected value


def reading(device: str, step: int, rnd: random.Random) -> Reading:
    value = SPIKES.get((device, step), round(20 + rnd.gauss(0, 0.5), 3))
    return Reading(f"tele/{device}/telemetry", T0 + STEP * step, value)


def generate(steps: range, seed: int) -> dict[str, list[Reading]]:
    rnd = random.Random(seed)
    return {d: [reading(d, s, rnd) for s in steps] for d in ("d1", "d2", "h1")}


def expected_windows(rs: list[Reading], watermark: float) -> dict[tuple[str, int], tuple]:
    """(device, window start) -> (count, avg, min, max, stddev) of windows closed by `watermark`."""
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in rs:
        groups[(r.device, int(r.ts // WINDOW * WINDOW))].append(r.value)
    return {
        k: (len(v), statistics.fmean(v), min(v), max(v), statistics.stdev(v))
        for k, v in groups.items()
        if k[1] + WINDOW <= watermark
    }


def expected_anomalies(per_device: dict[str, list[Reading]]) -> set[tuple[str, float, float]]:
    """Running z-score per device in event-time order: (device, ts, value) of flagged readings."""
    out = set()
    for device, rs in per_device.items():
        mean, m2 = 0.0, 0.0
        for n, r in enumerate(sorted(rs, key=lambda r: r.ts)):  # n: readings before this one
            if n >= MIN_SAMPLES and n > 1:
                std = math.sqrt(m2 / (n - 1))
                if std > 0 and abs((r.value - mean) / std) > THRESHOLD:
                    out.add((device, r.ts, r.value))
            d = r.value - mean
            mean += d / (n + 1)
            m2 += d * (r.value - mean)
    return out


def publish(gateway, batch: dict[str, list[Reading]], ce_prefix: str) -> None:
    publish_mqtt(gateway.mqtt_port, batch["d1"] + batch["d2"])
    publish_cloudevents(gateway.url, "tele", batch["h1"], prefix=ce_prefix)


def run_cli(out: str, url: str) -> int:
    return gateway_main([
        "analytics", "telemetry", "--topic", "tele", "--gateway", url, "--out", out, "--once",
        "--window", "1m", "--watermark", f"{WATERMARK}s", "--anomaly-topic", "alerts",
        "--threshold", str(THRESHOLD), "--min-samples", str(MIN_SAMPLES), "--group", "tele-job",
    ])  # fmt: skip


def rows_in(captured: str) -> dict[str, int]:
    """Input rows per query from the job's progress lines."""
    total: dict[str, int] = defaultdict(int)
    for name, n in re.findall(r"^\[(windows|anomalies)\] batch \d+: (\d+) rows", captured, re.M):
        total[name] += int(n)
    return dict(total)


def windows_of(spark, out: str) -> dict[tuple[str, int], tuple]:
    rows = spark.read.parquet(f"{out}/windows").collect()
    got = {
        (r.device_id, int(r.window_start.timestamp())): (r["count"], r.avg, r.min, r.max, r.stddev)
        for r in rows
    }
    assert len(got) == len(rows), "a window was written twice"
    return got


def assert_windows(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, (count, avg, lo, hi, sd) in want.items():
        g = got[k]
        assert g[0] == count and g[2] == lo and g[3] == hi, k
        assert g[1] == pytest.approx(avg, abs=1e-9) and g[4] == pytest.approx(sd, abs=1e-9), k


def anomalies_of(spark, out: str, batches: set[int] | None = None) -> set[tuple[str, float, float]]:
    df = spark.read.parquet(f"{out}/anomalies")
    rows = [r for r in df.collect() if batches is None or r.batch in batches]
    return {(r.device_id, r.event_time.timestamp(), r.value) for r in rows}


def queue_maxes(gateway) -> dict[int, int]:
    out = httpx.get(f"{gateway.url}/read/topics/tele/queues", timeout=T).json()["queues"]
    return {q["queue_id"]: q["max_offset"] for q in out}


def committed(gateway) -> dict[int, int]:
    out = httpx.get(f"{gateway.url}/read/groups/tele-job/topics/tele/offsets", timeout=T).json()["queues"]
    return {q["queue_id"]: q["offset"] for q in out}


def test_telemetry_job_windows_anomalies_alerts_and_restart(spark, gateway, tmp_path, capsys):
    gateway.call(gateway.processor.create_topic("tele", 4))
    out = str(tmp_path / "out")
    sub = Subscriber(gateway.mqtt_port, "alerts/#").start()
    try:
        # ---- phase 1: 4 minutes of readings from 3 devices, 2 over MQTT and 1 over HTTP
        first = generate(range(0, 48), seed=7)
        publish(gateway, first, "p1")
        want_anomalies = expected_anomalies(first)
        assert want_anomalies == {("d1", T0 + 150, 35.0), ("h1", T0 + 125, 5.0)}  # the data is as meant

        assert run_cli(out, gateway.url) == 0
        log = capsys.readouterr().out
        assert rows_in(log) == {"windows": 144, "anomalies": 144}
        everything = [r for rs in first.values() for r in rs]
        wm = max(r.ts for r in everything) - WATERMARK
        assert_windows(windows_of(spark, out), expected_windows(everything, wm))
        assert len(windows_of(spark, out)) == 9  # 3 closed minutes x 3 devices; the 4th minute is open
        assert anomalies_of(spark, out) == want_anomalies

        alerts = sub.wait_for(2)
        assert len(alerts) == 2 and {t for t, _ in alerts} == {"alerts"}
        got = {(a["device_id"], a["value"], a["path"]) for a in (json.loads(p) for _, p in alerts)}
        assert got == {("d1", 35.0, "tele/d1/telemetry"), ("h1", 5.0, "tele/h1/telemetry")}
        assert committed(gateway) == queue_maxes(gateway)

        # ---- phase 2: 2 more minutes, one more spike; the job restarts from its checkpoint
        later = generate(range(48, 72), seed=8)
        publish(gateway, later, "p2")
        batches_before = {r.batch for r in spark.read.parquet(f"{out}/anomalies").collect()}
        assert run_cli(out, gateway.url) == 0
        log = capsys.readouterr().out
        assert rows_in(log) == {"windows": 72, "anomalies": 72}  # only the new messages
        everything += [r for rs in later.values() for r in rs]
        wm = max(r.ts for r in everything) - WATERMARK
        assert_windows(windows_of(spark, out), expected_windows(everything, wm))
        assert len(windows_of(spark, out)) == 15
        all_readings = {d: first[d] + later[d] for d in first}
        assert expected_anomalies(all_readings) - want_anomalies == {("d2", T0 + 300, 36.0)}
        new_batches = {r.batch for r in spark.read.parquet(f"{out}/anomalies").collect()} - batches_before
        assert anomalies_of(spark, out, new_batches) == {("d2", T0 + 300, 36.0)}
        assert anomalies_of(spark, out) == expected_anomalies(all_readings)

        alerts = sub.wait_for(3)
        assert len(alerts) == 3
        assert json.loads(alerts[-1][1])["device_id"] == "d2"
        assert committed(gateway) == queue_maxes(gateway)
    finally:
        sub.stop()


def test_cli_flags():
    args = build_parser().parse_args(
        ["analytics", "telemetry", "--topic", "t", "--window", "90s", "--watermark", "2 minutes", "--once"]
    )
    assert (args.command, args.analytics_command, args.topic) == ("analytics", "telemetry", "t")
    assert (args.window, args.watermark, args.once, args.continuous) == (
        "90 seconds",
        "2 minutes",
        True,
        False,
    )
    assert args.threshold == 4.0 and args.out == "./analytics-out"
    assert interval("500ms") == "500 milliseconds" and interval("1h") == "1 hours"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["analytics", "telemetry", "--topic", "t", "--once", "--continuous"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["analytics", "telemetry", "--topic", "t", "--window", "soon"])
    job = TelemetryJob(topic="t", gateway="http://gw", out="/o")
    assert job.checkpoint_dir == "/o/_checkpoints"
    assert job.state_topic_name == "t-state" and job.keep_state
    assert TelemetryJob(topic="t", gateway="g", out="/o", group="g1").state_topic_name == "g1-state"
    args = build_parser().parse_args(["analytics", "telemetry", "--topic", "t", "--state-topic", "s"])
    assert (args.state_topic, args.no_state_topic) == ("s", False)
    off = build_parser().parse_args(["analytics", "telemetry", "--topic", "t", "--no-state-topic"])
    assert off.no_state_topic and off.state_topic is None


def test_anomaly_state_resumes_from_the_state_topic_with_a_new_checkpoint(spark, gateway, tmp_path):
    """The job keeps its per-device state in a compacted topic too: run it, delete its checkpoint,
    run it again over everything (startingOffsets earliest): the counts and means continue from the
    state topic, and readings the restored state already holds are not counted (or flagged) again."""
    gateway.call(gateway.processor.create_topic("tele2", 4))
    rnd = random.Random(11)
    made = {d: [reading(d, s, rnd) for s in range(60)] for d in ("d1", "h1")}
    steps = {d: [Reading("tele2" + r.path[4:], r.ts, r.value) for r in rs] for d, rs in made.items()}
    assert expected_anomalies(steps) == {("d1", T0 + 150, 35.0), ("h1", T0 + 125, 5.0)}  # as meant

    def run(phase: range, out: str) -> TelemetryJob:
        publish_mqtt(gateway.mqtt_port, [steps["d1"][s] for s in phase], client_id="tele2-pub")
        publish_cloudevents(gateway.url, "tele2", [steps["h1"][s] for s in phase], prefix=f"t2-{phase.start}")
        job = TelemetryJob(
            topic="tele2", gateway=gateway.url, out=out, checkpoint=str(tmp_path / "cp"), once=True,
            threshold=THRESHOLD, min_samples=MIN_SAMPLES, quiet=True,
        )  # fmt: skip
        assert job.run(spark) == 0
        return job

    def flagged(out: str) -> set[tuple[str, float, float, int]]:
        rows = spark.read.parquet(f"{out}/anomalies").collect()
        return {(r.device_id, r.event_time.timestamp(), r.value, r.n) for r in rows}

    def states() -> list[tuple[str, int]]:
        df = spark.read.format("gateway").option("url", gateway.url).option("topic", "tele2-state")
        bodies = [json.loads(bytes(r.body)) for r in df.option("compacted", "latest").load().collect()]
        return sorted((b["device_id"], b["n"]) for b in bodies)

    first = run(range(0, 30), str(tmp_path / "out1"))
    assert first.state_topic_name == "tele2-state" and first.stats["states"] == 2
    assert httpx.get(f"{gateway.url}/admin/topics/tele2-state", timeout=T).json()["compacted"] is True
    assert flagged(str(tmp_path / "out1")) == {("h1", T0 + 125, 5.0, 25)}
    assert states() == [("d1", 30), ("h1", 30)]

    shutil.rmtree(tmp_path / "cp")
    second = run(range(30, 60), str(tmp_path / "out2"))
    # d1's spike is the 31st reading: scored against the 30 before it (restored), not against none;
    # h1's spike (step 25) is in the restored state and not flagged again
    got = flagged(str(tmp_path / "out2"))
    assert {a[:3] for a in got} == {("d1", T0 + 150, 35.0)} and {a[3] for a in got} == {30}
    d1 = spark.read.parquet(f"{tmp_path}/out2/anomalies").collect()[0]
    before = [r.value for r in steps["d1"][:30]]
    assert d1.mean == pytest.approx(statistics.fmean(before), abs=1e-9)
    assert d1.stddev == pytest.approx(statistics.stdev(before), abs=1e-9)
    assert second.stats["states"] == 2 and states() == [("d1", 60), ("h1", 60)]
    raw = spark.read.format("gateway").option("url", gateway.url).option("topic", "tele2-state").load()
    assert raw.count() == 4  # not compacted yet: both runs' records, yet one row per device above
