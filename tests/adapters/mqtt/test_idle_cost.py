"""What an idle MQTT connection holds (issue 48 item 2, docs/performance.md "Idle device memory"):
no timer or task of its own (keep-alive is a slot of the loop's deadline wheel), and a bounded
number of Python bytes, counted with tracemalloc in the gateway while the clients run in another
process. The keep-alive 1.5x rule with the wheel: paho-mqtt clients that stop pinging and that ping."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import time
import tracemalloc

import paho.mqtt.client as paho
import pytest

from runtime.deadlines import DeadlineWheel
from tests.adapters.mqtt.support import close_env, open_env
from tests.support import wait_until

N = 200
# Python bytes per idle clean-session connection subscribed to its own topic, in the gateway process
# (asyncio's pure-Python transport included): measured 4.3 KB with the wheel and lazy state, 9.8 KB
# before (a TimerHandle, two asyncio.Event deques, two deques and two sets per connection)
MAX_BYTES_PER_CONN = 6_000

CLIENTS = r"""
import socket, struct, sys
port, n, ka = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def s(b): return struct.pack("!H", len(b)) + b
socks = []
for i in range(n):
    c = socket.create_connection(("127.0.0.1", port))
    p = s(b"MQTT") + bytes([4, 2]) + struct.pack("!H", ka) + s(f"idle-{i}".encode())
    c.sendall(bytes([0x10, len(p)]) + p)
    assert c.recv(4)[0] == 0x20
    t = f"dev/{i}/cmd".encode()
    p = struct.pack("!H", 1) + s(t) + b"\x01"
    c.sendall(bytes([0x82, len(p)]) + p)
    assert c.recv(5)[0] == 0x90
    socks.append(c)
print("ready", flush=True)
sys.stdin.read()
"""


def scheduled(loop: asyncio.AbstractEventLoop) -> int:
    return len(loop._scheduled)  # type: ignore[attr-defined]  # asyncio's base loop


async def connect_idle(port: int, n: int, ka: int = 60) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENTS, str(port), str(n), str(ka)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = await asyncio.to_thread(proc.stdout.readline)  # type: ignore[union-attr]
    assert line.strip() == "ready"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()  # type: ignore[union-attr]
    proc.wait(10)


@pytest.fixture
async def env(tmp_path):
    e = await open_env(str(tmp_path / "d"))
    yield e
    await close_env(e)


async def test_idle_connections_hold_no_timer_or_task(env):
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0.2)  # let the core's own start-up timers settle
    timers0, tasks0 = scheduled(loop), len(asyncio.all_tasks())
    proc = await connect_idle(env.port, N)
    try:
        await wait_until(lambda: len(env.adapter.connections) == N)
        await asyncio.sleep(0.2)  # SUBACKs written: the replies' tasks end
        assert scheduled(loop) - timers0 <= 3  # one wheel timer for all (was one TimerHandle each)
        assert len(asyncio.all_tasks()) - tasks0 <= 3
        for c in env.adapter.connections:
            s = c.session
            assert not s._tasks and not s._replies and not s.queue and not s._wbuf
            assert not hasattr(s, "__dict__")
    finally:
        stop(proc)


async def test_idle_connection_python_bytes_are_bounded(env):
    await asyncio.sleep(0.2)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        proc = await connect_idle(env.port, N)
        try:
            await wait_until(lambda: len(env.adapter.connections) == N)
            await asyncio.sleep(0.3)
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            stop(proc)
    finally:
        tracemalloc.stop()
    grown = sum(d.size_diff for d in after.compare_to(before, "filename"))
    per_conn = grown / N
    assert per_conn < MAX_BYTES_PER_CONN, f"{per_conn:.0f} B per idle connection"


def paho_client(port: int, keepalive: int) -> tuple[paho.Client, threading.Event]:
    gone = threading.Event()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"ka-{time.monotonic_ns()}")
    c.on_disconnect = lambda *a: gone.set()
    c.connect("127.0.0.1", port, keepalive=keepalive)
    return c, gone


async def test_a_client_that_stops_pinging_is_closed_after_one_and_a_half_keep_alives(env):
    c, _ = paho_client(env.port, 1)
    c.loop_start()
    await wait_until(c.is_connected)
    t_connack = time.monotonic()
    await asyncio.to_thread(c.loop_stop)  # no more PINGREQs (one may have gone before it stopped)
    t_stop = time.monotonic()  # the client's last packet was sent before this
    sock = c.socket()
    sock.settimeout(5)
    got = b""
    while chunk := await asyncio.to_thread(sock.recv, 16):
        got += chunk
    closed = time.monotonic()
    assert got in (b"", b"\xd0\x00"), got  # at most a PINGRESP; 3.1.1 has no DISCONNECT from the server
    assert closed - t_connack >= 1.45  # not before 1.5 x keep-alive after its last packet
    assert closed - t_stop < 3.0, closed - t_stop  # nor much after (the wheel's slots are 0.25 s)
    await wait_until(lambda: len(env.adapter.connections) == 0)


async def test_a_pinging_client_stays_connected(env):
    c, gone = paho_client(env.port, 1)
    c.loop_start()
    try:
        await wait_until(c.is_connected)
        await asyncio.sleep(3.5)  # over twice 1.5 x keep-alive: only its PINGREQs keep it open
        assert c.is_connected() and not gone.is_set()
    finally:
        c.disconnect()
        c.loop_stop()


async def test_wheel_never_fires_before_a_deadline_and_forgets_cancelled_items():
    loop = asyncio.get_running_loop()
    fired: list[tuple[str, float]] = []

    class Item:
        def __init__(self, name: str, when: float) -> None:
            self.name, self.when = name, when

        def deadline(self) -> None:
            fired.append((self.name, loop.time()))

    w = DeadlineWheel(loop, 0.05)
    now = loop.time()
    items = [Item(f"i{k}", now + 0.02 * k) for k in range(1, 11)]
    slots = [w.schedule(i, i.when) for i in items]
    gone = items.pop(3)
    w.cancel(gone, slots.pop(3))
    assert scheduled(loop) >= 1 and len(w) == 9
    await wait_until(lambda: len(fired) == 9)
    by_name = {i.name: i.when for i in items}
    assert all(t >= by_name[n] for n, t in fired)  # never early
    assert gone.name not in {n for n, _ in fired} and len(w) == 0
