"""`NameServerClient`: what store nodes and proxies use to register with name servers and to ask
them for routes and proxies. Talks to every configured name server (as RocketMQ brokers do);
queries go to the first that answers.

    ns = NameServerClient(["127.0.0.1:9876"])
    await ns.register_broker(cluster="c", name="store-a", addr="10.0.0.1:10911",
                             topics={"orders": TopicQueues(8, 8)})
    task = ns.keep_registered(lambda: ns.register_broker(...), period_s=30)   # lease renewals
    brokers, queues = await ns.route("orders")

Each connection starts with HELLO (namesrv/version.py): `info[addr]` is what that name server
offers (version 0, the base features, when it predates HELLO), and `listing_age_s()` how long the
name server that answered the last query has been running, as far as this client can tell. With
`auth` (the cluster secret, remoting/cluster_auth.py) every connection authenticates first."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from remoting import RemotingCommand, RequestCode, ResponseCode, loads, parse_host_port
from remoting import routes as rd
from remoting.client import RemotingClient, RemotingClientError
from remoting.cluster_auth import ClusterAuth

from .body import body_crc32, encode_register_body
from .routeinfo import TopicQueues
from .version import HELLO, PeerInfo, hello_fields, parse_hello

log = logging.getLogger("namesrv.client")


class NameServerError(Exception):
    def __init__(self, code: int, remark: str) -> None:
        super().__init__(f"{remark} (code {code})")
        self.code = code


RETRY_S = 1.0  # how soon a registration is tried again while a name server is missing


class _Refused(Exception):
    """A name server refused HELLO: its response stands for the request's."""

    def __init__(self, response: RemotingCommand) -> None:
        super().__init__(response.remark)
        self.response = response


