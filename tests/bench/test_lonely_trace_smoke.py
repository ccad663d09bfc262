"""Smoke test of bench/lonely_trace.py: short windows of the MQTT flow (the gateway and Mosquitto)
and of the AMQP flow (the gateway) print one JSON object whose counts come from the windows they
name: every message delivered, system calls counted by strace for both servers, the gateway's Python
counts from its hook."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.bench.support import positive, run_bench, share

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "lonely_trace.py"
pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace (deps/debian-packages.txt)")


def _check(r: dict, *, python: bool) -> None:
    assert not r["errors"], r["errors"]
    assert r["delivered_share"] == 1.0, r  # one message at a time: nothing may be left behind
    names = ["plain", "strace", *(["python"] if python else [])]
    assert [w["window"] for w in r["windows"]] == names
    # (40 msg/s for 1 s, one at a time: a loaded host gets fewer through, and with strace attached
    # to every thread a message may cost 17 ms of the server's CPU: that window needs only one)
    assert all(
        w["messages"] >= (1 if w["window"] == "strace" else 10)
        and share(w["host_steal"])
        and share(w["other_util"])
        for w in r["windows"]
    ), r["windows"]
    assert r["cpu_us_per_msg"] == r["windows"][0]["cpu_us_per_msg"] and positive(r["cpu_us_per_msg"])
    sc = r["syscalls_per_msg"]
    # each message is at least read and answered: a read and a write per message, and a wake-up
    assert sc["read"] >= 1 and sc["write"] >= 1 and sc["epoll_wait"] >= 1, sc
    assert sc["total"] == pytest.approx(sum(v for k, v in sc.items() if k != "total"), abs=0.1)
    if python:
        py = r["python_per_msg"]
        assert py["py_calls"] >= 10 and py["c_calls"] >= 1, py  # the hook counted the gateway's frames
    else:
        assert "python_per_msg" not in r


def test_mqtt_flow_counts_both_servers() -> None:
    cmd = [sys.executable, str(SCRIPT), "--flow", "mqtt", "--rate", "40", "--seconds", "1", "--json"]
    res, _, _ = run_bench(cmd, 120)
    assert (res["flow"], res["rate"]) == ("mqtt", 40.0)
    assert set(res["brokers"]) == {"gateway", "mosquitto"}
    _check(res["brokers"]["gateway"], python=True)
    _check(res["brokers"]["mosquitto"], python=False)
    assert res["brokers"]["gateway"]["syscalls_per_msg"]["pwrite"] >= 1  # the gateway stores each message


def test_amqp_flow_counts_the_gateway() -> None:
    cmd = [sys.executable, str(SCRIPT), "--flow", "amqp", "--rate", "40", "--seconds", "1", "--json"]
    res, _, _ = run_bench(cmd, 120)
    assert set(res["brokers"]) == {"gateway"}
    _check(res["brokers"]["gateway"], python=True)
