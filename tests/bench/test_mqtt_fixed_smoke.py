"""Smoke test of bench/mqtt_bench.py's fixed-rate phase (`--phases fixed`) and of the repeated p99
runs (`--p99-runs`), with a persistent-session subscriber (`--fixed-persistent`): a tiny run against
our gateway (and Mosquitto when installed, as the main smoke test does) prints the new keys with
positive figures, the paced rate is what was asked for, and the p99 count agrees with the runs'
list, within 60 s."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from tests.bench.support import positive, run_bench, share

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "mqtt_bench.py"
MOSQUITTO = "/usr/sbin/mosquitto"
LIMIT_S = 60
RATE = 2000.0
P99_RUNS = 2

FIXED_FIGURES = [
    "fixed_publish_msgs_per_s",
    "fixed_delivered_msgs_per_s",
    "cpu_us_per_fixed_msg",
    "cpu_us_per_fixed_msg_incl_children",
    "fixed_p50_ms",
    "fixed_p99_ms",
]


def test_mqtt_fixed_rate_and_p99_runs(tmp_path: Path) -> None:
    have_mosquitto = os.access(MOSQUITTO, os.X_OK)
    brokers = "gateway,mosquitto" if have_mosquitto else "gateway"
    cmd = [sys.executable, str(SCRIPT), "--brokers", brokers, "--phases", "latency,fixed"]
    cmd += ["--fixed-rate", str(RATE), "--fixed-publishers", "2", "--p99-runs", str(P99_RUNS)]
    cmd += ["--fixed-persistent"]  # (the subscriber is a persistent session)
    cmd += ["--latency-rate", "1000", "--duration", "1", "--warmup", "0.3", "--quiet-wait", "0"]
    cmd += ["--auth-rounds", "0", "--trace-rounds", "0", "--tls-rounds", "0"]
    cmd += ["--json", "--dir", str(tmp_path)]
    res, err, elapsed = run_bench(cmd, LIMIT_S)

    for name in brokers.split(","):
        b = res["brokers"][name]
        assert "error" not in b, b["error"]
        d = b["details"]["fixed"]
        assert "error" not in d and not d["errors"], (name, d)
        for key in FIXED_FIGURES:
            assert positive(b[key]), (name, key, b[key], err[-3000:])
        # paced, not flat out: the publishers together keep the asked rate (a loose band: shared CI host)
        assert 0.5 * RATE <= d["fixed_publish_msgs_per_s"] <= 1.2 * RATE, (name, d)
        assert d["delivered"] > 0 and d["latency_samples"] > 0, (name, d)
        assert d["subscriber"] == "persistent", (name, d)
        assert d["fixed_p50_ms"] <= d["fixed_p99_ms"], (name, d)
        assert share(d["other_util"]) and share(d["host_steal"]), (name, d)
        assert res["fixed"]["brokers"][name]["cpu_us_per_fixed_msg"] == b["cpu_us_per_fixed_msg"]
    assert res["fixed"]["rate"] == RATE and res["config"]["fixed_rate"] == RATE

    ratio = res["cpu_ratio_vs_mosquitto_at_10k"]
    assert res["targets"]["cpu_fixed_vs_mosquitto"]["value"] == ratio
    if have_mosquitto:
        g, m = res["brokers"]["gateway"], res["brokers"]["mosquitto"]
        assert positive(ratio)
        assert math.isclose(ratio, g["cpu_us_per_fixed_msg"] / m["cpu_us_per_fixed_msg"])
    else:
        assert ratio is None

    # the repeated latency phase on fresh gateways; the main run's key stays as it was
    assert positive(res["p99_ms_at_5k"])
    runs = res["p99_ms_at_5k_runs"]
    assert len(runs) == P99_RUNS and all(positive(v) for v in runs), (runs, res["p99_runs"])
    assert res["p99_at_5k_runs_met"] == sum(1 for v in runs if v <= 10.0)
    assert res["targets"]["p99_at_5k_runs"]["value"] == res["p99_at_5k_runs_met"]
    for run in res["p99_runs"]["runs"]:
        assert "error" not in run and share(run["other_util"]) and share(run["host_steal"]), run
    assert elapsed < LIMIT_S
    assert list(tmp_path.iterdir()) == []  # work directories are removed
