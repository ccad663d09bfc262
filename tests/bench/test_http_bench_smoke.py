"""Smoke test of bench/http_bench.py: a quick run (our gateway and the bare FastAPI endpoint, single
events, batches of 100, push to a local webhook) prints one JSON object whose contract keys are
positive numbers, within the 30 s budget of `--quick`, and leaves no work directory behind."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "http_bench.py"
KEYS = [
    "single_ratio_vs_bare",
    "batched_events_per_s",
    "push_events_per_s",
    "single_events_per_s",
    "bare_single_events_per_s",
    "cpu_us_per_single_event",
    "cpu_us_per_batched_event",
    "cpu_us_per_push_event",
    "single_p50_ms",
    "single_p99_ms",
    "batched_p99_ms",
]


def _positive(v: object) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


def test_http_bench_quick_json(tmp_path: Path) -> None:
    t = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    elapsed = time.monotonic() - t
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)  # exactly one JSON object, nothing else on stdout
    assert isinstance(res, dict)
    for key in KEYS:
        assert _positive(res.get(key)), (key, res.get(key), proc.stderr[-3000:])
    for name, runs in res["runs"].items():
        for r in runs:
            assert "error" not in r, (name, r)
            assert r["non_2xx"] == 0, (name, r.get("error_samples"))
    push = res["push"]
    assert "error" not in push, push
    assert push["received"] == push["events"] and push["distinct"] == push["events"]
    assert set(res["targets"]) == {"single_ratio_vs_bare", "batched_events_per_s", "push_events_per_s"}
    assert elapsed < 30
    assert list(tmp_path.iterdir()) == []  # the work directory is removed
