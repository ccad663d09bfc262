"""The push deliveries' HTTP/1.1 client (adapters/cloudevents/webhook.py) against raw asyncio servers
that answer exactly as scripted: keep-alive reuse, chunked and close-delimited bodies, interim 1xx
answers, a server that drops idle connections, timeouts, refused connections, limits."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable

import pytest

from adapters.cloudevents.webhook import WebhookClient, WebhookError, WebhookTimeout

Handler = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


class RawServer:
    """Reads one request head + Content-Length body at a time and lets `handler` answer; the
    handler returns False to close the connection afterwards."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    def url(self, path: str = "/hook") -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(head + body)
                if not await self.handler(head + body, reader, writer):
                    return
        finally:
            writer.close()


def answer(raw: bytes) -> Handler:
    async def handler(req: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        return True

    return handler


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@pytest.fixture
async def client():
    c = WebhookClient(keepalive_expiry=5.0)
    yield c
    await c.aclose()


async def test_keep_alive_reuses_one_connection(client):
    async with RawServer(answer(OK)) as srv:
        for _ in range(5):
            r = await client.request("POST", srv.url(), [("ce-id", "1")], b"{}", timeout=5)
            assert (r.status, r.content, r.header("content-length")) == (200, b"ok", "2")
        assert srv.connections == 1
        head = srv.requests[0].split(b"\r\n\r\n")[0].decode()
        assert head.startswith("POST /hook HTTP/1.1\r\n")
        assert f"host: {srv.url('').split('//')[1]}" in head
        assert "ce-id: 1" in head and "content-length: 2" in head


async def test_chunked_body_with_trailers(client):
    raw = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nce-id: r1\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: t\r\n\r\n"
    )
    async with RawServer(answer(raw + OK)) as srv:
        r = await client.request("POST", srv.url(), [], b"x", timeout=5)
        assert r.content == b"hello world" and r.header("ce-id") == "r1"
        r = await client.request("POST", srv.url(), [], b"x", timeout=5)
        assert r.content == b"ok"  # the trailer was consumed, the connection still in step
        assert srv.connections == 1


async def test_body_until_close_and_connection_close(client):
    async def until_close(req, reader, writer):
        writer.write(b"HTTP/1.1 500 Oops\r\n\r\nall of it")
        return False

    async with RawServer(until_close) as srv:
        for _ in range(2):
            r = await client.request("POST", srv.url(), [], b"", timeout=5)
            assert (r.status, r.content) == (500, b"all of it")
        assert srv.connections == 2

    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
    async with RawServer(answer(closing)) as srv:
        await client.request("POST", srv.url(), [], b"", timeout=5)
        await client.request("POST", srv.url(), [], b"", timeout=5)
        assert srv.connections == 2


async def test_interim_1xx_answers_are_skipped(client):
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + OK
    async with RawServer(answer(raw)) as srv:
        r = await client.request("POST", srv.url(), [], b"x", timeout=5)
        assert (r.status, r.content) == (200, b"ok")


async def test_no_body_for_204_and_304(client):
    async with RawServer(answer(b"HTTP/1.1 204 No Content\r\n\r\n" + OK)) as srv:
        assert (await client.request("POST", srv.url(), [], b"", timeout=5)).content == b""
        assert (await client.request("POST", srv.url(), [], b"", timeout=5)).content == b"ok"


async def test_idle_connection_closed_by_the_server_is_replaced(client):
    async def once(req, reader, writer):
        writer.write(OK)
        await writer.drain()
        return False  # the server closes after each answer without saying so

    async with RawServer(once) as srv:
        for _ in range(3):
            r = await client.request("POST", srv.url(), [], b"x", timeout=5)
            assert r.content == b"ok"
            await asyncio.sleep(0.05)
        assert srv.connections == 3


