"""Helpers of the CloudEvents tests: an in-process gateway (HTTP + MQTT on ephemeral ports) and a
webhook receiver (a small Starlette app served by uvicorn on a real socket) with scripted answers."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from types import SimpleNamespace

import httpx
from cloudevents.core.bindings.http import HTTPMessage, from_binary_event, from_structured_event
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http import HttpAdapter
from tests.support import TEST_SEGMENT_SIZE_MIB, start_gateway

T = 10.0  # seconds any single awaited event may take
MAX_BODY = 64 * 1024  # the tests' max_body_size: a 64 KiB event is accepted, one byte more is not


async def open_gateway(data_dir: str, **settings) -> SimpleNamespace:
    s = {"default_queues": 2, "segment_size_mib": TEST_SEGMENT_SIZE_MIB} | settings
    gw = await start_gateway(data_dir, s.pop("protocols", ("http", "mqtt")), **s)
    http = next(a for a in gw.adapters if a.name == "http")
    mqtt = next((a for a in gw.adapters if a.name == "mqtt"), None)
    client = httpx.AsyncClient(base_url=f"http://{http.address}", timeout=T)
    return SimpleNamespace(gw=gw, p=gw.processor, http=http, mqtt=mqtt, client=client, ce=http.service)


async def close_gateway(env: SimpleNamespace) -> None:
    await env.client.aclose()
    await env.gw.stop()


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic()

    def event(self):
        """The request parsed by the cloudevents SDK (binary or structured)."""
        msg = HTTPMessage(self.headers, self.body)
        if self.headers.get("content-type", "").startswith("application/cloudevents+json"):
            return from_structured_event(msg)
        return from_binary_event(msg)


@dataclass
class Reply:
    status: int = 202
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay: float = 0.0  # the receiver takes this long to answer (a slow sink)


class Receiver:
    """A webhook: records every request per path, answers POSTs from a per-path script (then
    `default`), grants the OPTIONS handshake unless `grant` is False."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.script: dict[str, deque[Reply]] = defaultdict(deque)
        self.default = Reply()
        self.grant = True
        self.allowed_rate: str | None = None
        self.inflight = 0
        self.max_inflight = 0
        self._changed = asyncio.Condition()
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["POST", "OPTIONS"])])
        self.adapter = HttpAdapter(app, "127.0.0.1", 0)

    def reset(self) -> None:
        self.requests.clear()
        self.script.clear()
        self.default = Reply()
        self.grant = True
        self.allowed_rate = None
        self.max_inflight = 0

    @property
    def base(self) -> str:
        return f"http://{self.adapter.address}"

    def url(self, path: str = "sink") -> str:
        return f"{self.base}/{path}"

    async def start(self) -> Receiver:
        await self.adapter.start()
        return self

    async def stop(self) -> None:
        await self.adapter.stop(0.5)

    def answer(self, path: str, *replies: Reply) -> None:
        self.script["/" + path].extend(replies)

    def posts(self, path: str = "sink") -> list[Received]:
        return [r for r in self.requests if r.method == "POST" and r.path == "/" + path]

    def options(self) -> list[Received]:
        return [r for r in self.requests if r.method == "OPTIONS"]

    async def wait_posts(self, n: int, path: str = "sink", timeout: float = T) -> list[Received]:
        """Wait until `path` received at least `n` POSTs."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.posts(path)) >= n), timeout)
        return self.posts(path)

    async def _handle(self, request: Request) -> Response:
        body = await request.body()
        rec = Received(request.method, request.url.path, dict(request.headers), body, time.monotonic())
        self.requests.append(rec)
        if request.method == "OPTIONS":
            async with self._changed:
                self._changed.notify_all()
            origin = request.headers.get("webhook-request-origin")
            if not self.grant or not origin:
                return Response(status_code=405, headers={"Allow": "POST"})
            headers = {"WebHook-Allowed-Origin": origin, "Allow": "POST, OPTIONS"}
            if self.allowed_rate:
                headers["WebHook-Allowed-Rate"] = self.allowed_rate
            return Response(status_code=200, headers=headers)
        queue = self.script.get(rec.path)
        reply = queue.popleft() if queue else self.default
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if reply.delay:
                await asyncio.sleep(reply.delay)
        finally:
            self.inflight -= 1
        async with self._changed:
            self._changed.notify_all()
        return Response(reply.body, status_code=reply.status, headers=reply.headers)


async def wait_until(predicate, timeout: float = T, interval: float = 0.02):
    """Poll `predicate()` (sync or async) until it returns a truthy value; that value."""
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(interval)
