"""remoting/server.py's FrameServer on its own, over a real socket with a stub handler: the per-connection
in-flight cap and SYSTEM_BUSY, refusing while not accepting, oneway requests never answered, the
connection closed on a codec error, drain and abort. (The 4.x adapter, the name server and the store
node each run one; their own tests cover what they dispatch.)"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator

import pytest

from remoting import RemotingCommand, ResponseCode
from remoting.client import RemotingClient
from remoting.server import FrameConnection, FrameServer, close_tcp, serve_tcp
from tests.support import T

CODE = 4242  # the frame server does not look at request codes
log = logging.getLogger("test.frame_server")


class Handler:
    """A FrameHandler that records what it is given and holds every request until `release` is set."""

    def __init__(self) -> None:
        self.seen: list[RemotingCommand] = []
        self.release = asyncio.Event()
        self.release.set()
        self.running = 0
        self.changed = asyncio.Event()  # set whenever `seen` or `running` changes
        self.opened_conns: list[FrameConnection] = []
        self.closed_conns: list[FrameConnection] = []
        self.lost = asyncio.Event()  # set once a connection closed

    async def dispatch(self, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        self.seen.append(cmd)
        self.running += 1
        self.changed.set()
        try:
            await self.release.wait()
        finally:
            self.running -= 1
            self.changed.set()
        return cmd.response(ResponseCode.SUCCESS, remark=cmd.ext_fields.get("n"))

    def opened(self, conn: FrameConnection) -> None:
        self.opened_conns.append(conn)

    def closed(self, conn: FrameConnection) -> None:
        self.closed_conns.append(conn)
        self.lost.set()

    async def until(self, cond) -> None:
        async def wait() -> None:
            while not cond():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), T)


class Served:
    def __init__(self, server: FrameServer, handler: Handler, port: int) -> None:
        self.server, self.handler, self.port = server, handler, port
        self.clients: list[RemotingClient] = []

    async def client(self) -> RemotingClient:
        c = await RemotingClient.connect("127.0.0.1", self.port)
        self.clients.append(c)
        return c


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    handler = Handler()
    server = FrameServer(handler, name="test", log=log, max_inflight=2)
    srv, address = await serve_tcp(server, "127.0.0.1", 0)
    s = Served(server, handler, int(address.rsplit(":", 1)[1]))
    try:
        yield s
    finally:
        handler.release.set()
        for c in s.clients:
            await c.close()
        server.abort()
        await close_tcp(srv)


def request(c: RemotingClient, n: int) -> asyncio.Task[RemotingCommand]:
    return asyncio.ensure_future(c.invoke(CODE, {"n": n}, timeout=T))


async def test_requests_beyond_the_in_flight_cap_get_system_busy(served):
    h = served.handler
    h.release.clear()
    c = await served.client()
    held = [request(c, 1), request(c, 2)]
    await h.until(lambda: h.running == 2)
    busy = await c.invoke(CODE, {"n": 3}, timeout=T)
    assert busy.code == ResponseCode.SYSTEM_BUSY and busy.remark == "[OVERLOAD] too many requests in flight"
    c.oneway(CODE, {"n": 4})  # beyond the cap too: dropped, never answered
    busy = await c.invoke(CODE, {"n": 5}, timeout=T)  # after the oneway on the same connection
    assert busy.code == ResponseCode.SYSTEM_BUSY
    assert [cmd.ext_fields["n"] for cmd in h.seen] == ["1", "2"]
    assert len(served.server.running()) == 2
    other = await served.client()  # the cap is per connection
    third = request(other, 6)
    await h.until(lambda: h.running == 3)
    h.release.set()
    replies = await asyncio.gather(*held, third)
    assert [(r.code, r.remark) for r in replies] == [(ResponseCode.SUCCESS, n) for n in ("1", "2", "6")]
    assert (await c.invoke(CODE, {"n": 7}, timeout=T)).code == ResponseCode.SUCCESS  # room again


async def test_client_invoke_times_out_and_a_late_reply_is_dropped(served):
    """RemotingClient.invoke raises TimeoutError once its timeout passes without a reply (its own
    timer, not asyncio.wait_for); the reply that comes later is dropped and the connection serves on."""
    h = served.handler
    h.release.clear()
    c = await served.client()
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await c.invoke(CODE, {"n": 1}, timeout=0.2)
    assert 0.15 <= asyncio.get_running_loop().time() - t0 < T
    assert c._pending == {}
    h.release.set()
    r = await c.invoke(CODE, {"n": 2}, timeout=T)
    assert (r.code, r.remark) == (ResponseCode.SUCCESS, "2")  # not the late reply to 1
    assert not c.closed.is_set()


async def test_not_accepting_answers_system_busy_and_drops_oneway(served):
    served.server.accepting = False
    c = await served.client()
    c.oneway(CODE, {"n": 1})
    r = await c.invoke(CODE, {"n": 2}, timeout=T)
    assert r.code == ResponseCode.SYSTEM_BUSY and r.remark == "[OVERLOAD] shutting down"
    assert served.handler.seen == [] and c.requests == []  # nothing dispatched, nothing sent back
    served.server.accepting = True
    assert (await c.invoke(CODE, {"n": 3}, timeout=T)).code == ResponseCode.SUCCESS


async def test_oneway_requests_are_dispatched_but_never_answered(served):
    h = served.handler
    c = await served.client()
    c.oneway(CODE, {"n": 1})
    r = await c.invoke(CODE, {"n": 2}, timeout=T)
    assert r.code == ResponseCode.SUCCESS and r.remark == "2"
    await h.until(lambda: len(h.seen) == 2 and h.running == 0)
    assert [cmd.is_oneway for cmd in h.seen] == [True, False]
    assert c.requests == []  # no frame other than the one response came back


async def test_a_codec_error_closes_the_connection(served):
    h = served.handler
    c = await served.client()
    assert (await c.invoke(CODE, {"n": 1}, timeout=T)).code == ResponseCode.SUCCESS
    (conn,) = h.opened_conns
    assert conn in served.server.connections and conn.remote.startswith("127.0.0.1:")
    c.send_raw(struct.pack(">II", 10, 6) + b"{bad}!")  # a JSON header that does not parse
    await asyncio.wait_for(c.closed.wait(), T)
    await asyncio.wait_for(h.lost.wait(), T)
    assert h.closed_conns == [conn] and conn.closed and not served.server.connections
    other = await served.client()  # the listener itself goes on
    assert (await other.invoke(CODE, {"n": 2}, timeout=T)).code == ResponseCode.SUCCESS


async def test_drain_waits_for_running_requests_and_abort_closes_connections(served):
    h, server = served.handler, served.server
    h.release.clear()
    c = await served.client()
    held = request(c, 1)
    await h.until(lambda: h.running == 1)
    await server.drain(0)  # no grace: returns at once
    assert len(server.running()) == 1
    drained = asyncio.ensure_future(server.drain(T))
    h.release.set()
    await asyncio.wait_for(drained, T)
    assert server.running() == [] and h.running == 0  # drain returned once the request was done
    assert (await held).code == ResponseCode.SUCCESS
    server.abort()
    await asyncio.wait_for(c.closed.wait(), T)
    await asyncio.wait_for(h.lost.wait(), T)
    assert not server.connections
