"""Smoke test of bench/amqp_bench.py's fixed-rate phase (`--phases fixed`): a tiny run against our
gateway (and RabbitMQ when AMQP_BENCH_RABBITMQ=1 and it is installed, as the main smoke test does)
prints the new keys with positive figures within 45 s; and the `fixpub` role of the load generator
never has more than its window unconfirmed."""

from __future__ import annotations

import asyncio
import os
import struct
import sys
import time
from pathlib import Path

from tests.bench.support import positive, run_bench, share

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "amqp_bench.py"
LIMIT_S = 45
RATE = 500.0

FIXED_FIGURES = [
    "fixed_publish_msgs_per_s",
    "fixed_delivered_msgs_per_s",
    "fixed_p50_ms",
    "fixed_p99_ms",
    "cpu_us_per_fixed_msg",
]


def test_amqp_fixed_rate_json(tmp_path: Path) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    from amqp_servers import rabbitmq_script

    rabbit = os.environ.get("AMQP_BENCH_RABBITMQ") == "1" and rabbitmq_script() is not None
    brokers = "gateway,rabbitmq" if rabbit else "gateway"
    limit = LIMIT_S + (30 if rabbit else 0)
    cmd = [sys.executable, str(SCRIPT), "--brokers", brokers, "--phases", "fixed"]
    cmd += ["--fixed-rate", str(RATE), "--duration", "1", "--warmup", "0.3", "--quiet-wait", "0"]
    cmd += ["--auth-rounds", "0", "--json", "--dir", str(tmp_path)]
    res, err, elapsed = run_bench(cmd, limit)
    for name in brokers.split(","):
        b = res["brokers"][name]
        assert "error" not in b, b["error"]
        d = b["phases"]["fixed"]
        assert "error" not in d and not d["errors"], (name, d)
        for key in FIXED_FIGURES:
            assert positive(b["figures"][key]), (name, key, b["figures"][key], err[-3000:])
        assert d["nacks"] == 0 and d["inflight_max"] <= 100, (name, d)
        # paced, not flat out (a loose band: shared CI host)
        assert 0.5 * RATE <= d["fixed_publish_msgs_per_s"] <= 1.2 * RATE, (name, d)
        assert d["delivered"] > 0 and d["fixed_p50_ms"] <= d["fixed_p99_ms"], (name, d)
        assert d["server_processes"] >= 1 and positive(d["cpu_us_per_fixed_msg_main_process"]), (name, d)
        assert d["cpu_us_per_fixed_msg_main_process"] <= d["cpu_us_per_fixed_msg"], (name, d)
        assert share(d["other_util"]) and share(d["host_steal"]), (name, d)
    assert res["fixed_cpu_us_per_msg"] == res["brokers"]["gateway"]["figures"]["cpu_us_per_fixed_msg"]
    assert res["targets"]["cpu_ratio_vs_rabbitmq_at_3k"] == "<= 0.5"
    if rabbit:
        assert positive(res["cpu_ratio_vs_rabbitmq_at_3k"])
        assert positive(res["rabbitmq_fixed_cpu_us_per_msg"])
    else:
        assert res["cpu_ratio_vs_rabbitmq_at_3k"] is None
    assert elapsed < limit
    assert list(tmp_path.iterdir()) == []  # work directories are removed


def test_fixpub_keeps_its_window() -> None:
    """A `fixpub` paced far faster than its confirms arrive never has more than `window` messages
    unconfirmed, and counts the writes the window held back."""
    sys.path.insert(0, str(SCRIPT.parent))
    from amqp_loadgen import Job, Role, Spec

    window = 5

    class _Writer:
        def __init__(self) -> None:
            self.sent = 0

        def write(self, data: bytes) -> None:
            self.sent += data.count(b"P")

    class _Conn:
        """Confirms everything written so far (`multiple`) every 10 ms, checking the window first."""

        def __init__(self) -> None:
            self.writer = _Writer()
            self.max_unconfirmed = 0
            self.confirmed = 0

        async def frames(self) -> list[tuple[int, bytes]]:
            await asyncio.sleep(0.01)
            self.max_unconfirmed = max(self.max_unconfirmed, self.writer.sent - self.confirmed)
            self.confirmed = self.writer.sent
            ack = struct.pack(">HHQB", 60, 80, self.confirmed, 1)
            return [(1, ack)]

    async def go() -> tuple[Role, _Conn]:
        role = Role(Spec("fixpub", 0, "q"), Job("127.0.0.1", 0, rate=20_000.0, window=window))
        conn = _Conn()
        role.conn = conn  # type: ignore[assignment]
        role._publish_frame = lambda body: b"P"  # type: ignore[method-assign]
        now = time.monotonic()
        await role.run(now, now, now + 0.3)
        return role, conn

    role, conn = asyncio.run(go())
    assert role.error is None, role.error
    assert 0 < conn.max_unconfirmed <= window
    # 10 ms per confirm round, at most `window` a round: far below 20,000/s, so the window held it back
    assert 0 < role.sent <= window * 40 and role.behind > 0
    assert role.final == role.sent  # drained: every write confirmed
