"""Smoke test of bench/store_bench.py: a minimal run prints one JSON object with the contract keys."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "store_bench.py"

CONTRACT_KEYS = (
    ["seq_write_mb_s", "disk_fraction_4k_sync", "pop_ack_per_s", "tail_per_s", "tail_vs_pop_ack_1c"]
    + ["rescale_grow_ms", "rescale_shrink_ms"]
    + [f"disk_fraction_4k_sync_{p}p" for p in (1, 8, 64)]
    + [
        f"append_{size}_{flush}_{p}p_{metric}"
        for size in ("100b", "4k")
        for flush in ("sync", "async")
        for p in (1, 8, 64)
        for metric in ("per_s", "mb_s", "p50_ms", "p99_ms")
    ]
)


@pytest.mark.slow_bench  # run by `make bench`, not `make test` (pyproject.toml markers)
def test_store_bench_quick_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--json",
            "--seconds",
            "0.3",
            "--warmup",
            "0.05",
            "--seq-mib",
            "16",
            "--fill",
            "5000",
            "--dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)  # exactly one JSON object, nothing else on stdout
    assert isinstance(res, dict)
    assert "append_100b_sync_64p_per_s" in CONTRACT_KEYS
    for key in CONTRACT_KEYS:
        assert key in res, key
        v = res[key]
        assert isinstance(v, int | float) and math.isfinite(v) and v > 0, (key, v)
    assert not (tmp_path / "data").exists()  # the temporary data dirs are removed
