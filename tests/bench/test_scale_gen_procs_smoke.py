"""Smoke test of bench/scale_bench.py `--gen-procs`: the idle fleet spread over two generator
processes (bench/scale_gen.py) against Mosquitto (it starts at once: a few seconds in all), every
device connected and subscribed, and the commands collected from the children all delivered once."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.bench.support import positive, run_bench, share

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "scale_bench.py"


@pytest.mark.skipif(shutil.which("mosquitto") is None, reason="Mosquitto is not installed")
def test_scale_bench_gen_procs() -> None:
    cmd = [sys.executable, str(SCRIPT), "--servers", "mosquitto", "--phases", "idle,commands"]
    res, _, _ = run_bench([*cmd, "--gen-procs", "2", "--conns", "200", "--quick", "--json"], 60)
    d = res["mosquitto"]
    assert res["config"]["gen_procs"] == d["idle_gen_procs"] == 2, res["config"]
    assert d["idle_conns"] == 200 and d["idle_persistent"] == 100, d
    assert d["idle_tree_procs"] == 1 and d["idle_worker_conns"] == [], d
    for k in ("idle_store_rss_mib_before", "idle_store_rss_mib_after", "connects_per_s"):
        assert positive(d[k]), (k, d)
    assert share(d["idle_tree_rss_kib"]), d  # 200 devices: a few pages, maybe none
    assert d["commands_delivered"] == d["commands_sent"] == 100, d
    assert d["commands_duplicates"] == d["commands_misrouted"] == 0, d
