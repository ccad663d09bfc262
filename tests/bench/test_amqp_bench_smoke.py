"""Smoke test of bench/amqp_bench.py: a quick run against our gateway (and RabbitMQ when
`run_rabbitmq` is asked for with AMQP_BENCH_RABBITMQ=1 and Debian's rabbitmq-server is installed)
prints one JSON object with the contract keys and positive figures, the auth on / off round
included (`confirms_auth_ratio`), within 45 s (one gateway more for the auth round)."""

from __future__ import annotations

import asyncio
import os
import struct
import sys
from pathlib import Path

import pytest

from tests.bench.support import positive, run_bench

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "amqp_bench.py"
LIMIT_S = 45  # gateway only

FIGURES = [
    "confirms_msgs_per_s",
    "consume_msgs_per_s",
    "p50_ms",
    "p99_ms",
    "cpu_us_per_msg",
    "cpu_us_per_consumed_msg",
]


@pytest.mark.slow_bench  # run by `make bench`, not `make test` (pyproject.toml markers)
def test_amqp_bench_quick_json(tmp_path: Path) -> None:
    brokers = "gateway"
    sys.path.insert(0, str(SCRIPT.parent))
    from amqp_servers import rabbitmq_script

    if os.environ.get("AMQP_BENCH_RABBITMQ") == "1" and rabbitmq_script():
        brokers = "gateway,rabbitmq"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--brokers", brokers, "--json", "--dir", str(tmp_path)]
    res, err, elapsed = run_bench(cmd, LIMIT_S + (30 if "rabbitmq" in brokers else 0))
    for key in [
        "confirms_ratio_vs_rabbitmq",
        "consume_ratio_vs_rabbitmq",
        "cpu_us_per_msg",
        "rabbitmq_cpu_us_per_msg",
        "confirms_auth_ratio",
    ]:
        assert key in res, key
    assert positive(res["cpu_us_per_msg"]), err[-3000:]
    for name in brokers.split(","):
        b = res["brokers"][name]
        assert "error" not in b, b["error"]
        for phase, d in b["phases"].items():
            assert "error" not in d and not d.get("errors"), (name, phase, d)
        for key in FIGURES:
            assert positive(b["figures"][key]), (name, key, b["figures"][key])
    g = res["brokers"]["gateway"]["phases"]
    assert g["confirms"]["nacks"] == 0
    assert g["consume"]["consumed"] == g["consume"]["backlog"] > 0  # every confirmed message consumed
    if "rabbitmq" in brokers:
        assert positive(res["confirms_ratio_vs_rabbitmq"]) and positive(res["rabbitmq_cpu_us_per_msg"])
    else:
        assert res["confirms_ratio_vs_rabbitmq"] is None
    auth = res["auth"]
    assert positive(res["confirms_auth_ratio"]) and len(auth["rounds"]) == 1, auth
    on = auth["rounds"][0]["on"]
    assert "error" not in on and on["info"]["acl_rules"] == 1000, on
    assert "--auth" in on["info"]["command"]
    c = on["phases"]["confirms"]
    assert c["nacks"] == 0 and not c["errors"] and positive(c["confirms_msgs_per_s"]), c
    assert elapsed < LIMIT_S + (30 if "rabbitmq" in brokers else 0)
    assert list(tmp_path.iterdir()) == []  # work directories are removed


def test_loadgen_frame_reader_handles_split_reads() -> None:
    """The generator's frame reader reassembles frames across arbitrary read boundaries and keeps
    frames that follow the one `expect` waited for (deliveries right after consume-ok)."""
    sys.path.insert(0, str(SCRIPT.parent))
    from amqp_loadgen import Conn

    def method(cls: int, mid: int, args: bytes = b"") -> bytes:
        p = struct.pack(">HH", cls, mid) + args
        return struct.pack(">BHI", 1, 1, len(p)) + p + b"\xce"

    stream = method(60, 21, b"\x01c") + method(60, 60, b"\x01c" + struct.pack(">Q", 7) + b"\x00\x00\x01q")

    class _Reader:
        def __init__(self, data: bytes, chunk: int) -> None:
            self.parts = [data[i : i + chunk] for i in range(0, len(data), chunk)]

        async def read(self, n: int) -> bytes:
            return self.parts.pop(0) if self.parts else b""

    async def go(chunk: int) -> None:
        c = Conn()
        c.reader = _Reader(stream, chunk)  # type: ignore[assignment]
        await c.expect(60, 21)
        frames = await c.frames()
        assert [(t, p[:4]) for t, p in frames] == [(1, b"\x00\x3c\x00\x3c")]
        assert struct.unpack_from(">Q", frames[0][1], 6)[0] == 7

    for chunk in (1, 5, len(stream)):
        asyncio.run(go(chunk))
