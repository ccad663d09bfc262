"""Smoke test of bench/cluster_bench.py: a quick run (name server, 2 stores, 1 then 2 proxies and a
LOCAL gateway as processes, then etcd, a replica group of 2 and a single node) prints one JSON
object with the contract keys, and cleans up."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "cluster_bench.py"

KEYS = [
    "send_scaling_2_vs_1",
    "pop_scaling_2_vs_1",
    "cluster_vs_local_p50_latency_ratio",
    "local_send_p50_ms",
    "cluster_send_p50_ms",
    "send_per_s_1_proxy",
    "send_per_s_2_proxy",
    "pop_per_s_1_proxy",
    "pop_per_s_2_proxy",
    "send_server_cpu_us_per_msg_1_proxy",
    "send_server_cpu_us_per_msg_2_proxy",
    "pop_server_cpu_us_per_msg_1_proxy",
    "pop_server_cpu_us_per_msg_2_proxy",
    "sync_replication_send_ratio",
    "sync_replication_p99_ms",
    "single_node_p99_ms",
]


@pytest.mark.slow_bench  # run by `make bench`, not `make test` (pyproject.toml markers)
def test_cluster_bench_quick_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)  # exactly one JSON object, nothing else on stdout
    assert isinstance(res, dict)
    for key in KEYS:
        v = res[key]
        assert isinstance(v, int | float) and math.isfinite(v) and v > 0, (key, v)
    for n in (1, 2):
        assert res[f"send_errors_{n}_proxy"] == 0 and res[f"pop_errors_{n}_proxy"] == 0
        per = res[f"send_cpu_us_per_msg_{n}_proxy"]  # every server process is accounted for
        assert {"namesrv", "store-a", "store-b", "proxy-1"} <= set(per)
        assert ("proxy-2" in per) == (n == 2)
    (rnd,) = res["replication_rounds"]
    assert rnd["replicated_errors"] == 0  # every send through the group was acknowledged
    assert list(tmp_path.iterdir()) == []  # the temporary work directory is removed