class NameServerClient:
    def __init__(
        self,
        addrs: list[str] | str,
        *,
        timeout: float = 3.0,
        auth: ClusterAuth | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.addrs = [a.strip() for a in (addrs.split(";") if isinstance(addrs, str) else addrs) if a.strip()]
        if not self.addrs:
            raise ValueError("no name server address")
        self.timeout = timeout
        self.auth = auth
        self.tls = tls  # a client context: the name servers are spoken to over TLS
        self._conns: dict[str, RemotingClient] = {}
        self._lock = asyncio.Lock()
        self.info: dict[str, PeerInfo] = {}  # what each name server said at HELLO
        self._since: dict[str, float] = {}  # when each one started, by this clock, as far as known
        self.answered: str | None = None  # the name server that answered the last query
        self._failing: set[str] = set()  # name servers whose last request failed (logged once)

    async def _conn(self, addr: str) -> RemotingClient:
        c = self._conns.get(addr)
        if c is not None and not c.closed.is_set():
            return c
        host, port = parse_host_port(addr, 9876)
        c = await RemotingClient.connect(host, port, timeout=self.timeout, auth=self.auth, ssl=self.tls)
        try:
            r = await c.invoke(HELLO, hello_fields(), timeout=self.timeout)
            if r.code not in (ResponseCode.SUCCESS, ResponseCode.REQUEST_CODE_NOT_SUPPORTED):
                raise _Refused(r)  # the secret missing, say: the answer to whatever was asked
            info = parse_hello(r)
        except BaseException:
            await c.close()
            raise
        now = time.monotonic()
        # a name server without `uptime`: taken as started when this connection opened (a restart
        # closes every connection, so it is never later than that)
        self._since[addr] = now - info.uptime_s if info.uptime_s is not None else now
        self.info[addr] = info
        self._conns[addr] = c
        return c

    def listing_age_s(self) -> float | None:
        """How long the name server that answered the last query has been up (a lower bound for
        one that does not say); None before any answer."""
        since = self._since.get(self.answered) if self.answered else None
        return None if since is None else time.monotonic() - since

    async def _invoke_one(self, addr: str, code: int, ext: dict[str, Any], body: bytes) -> RemotingCommand:
        try:
            c = await self._conn(addr)
        except _Refused as e:
            return e.response
        return await c.invoke(code, ext, body, timeout=self.timeout)

    async def _invoke_all(self, code: int, ext: dict[str, Any], body: bytes = b"") -> list[RemotingCommand]:
        """Send to every name server; returns the responses of those that answered."""
        results = await asyncio.gather(
            *(self._invoke_one(a, code, ext, body) for a in self.addrs), return_exceptions=True
        )
        out = []
        for a, r in zip(self.addrs, results, strict=True):
            if isinstance(r, BaseException):
                (log.debug if a in self._failing else log.warning)("name server %s: %s", a, r)
                self._failing.add(a)
                self._conns.pop(a, None)
            else:
                self._failing.discard(a)
                out.append(r)
        if not out:
            raise RemotingClientError(f"no name server of {', '.join(self.addrs)} answered")
        return out

    async def _invoke_any(self, code: int, ext: dict[str, Any], body: bytes = b"") -> RemotingCommand:
        last: BaseException | None = None
        for a in self.addrs:
            try:
                r = await self._invoke_one(a, code, ext, body)
                self.answered = a
                return r
            except (OSError, TimeoutError, RemotingClientError) as e:
                last = e
                self._conns.pop(a, None)
        raise RemotingClientError(f"no name server of {', '.join(self.addrs)} answered: {last}")

    # ------------------------------------------------------------------ registration
    async def register_broker(
        self,
        *,
        cluster: str,
        name: str,
        addr: str,
        topics: dict[str, TopicQueues],
        broker_id: int = 0,
        ha_addr: str = "",
        timeout_ms: int = 0,
        compressed: bool = False,
        logic_queues: dict[str, dict[str, Any]] | None = None,
    ) -> list[RemotingCommand]:
        body = encode_register_body(topics, compressed=compressed, logic_queues=logic_queues)
        ext: dict[str, Any] = {
            "brokerName": name,
            "brokerAddr": addr,
            "clusterName": cluster,
            "haServerAddr": ha_addr or addr,
            "brokerId": broker_id,
            "compressed": "true" if compressed else "false",
            "bodyCrc32": body_crc32(body),
        }
        if timeout_ms:
            ext["heartbeatTimeoutMillis"] = timeout_ms
        return _ok(await self._invoke_all(RequestCode.REGISTER_BROKER, ext, body))

    async def unregister_broker(self, *, cluster: str, name: str, addr: str, broker_id: int = 0) -> None:
        ext = {"brokerName": name, "brokerAddr": addr, "clusterName": cluster, "brokerId": broker_id}
        _ok(await self._invoke_all(RequestCode.UNREGISTER_BROKER, ext))

    async def register_proxy(
        self,
        *,
        name: str,
        endpoints: dict[str, str],
        cluster: str = "",
        attributes: dict[str, str] | None = None,
        timeout_ms: int = 0,
    ) -> list[RemotingCommand]:
        ext: dict[str, Any] = {"proxyName": name, "clusterName": cluster}
        if timeout_ms:
            ext["heartbeatTimeoutMillis"] = timeout_ms
        body = json.dumps({"endpoints": endpoints, "attributes": attributes or {}}).encode()
        return _ok(await self._invoke_all(RequestCode.REGISTER_PROXY, ext, body))

    async def unregister_proxy(self, name: str) -> None:
        _ok(await self._invoke_all(RequestCode.UNREGISTER_PROXY, {"proxyName": name}))

    def keep_registered(
        self, register: Callable[[], Awaitable[object]], period_s: float = 30.0
    ) -> asyncio.Task[None]:
        """A task that calls `register()` every `period_s` (failures are logged and retried), and
        sooner while a name server is missing (`renewal_due`)."""

        async def loop() -> None:
            failing = False
            while True:
                try:
                    await register()
                    if failing:
                        log.info("registered with the name servers again")
                    failing = False
                except Exception as e:  # noqa: BLE001 - name servers come and go; keep trying
                    (log.debug if failing else log.warning)("registration with name servers failed: %s", e)
                    failing = True
                await self.renewal_due(period_s)

        return asyncio.get_running_loop().create_task(loop(), name="namesrv registration")

    async def renewal_due(self, period_s: float) -> None:
        """Wait until the next lease renewal is due: after `period_s`; after at most RETRY_S while
        a name server is not connected (down, or never answered); at once when a connection
        closes (a name server that stops or restarts: it is then refilled within a second, not a
        lease period)."""
        missing = any(a not in self._conns or self._conns[a].closed.is_set() for a in self.addrs)
        timeout = min(period_s, RETRY_S) if missing else period_s
        closes = [
            asyncio.ensure_future(c.closed.wait()) for c in self._conns.values() if not c.closed.is_set()
        ]
        if not closes:
            await asyncio.sleep(timeout)
            return
        try:
            await asyncio.wait(closes, timeout=timeout)
        finally:
            for t in closes:
                t.cancel()

    # ------------------------------------------------------------------ queries
    async def route(self, topic: str) -> tuple[list[rd.BrokerData], list[rd.QueueData]] | None:
        r = await self._invoke_any(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if r.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        _ok([r])
        return rd.parse_route(loads(r.body))

    async def logic_queues(self, topic: str) -> dict[str, Any] | None:
        """The topic's logic queue table in its route (CLUSTER mode, docs/cluster.md), if any."""
        r = await self._invoke_any(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if r.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        _ok([r])
        return loads(r.body).get("logicQueues")

    async def cluster_info(self) -> dict[str, Any]:
        r = _ok([await self._invoke_any(RequestCode.GET_BROKER_CLUSTER_INFO, {})])[0]
        return loads(r.body)

    async def proxies(self, protocol: str = "", cluster: str = "") -> list[dict[str, Any]]:
        ext = {"protocol": protocol, "clusterName": cluster}
        r = _ok([await self._invoke_any(RequestCode.GET_PROXY_LIST, ext)])[0]
        return list(json.loads(r.body).get("proxies", []))

    async def close(self) -> None:
        conns, self._conns = self._conns, {}
        for c in conns.values():
            with contextlib.suppress(Exception):
                await c.close()


def _ok(resps: list[RemotingCommand]) -> list[RemotingCommand]:
    for r in resps:
        if r.code != ResponseCode.SUCCESS:
            raise NameServerError(r.code, r.remark or "")
    return resps
