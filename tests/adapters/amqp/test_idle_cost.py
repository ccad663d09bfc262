"""Idle AMQP connections (issue 48 item 2): their heartbeat ticks are slots of the loop's deadline
wheel (runtime/deadlines.py), not a TimerHandle each, and heartbeats still work both ways with pika:
the gateway sends them, a client that heartbeats stays, a silent one is closed after 2 x the
interval."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pika
import pytest

from tests.adapters.amqp.support import close_env, open_env
from tests.support import wait_until

N = 50
CLIENTS = r"""
import sys, pika
port, n = int(sys.argv[1]), int(sys.argv[2])
guest = pika.PlainCredentials("guest", "guest")
params = pika.ConnectionParameters("127.0.0.1", port, credentials=guest, heartbeat=60)
conns = [pika.BlockingConnection(params) for _ in range(n)]
chans = [c.channel() for c in conns]
print("ready", flush=True)
sys.stdin.read()
"""


def timers(loop: asyncio.AbstractEventLoop) -> int:
    """Live timers of asyncio's base loop (cancelled ones stay in its heap until they come up)."""
    return sum(not h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]


@pytest.fixture
async def env(tmp_path):
    e = await open_env(str(tmp_path / "d"))
    yield e
    await close_env(e)


async def test_idle_connections_hold_no_timer_each(env):
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0.2)
    timers0 = timers(loop)
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENTS, str(env.port), str(N)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "ready"  # type: ignore[union-attr]
        await wait_until(lambda: len(env.adapter.connections) == N)
        await asyncio.sleep(0.2)
        assert timers(loop) - timers0 <= 3  # was one per connection
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(10)


def blocking(env, heartbeat: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(env.pika_params(heartbeat=heartbeat))


async def test_a_silent_client_is_closed_after_two_heartbeat_intervals(env):
    conn = await asyncio.to_thread(blocking, env, 1)
    t0 = time.monotonic()  # from here pika sends nothing: it is never given the thread again
    await wait_until(lambda: len(env.adapter.connections) == 1)
    await wait_until(lambda: len(env.adapter.connections) == 0, timeout=6)
    elapsed = time.monotonic() - t0
    assert 2.0 <= elapsed < 4.5, elapsed  # more than 2 x heartbeat without a frame, checked per half
    with pytest.raises(pika.exceptions.AMQPError):
        await asyncio.to_thread(conn.process_data_events, 1)


async def test_a_heartbeating_client_stays_and_hears_heartbeats(env):
    conn = await asyncio.to_thread(blocking, env, 1)
    try:
        await wait_until(lambda: len(env.adapter.connections) == 1)
        (session,) = [p.conn for p in env.adapter.connections]
        rx0 = session.last_rx
        # pika answers and sends heartbeats only while it runs: 3.5 s > 2 x the 1 s interval
        await asyncio.to_thread(conn.sleep, 3.5)
        assert conn.is_open and len(env.adapter.connections) == 1
        assert session.last_rx > rx0  # the client's heartbeats arrived
    finally:
        await asyncio.to_thread(conn.close)
