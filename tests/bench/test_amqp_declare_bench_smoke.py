"""Smoke test of bench/amqp_declare_bench.py: a small run against our gateway prints one JSON
object with the contract keys, and every queue it declared is counted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.bench.support import run_bench

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "amqp_declare_bench.py"


@pytest.mark.slow_bench  # run by `make bench`, not `make test` (pyproject.toml markers)
def test_amqp_declare_bench_json() -> None:
    res, _, _ = run_bench(
        [sys.executable, str(SCRIPT), "--brokers", "gateway", "--queues", "1000", "--json"], 180
    )
    assert res["queues"] == 1000 and res["declare_ratio_vs_rabbitmq"] is None  # no RabbitMQ run
    g = res["brokers"]["gateway"]
    assert "error" not in g, g
    assert len(g["ms_per_queue_by_1000"]) == 1 and g["declare_total_s"] > 0 and g["server_cpu_s"] > 0
    assert g["declare_bind_ms_per_queue"] == round(g["declare_total_s"] / 1000 * 1000, 2)