async def test_connection_dropped_before_any_answer_is_retried_once(client):
    calls = 0

    async def flaky(req, reader, writer):
        nonlocal calls
        calls += 1
        if calls == 2:  # the second request (on the reused connection) is dropped unanswered
            return False
        writer.write(OK)
        await writer.drain()
        return True

    async with RawServer(flaky) as srv:
        assert (await client.request("POST", srv.url(), [], b"1", timeout=5)).content == b"ok"
        assert (await client.request("POST", srv.url(), [], b"2", timeout=5)).content == b"ok"
        assert calls == 3 and srv.connections == 2


async def test_a_new_connection_that_fails_is_an_error(client):
    async def drop(req, reader, writer):
        return False

    async with RawServer(drop) as srv:
        with pytest.raises(WebhookError):
            await client.request("POST", srv.url(), [], b"x", timeout=5)


async def test_timeout(client):
    async def slow(req, reader, writer):
        await asyncio.sleep(2)
        return False

    async with RawServer(slow) as srv:
        with pytest.raises(WebhookTimeout):
            await client.request("POST", srv.url(), [], b"x", timeout=0.2)


async def test_refused_and_bad_urls(client):
    async with RawServer(answer(OK)) as srv:
        url = srv.url()
    with pytest.raises(WebhookError):  # nobody listens there any more
        await client.request("POST", url, [], b"x", timeout=5)
    for bad in ("ftp://example.com/x", "http:///nohost", "http://h:99999/"):
        with pytest.raises(WebhookError):
            await client.request("POST", bad, [], b"", timeout=5)


async def test_credentials_in_the_url_become_basic_auth(client):
    async with RawServer(answer(OK)) as srv:
        url = srv.url("/p?q=1").replace("http://", "http://us%40er:p%3Ass@")
        await client.request("POST", url, [], b"", timeout=5)
        head = srv.requests[0].decode()
        assert head.startswith("POST /p?q=1 HTTP/1.1")
        token = base64.b64encode(b"us@er:p:ss").decode()
        assert f"authorization: Basic {token}" in head
        assert "us%40er" not in head.split("\r\n", 2)[1]  # host header without the userinfo


async def test_header_injection_and_oversized_answers_are_refused():
    c = WebhookClient(max_response_bytes=10)
    try:
        async with RawServer(answer(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n01234567890")) as srv:
            with pytest.raises(WebhookError):
                await c.request("POST", srv.url(), [("x-a", "1\r\nx-b: 2")], b"", timeout=5)
            with pytest.raises(WebhookError):
                await c.request("POST", srv.url(), [], b"", timeout=5)
        async with RawServer(answer(b"HTTP/1.1 200 OK\r\n\r\n" + b"y" * 11)) as srv:
            with pytest.raises(WebhookError):
                await c.request("POST", srv.url(), [], b"", timeout=5)
        async with RawServer(answer(b"SMTP ready\r\n\r\n")) as srv:
            with pytest.raises(WebhookError):
                await c.request("POST", srv.url(), [], b"", timeout=5)
    finally:
        await c.aclose()


async def test_concurrent_requests_use_parallel_connections(client):
    async def slowish(req, reader, writer):
        await asyncio.sleep(0.05)
        writer.write(OK)
        await writer.drain()
        return True

    async with RawServer(slowish) as srv:
        rs = await asyncio.gather(*(client.request("POST", srv.url(), [], b"x", timeout=5) for _ in range(8)))
        assert all(r.content == b"ok" for r in rs)
        assert srv.connections == 8
        await asyncio.gather(*(client.request("POST", srv.url(), [], b"x", timeout=5) for _ in range(8)))
        assert srv.connections == 8  # all eight were kept alive and reused


async def test_expired_idle_connections_are_closed():
    c = WebhookClient(keepalive_expiry=0.2)
    try:
        async with RawServer(answer(OK)) as srv:
            await asyncio.gather(*(c.request("POST", srv.url(), [], b"", timeout=5) for _ in range(4)))
            idle = next(iter(c._idle.values()))
            assert len(idle) == 4
            await asyncio.sleep(0.3)
            await c.request("POST", srv.url(), [], b"", timeout=5)  # on a new connection
            assert len(idle) == 1 and srv.connections == 5  # the four expired ones were closed
    finally:
        await c.aclose()
