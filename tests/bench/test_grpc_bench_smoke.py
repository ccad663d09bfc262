"""Smoke test of bench/grpc_bench.py: a quick run prints one JSON object with the contract keys."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "grpc_bench.py"

KEYS = [
    "sends_per_s",
    "send_p50_ms",
    "send_p99_ms",
    "sends_per_s_batch1",
    "send_p50_ms_batch1",
    "send_p99_ms_batch1",
    "receive_ack_per_s",
    "receive_ack_p50_ms",
    "receive_ack_p99_ms",
    "send_batch",
    "receive_ack_ceiling_per_s",
    "receive_ack_ratio_vs_ceiling",
]


def test_grpc_bench_quick_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)  # exactly one JSON object, nothing else on stdout
    assert isinstance(res, dict)
    for key in KEYS:
        assert key in res, key
        v = res[key]
        assert isinstance(v, int | float) and math.isfinite(v) and v > 0, (key, v)
    assert res["send_errors"] == 0 and res["receive_ack_errors"] == 0
    assert res["client_poller"] == "legacy"
    for key in ("send_host_steal", "receive_ack_host_steal", "ceiling_host_steal"):
        assert 0 <= res[key] <= 1, (key, res[key])
    assert list(tmp_path.iterdir()) == []  # the temporary data directory is removed
