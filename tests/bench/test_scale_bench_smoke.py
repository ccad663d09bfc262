"""Smoke test of bench/scale_bench.py: a `--quick` run (300 devices, small rates, about a second
per phase) against our gateway and Mosquitto prints one JSON object with the contract keys, every
figure positive, and nothing lost, duplicated or misrouted in any phase."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.bench.support import positive, run_bench, share

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "scale_bench.py"
MQTT_KEYS = (
    "idle_conn_rss_kib",
    "connects_per_s",
    "reconnects_per_s",
    "commands_p99_ms",
    "commands_delivered",
    "telemetry_cpu_us_per_msg",
    "telemetry_acks_per_s",
    "telemetry_p99_ms",
    "retained_replay_s",
    "persistent_cpu_us_per_msg",
    "persistent_acks_per_s",
    "persistent_p99_ms",
)
AMQP_KEYS = ("amqp_declare_first_s_per_1k", "amqp_declare_last_s_per_1k", "amqp_restart_s")
PHASES = ("idle", "commands", "telemetry", "retained", "reconnect", "devices", "persistent")


@pytest.mark.skipif(shutil.which("mosquitto") is None, reason="Mosquitto is not installed")
def test_scale_bench_quick_json() -> None:
    res, err, _ = run_bench([sys.executable, str(SCRIPT), "--quick", "--json"], 120)
    assert res["config"]["conns"] == 300 and res["config"]["nofile_limit"] > 300, res["config"]
    for name in ("gateway", "mosquitto"):
        d = res[name]
        keys = MQTT_KEYS + (AMQP_KEYS if name == "gateway" else ())
        assert [k for k in keys if not positive(d.get(k))] == [], (name, d)
        for phase in PHASES:
            assert share(d[f"{phase}_other_util"]) and share(d[f"{phase}_host_steal"]), (name, phase)
        # nothing lost, duplicated or misrouted
        assert d["idle_conns"] == 300 and d["idle_persistent"] == 150
        for phase in ("commands", "resumed_commands"):
            assert d[f"{phase}_delivered"] == d[f"{phase}_sent"] > 0, (name, phase, d)
            assert d[f"{phase}_duplicates"] == d[f"{phase}_misrouted"] == 0, (name, phase)
        assert d["devices_publishers"] == 300 and d["devices_rate"] == 300.0, d  # one msg/s each
        for phase in ("telemetry", "devices", "persistent"):
            assert d[f"{phase}_sent"] > 0, (name, phase)
            assert d[f"{phase}_drained"] is True, (name, phase, d)
            assert d[f"{phase}_undelivered"] == d[f"{phase}_duplicates"] == d[f"{phase}_unacked"] == 0, d
        assert d["retained_replayed"] == d["retained_flagged"] == d["retained_messages"], (name, d)
        assert d["retained_duplicates"] == 0
        assert d["reconnects"] == d["reconnect_session_present"] == 150, (name, d)
    g = res["gateway"]
    assert g["amqp_queues"] == 200 and g["amqp_queues_found_after_restart"] == 20, g
    assert positive(res["idle_conn_rss_kib_ratio"]) and res["amqp_restart_s_ratio"] is None
    assert positive(res["devices_cpu_ratio_vs_mosquitto"]), res
    assert "Future exception was never retrieved" not in err
