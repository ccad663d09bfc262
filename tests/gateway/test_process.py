"""`gateway start` as a real process: listener log lines, /healthz, the admin CLI against it,
clean exit on SIGTERM/SIGINT, and clear failures for a busy port or a locked data directory."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time

import httpx
import pytest

from conformance.gateway_proc import GATEWAY
from tests.gateway.support import PROTOCOLS, Proc, start


def wait_healthy(url: str, timeout: float = 10) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = httpx.get(url + "/healthz", timeout=2)
            if r.status_code == 200 or time.monotonic() > deadline:
                return r
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def cli(*args: str, url: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    if url:
        env["GATEWAY_URL"] = url
    return subprocess.run(GATEWAY + list(args), capture_output=True, text=True, env=env, timeout=60)


def stop(proc: Proc, sig: signal.Signals, *, group: bool = False) -> tuple[int, float, str]:
    t0 = time.monotonic()
    if group:
        os.killpg(proc.p.pid, sig)
    else:
        proc.p.send_signal(sig)
    try:
        rc = proc.p.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"gateway did not exit within 15 s of {sig.name}:\n{proc.drain()}")
    return rc, time.monotonic() - t0, proc.drain()


def test_start_serve_admin_cli_and_sigterm(tmp_path):
    proc, listeners = start(tmp_path)
    try:
        assert set(listeners) == set(PROTOCOLS.split(","))
        for name, addr in listeners.items():
            assert re.fullmatch(r"127\.0\.0\.1:\d+", addr) and not addr.endswith(":0"), (name, addr)
        url = f"http://{listeners['http']}"
        r = wait_healthy(url)
        assert r.status_code == 200
        assert r.json()["listeners"] == listeners
        if "grpc" in listeners:  # the gRPC port really accepts connections
            host, port = listeners["grpc"].rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=5).close()

        # Admin CLI against the running gateway (URL from GATEWAY_URL, or --url).
        r = cli("topic", "create", "orders", "--queues", "3", url=url)
        assert r.returncode == 0, r.stderr
        assert re.search(r"^orders\s+3\s+0\b", r.stdout, re.M), r.stdout
        r = cli("topic", "create", "events", "--url", url, "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["queues"] == 8
        r = cli("topic", "create", "shadows", "--compacted", "--url", url, "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["compacted"] is True, r.stderr
        r = cli("topic", "list", "--url", url, "--json")
        assert r.returncode == 0
        listed = {t["name"]: t["compacted"] for t in json.loads(r.stdout)}
        assert listed == {"events": False, "orders": False, "shadows": True}
        r = cli("topic", "delete", "shadows", "--url", url)
        assert r.returncode == 0, r.stderr
        r = cli("topic", "list", url=url)
        assert r.returncode == 0
        assert r.stdout.splitlines()[0].split()[:3] == ["NAME", "QUEUES", "MESSAGES"]
        assert [line.split()[0] for line in r.stdout.splitlines()[1:]] == ["events", "orders"]
        r = cli("topic", "get", "orders", url=url)
        assert r.returncode == 0 and len(re.findall(r"^[012]\s+0\s+0$", r.stdout, re.M)) == 3, r.stdout

        r = cli("group", "create", "billing", "--max-attempts", "2", "--retry-initial-ms", "10", url=url)
        assert r.returncode == 0, r.stderr
        r = cli("group", "list", "--json", url=url)
        assert r.returncode == 0
        (g,) = json.loads(r.stdout)
        assert (g["name"], g["max_attempts"], g["retry_initial_ms"]) == ("billing", 2, 10)
        r = cli("group", "list", url=url)
        assert r.returncode == 0 and re.search(r"^billing\s+2\s+10\s", r.stdout, re.M), r.stdout

        r = cli("topic", "delete", "orders", url=url)
        assert r.returncode == 0 and "deleted topic orders" in r.stdout
        r = cli("topic", "delete", "orders", url=url)
        assert r.returncode == 1
        assert r.stderr.strip() == "gateway: 404 topic orders does not exist"
        r = cli("topic", "create", "bad name", url=url)
        assert r.returncode == 1 and r.stderr.startswith("gateway: 400 illegal topic")
        assert [t["name"] for t in httpx.get(url + "/admin/topics").json()] == ["events"]

        # A second gateway on the same busy HTTP port fails with a clear message.
        port = listeners["http"].rsplit(":", 1)[1]
        other = Proc(
            ["start", "--data-dir", str(tmp_path / "other"), "--protocols", "http", "--http-port", port]
        )
        rc = other.p.wait(30)
        out = other.drain()
        assert rc == 1, out
        assert re.search(rf"ERROR gateway: http cannot listen on 127\.0\.0\.1:{port}: .*in use", out), out
        assert "Traceback" not in out
        # ... and so does one on the same (locked) data directory.
        same = Proc(
            ["start", "--data-dir", str(tmp_path / "data"), "--protocols", "http", "--http-port", "0"]
        )
        rc = same.p.wait(30)
        out = same.drain()
        assert rc == 1, out
        assert re.search(r"ERROR gateway: cannot open the store at .*in use by another process", out), out

        rc, took, out = stop(proc, signal.SIGTERM)
        assert rc == 0, out
        assert took < 10
        assert "SIGTERM received, shutting down" in out
        assert "store closed" in out and "gateway stopped in" in out
        assert "Traceback" not in out and " ERROR " not in out, out
    finally:
        proc.kill()
    # The topics survived the restart-free stop: the store was closed cleanly and reopens.
    proc, listeners = start(tmp_path)
    try:
        r = httpx.get(f"http://{listeners['http']}/admin/topics")
        assert [t["name"] for t in r.json()] == ["events"]
    finally:
        rc, _, out = stop(proc, signal.SIGTERM)
        assert rc == 0, out


@pytest.mark.parametrize("group", [False, True], ids=["process", "process-group"])
def test_sigint_exits_cleanly(tmp_path, group):
    # process-group: what Ctrl-C in a terminal does (every process of the group gets SIGINT,
    # the store's fsync helper included; flush=sync is the default, so the helper exists).
    proc, listeners = start(tmp_path, new_session=group)
    try:
        url = f"http://{listeners['http']}"
        assert wait_healthy(url).status_code == 200
        r = httpx.post(url + "/admin/topics", json={"name": "t"})
        assert r.status_code == 201
        rc, took, out = stop(proc, signal.SIGINT, group=group)
        assert rc == 0, out
        assert took < 10
        assert "SIGINT received, shutting down" in out
        assert "Traceback" not in out and " ERROR " not in out, out
    finally:
        proc.kill()


def test_bad_settings_exit_2_with_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["GATEWAY_HTTP_PORT"] = "not-a-port"
    r = subprocess.run(
        GATEWAY + ["start", "--data-dir", str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert r.returncode == 2
    assert r.stderr.strip() == "gateway: GATEWAY_HTTP_PORT must be an integer, got 'not-a-port'"
    r = cli("start", "--protocols", "http,smtp")
    assert r.returncode == 2 and "unknown protocol 'smtp'" in r.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_admin_cli_reports_an_unreachable_gateway():
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["topic", "list"], ["group", "list"], ["topic", "create", "x"], ["group", "create", "g"]):
        r = cli(*args, "--url", url)
        assert r.returncode == 1, args
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"gateway: cannot reach the gateway at {url}"), lines


@pytest.mark.skipif("grpc" not in PROTOCOLS, reason="no gRPC adapter in this tree yet")
def test_busy_grpc_port_stops_everything_and_exits_1(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = Proc(
            ["start", "--data-dir", str(tmp_path / "d"), "--protocols", PROTOCOLS]
            + ["--grpc-port", str(port), "--http-port", "0"]
        )
        rc = proc.p.wait(30)
    out = proc.drain()
    assert rc == 1, out
    assert re.search(rf"ERROR gateway: grpc .*127\.0\.0\.1:{port}", out), out
    assert "store closed" in out and "gateway ready" not in out and "http listening" not in out
    # The data directory was released: it opens again at once.
    proc, _ = start(tmp_path)  # same data directory
    rc, _, out = stop(proc, signal.SIGTERM)
    assert rc == 0, out
