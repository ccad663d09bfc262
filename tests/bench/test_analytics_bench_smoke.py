"""Smoke test of bench/analytics_bench.py: a quick run (50,000 messages, its own gateway process and
local Spark) prints one JSON object with the contract keys and removes its temporary data."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "analytics_bench.py"

KEYS = ["rows_per_s", "ratio_vs_native_json", "native_json_rows_per_s", "fill_per_s", "json_file_mb"]


@pytest.mark.slow_bench  # run by `make bench`, not `make test` (pyproject.toml markers)
def test_analytics_bench_quick_json(tmp_path: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--runs", "1", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout)  # exactly one JSON object, nothing else on stdout
    assert isinstance(res, dict)
    for key in KEYS:
        v = res[key]
        assert isinstance(v, int | float) and math.isfinite(v) and v > 0, (key, v)
    assert res["messages"] == 50_000 and res["body_bytes"] == 100
    assert abs(res["ratio_vs_native_json"] - res["rows_per_s"] / res["native_json_rows_per_s"]) < 0.01
    assert list(tmp_path.iterdir()) == []  # the temporary directory is removed
