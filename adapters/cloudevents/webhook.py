"""A small asyncio HTTP/1.1 client for push deliveries: keep-alive connections per origin, one
overall timeout per request, http and https, no redirects (a 3xx is an answer like any other).

Why not httpx (which the tests still use as the independent client): with httpx 0.28 / httpcore 1.0
a delivery cost 1-2 ms of CPU, most of it in the connection pool (it rescans every connection and
every queued request on each request and on each response) and, without `sniffio` installed, in a
failing `import sniffio` that httpcore repeats for every lock it sets up. A push subscription has to
deliver a few thousand events per second from one core next to the store; this client costs tens of
microseconds per request.

What it implements: requests with a body and `Content-Length` (never chunked uploads); responses
with `Content-Length`, `Transfer-Encoding: chunked` (trailers skipped) or delimited by the end of
the connection; interim 1xx responses are skipped (as h11 does); no body for 1xx, 204, 304 or a HEAD
request. A connection is reused when the response allows it (HTTP/1.1 without `Connection: close`)
and it was idle less than `keepalive_expiry` s; a request that fails on a reused connection before
any byte of the answer arrived (the server closed it meanwhile) is sent once more on a new one, so a
delivery may arrive twice, as at-least-once delivery allows anyway. Credentials in the URL
(`user:password@`) become Basic authentication, as in httpx."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import time
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

MAX_HEAD = 64 * 1024


class WebhookError(Exception):
    """The request failed without an HTTP answer (connection refused or lost, protocol error)."""


class WebhookTimeout(WebhookError):
    """No complete answer within the timeout."""


@dataclass(slots=True)
class WebhookResponse:
    status: int
    headers: list[tuple[str, str]]  # lower-case names, in order received
    content: bytes

    @property
    def status_code(self) -> int:
        return self.status

    def header(self, name: str) -> str | None:
        """The first value of a header (`name` in lower case), or None."""
        for k, v in self.headers:
            if k == name:
                return v
        return None


@dataclass(frozen=True, slots=True)
class _Target:
    key: tuple[str, str, int]  # scheme, host, port
    host_header: str
    path: str  # path + query, as sent in the request line
    authorization: str | None


class _Conn:
    __slots__ = ("reader", "writer", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float, expiry: float) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof() and now - self.idle_since < expiry

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class _Reused(Exception):
    """A reused connection failed before the answer started: try once more on a new one."""


class WebhookClient:
    def __init__(
        self,
        *,
        user_agent: str = "msg-gateway-cloudevents",
        max_connections: int = 256,
        max_idle_per_origin: int = 64,
        keepalive_expiry: float = 5.0,
        max_response_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.user_agent = user_agent
        self.max_idle_per_origin = max_idle_per_origin
        self.keepalive_expiry = keepalive_expiry
        self.max_response_bytes = max_response_bytes
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._targets: dict[str, _Target] = {}
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    # ------------------------------------------------------------------ public
    async def request(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
        *,
        timeout: float = 10.0,
    ) -> WebhookResponse:
        """Send one request; WebhookTimeout / WebhookError when no complete answer arrived."""
        if self._closed:
            raise WebhookError("client is closed")
        target = self._target(url)
        head = self._head(method, target, headers or [], len(body))
        try:
            async with asyncio.timeout(timeout):
                async with self._slots:
                    try:
                        return await self._exchange(target, method, head, body, reuse=True)
                    except _Reused:
                        return await self._exchange(target, method, head, body, reuse=False)
        except TimeoutError:
            raise WebhookTimeout(f"{method} {url}: no answer within {timeout:g} s") from None

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()

    # ------------------------------------------------------------------ internals
    def _target(self, url: str) -> _Target:
        t = self._targets.get(url)
        if t is not None:
            return t
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise WebhookError(f"{url!r} is not an http(s) URL")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError as e:
            raise WebhookError(f"{url!r}: {e}") from None
        host = parts.hostname
        netloc = parts.netloc.rpartition("@")[2]
        auth = None
        if parts.username is not None:
            cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            auth = "Basic " + base64.b64encode(cred.encode()).decode("ascii")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        t = _Target((scheme, host, port), netloc, path, auth)
        if len(self._targets) >= 1024:
            self._targets.clear()
        self._targets[url] = t
        return t

    def _head(self, method: str, target: _Target, headers: list[tuple[str, str]], length: int) -> bytes:
        lines = [
            f"{method} {target.path} HTTP/1.1",
            f"host: {target.host_header}",
            f"user-agent: {self.user_agent}",
        ]
        if target.authorization:
            lines.append(f"authorization: {target.authorization}")
        for k, v in headers:
            if "\r" in v or "\n" in v or "\r" in k or "\n" in k or ":" in k:
                raise WebhookError(f"invalid header {k!r}")
            lines.append(f"{k}: {v}")
        if length or method not in ("GET", "HEAD", "OPTIONS", "DELETE"):
            lines.append(f"content-length: {length}")
        text = "\r\n".join(lines) + "\r\n\r\n"
        try:
            return text.encode("latin-1")
        except UnicodeEncodeError:
            return text.encode()

    async def _connect(self, target: _Target) -> _Conn:
        scheme, host, port = target.key
        ctx = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=ctx, limit=MAX_HEAD)
        except (OSError, ssl.SSLError) as e:
            raise WebhookError(f"cannot connect to {host}:{port}: {e}") from e
        return _Conn(reader, writer)

    def _take_idle(self, key: tuple[str, str, int]) -> _Conn | None:
        conns = self._idle.get(key)
        now = time.monotonic()
        while conns:
            c = conns.pop()
            if c.usable(now, self.keepalive_expiry):
                return c
            c.close()
        return None

    def _give_back(self, key: tuple[str, str, int], conn: _Conn) -> None:
        conns = self._idle.setdefault(key, [])
        now = time.monotonic()
        # Taken last-in first-out, so the oldest idle ones are at the front: close those that
        # expired (or that the server closed) instead of keeping their sockets open.
        while conns and not conns[0].usable(now, self.keepalive_expiry):
            conns.pop(0).close()
        if self._closed or len(conns) >= self.max_idle_per_origin:
            conn.close()
            return
        conn.idle_since = now
        conns.append(conn)

    async def _exchange(
        self, target: _Target, method: str, head: bytes, body: bytes, *, reuse: bool
    ) -> WebhookResponse:
        conn = self._take_idle(target.key) if reuse else None
        reused = conn is not None
        if conn is None:
            conn = await self._connect(target)
        keep = done = started = False
        try:
            if len(body) < 65536:
                conn.writer.write(head + body)
            else:
                conn.writer.write(head)
                conn.writer.write(body)
            await conn.writer.drain()
            status, headers, keep = await self._read_head(conn.reader)
            started = True
            content = await self._read_body(conn.reader, method, status, headers)
            if content is None:  # delimited by the end of the connection
                keep = False
                content = await self._read_to_eof(conn.reader)
            done = True
            return WebhookResponse(status, headers, content)
        except (ConnectionError, asyncio.IncompleteReadError, OSError, ssl.SSLError) as e:
            if reused and not started and not (isinstance(e, asyncio.IncompleteReadError) and e.partial):
                raise _Reused from e
            raise WebhookError(f"{method} {target.host_header}: {type(e).__name__}: {e}") from e
        except asyncio.LimitOverrunError as e:
            raise WebhookError("response head too large") from e
        finally:
            if done and keep:
                self._give_back(target.key, conn)
            else:
                conn.close()

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[int, list[tuple[str, str]], bool]:
        """(status, headers, keep-alive allowed); interim 1xx answers are skipped."""
        while True:
            raw = await reader.readuntil(b"\r\n\r\n")
            lines = raw[:-4].split(b"\r\n")
            status_line = lines[0].split(b" ", 2)
            if (
                len(status_line) < 2
                or not status_line[0].startswith(b"HTTP/1.")
                or not status_line[1].isdigit()
            ):
                raise WebhookError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
            status = int(status_line[1])
            if 100 <= status < 200 and status != 101:
                continue
            headers: list[tuple[str, str]] = []
            for line in lines[1:]:
                name, sep, value = line.partition(b":")
                if sep:
                    headers.append((name.strip().lower().decode("latin-1"), value.strip().decode("latin-1")))
            http11 = status_line[0] == b"HTTP/1.1"
            keep = http11
            for k, v in headers:
                if k == "connection":
                    tokens = {t.strip().lower() for t in v.split(",")}
                    if "close" in tokens:
                        keep = False
                    elif "keep-alive" in tokens and not http11:
                        keep = True
            return status, headers, keep

    async def _read_body(
        self, reader: asyncio.StreamReader, method: str, status: int, headers: list[tuple[str, str]]
    ) -> bytes | None:
        """The body; None when it lasts until the connection closes."""
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return b""
        length = None
        chunked = False
        for k, v in headers:
            if k == "transfer-encoding":
                chunked = v.lower().rsplit(",", 1)[-1].strip() == "chunked"
            elif k == "content-length":
                try:
                    length = int(v)
                except ValueError:
                    raise WebhookError(f"invalid Content-Length {v!r}") from None
        if chunked:
            return await self._read_chunked(reader)
        if length is None:
            return None
        if length > self.max_response_bytes:
            raise WebhookError(f"response body of {length} bytes is too large")
        return await reader.readexactly(length) if length else b""

    async def _read_chunked(self, reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise WebhookError(f"invalid chunk size line {line[:40]!r}") from None
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return b"".join(parts)
            total += size
            if total > self.max_response_bytes:
                raise WebhookError("chunked response body too large")
            parts.append(await reader.readexactly(size))
            if await reader.readexactly(2) != b"\r\n":
                raise WebhookError("chunk not followed by CRLF")

    async def _read_to_eof(self, reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return b"".join(parts)
            total += len(chunk)
            if total > self.max_response_bytes:
                raise WebhookError("response body too large")
            parts.append(chunk)


__all__ = ["WebhookClient", "WebhookError", "WebhookResponse", "WebhookTimeout"]
