"""`NameServer`: the remoting protocol on port 9876 over `RouteInfo` (see docs/namesrv.md).

Requests: REGISTER_BROKER, UNREGISTER_BROKER, QUERY_DATA_VERSION and BROKER_HEARTBEAT (lease
renewals), GET_ROUTEINFO_BY_TOPIC, GET_BROKER_CLUSTER_INFO, GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
GET_KV_CONFIG (always QUERY_NOT_FOUND: no KV config), and the gateway's REGISTER_PROXY (7001),
UNREGISTER_PROXY (7002), GET_PROXY_LIST (7003), HELLO (7004: the protocol's version, features and
this server's uptime, namesrv/version.py). Anything else: REQUEST_CODE_NOT_SUPPORTED.

With a cluster secret (`auth`) every connection proves it before any of these is served
(remoting/cluster_auth.py): a process without it can neither register nor list routes."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable

from remoting import (
    Ext,
    HeaderError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    dumps_bytes,
    loads,
    wants_standard_json,
)
from remoting import routes as rd
from remoting.cluster_auth import ClusterAuth
from remoting.server import FrameConnection, FrameServer, close_tcp, serve_tcp
from runtime.tasks import cancel_and_wait

from .body import BodyError, body_crc32, decode_logic_queues, decode_register_body
from .config import NamesrvSettings
from .routeinfo import RouteInfo
from .version import HELLO, hello_fields

log = logging.getLogger("namesrv")
QUERY_DATA_VERSION = 322
BROKER_HEARTBEAT = 904
R = ResponseCode

Handler = Callable[["NameServer", FrameConnection, RemotingCommand], Awaitable[RemotingCommand]]


class NameServer:
    """Serve until `stop()`; `address` is the bound host:port."""

    def __init__(
        self,
        settings: NamesrvSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        auth: ClusterAuth | None = None,
        tls: ssl.SSLContext | None = None,
    ):
        self.settings = settings or NamesrvSettings()
        self.tls = tls  # a server context: the port serves TLS only
        self.clock = clock
        self.started = clock()
        self.routes = RouteInfo(self.settings.lease_expiry_s)
        self.frames = FrameServer(self, name="name server", log=log, auth=auth)
        self._server: asyncio.Server | None = None
        self._scanner: asyncio.Task | None = None
        self._address = f"{self.settings.host}:{self.settings.port}"
        self.handlers: dict[int, Handler] = {
            RequestCode.REGISTER_BROKER: _register_broker,
            RequestCode.UNREGISTER_BROKER: _unregister_broker,
            QUERY_DATA_VERSION: _query_data_version,
            BROKER_HEARTBEAT: _broker_heartbeat,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: _get_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: _cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: _topic_list,
            RequestCode.GET_KV_CONFIG: _get_kv_config,
            RequestCode.REGISTER_PROXY: _register_proxy,
            RequestCode.UNREGISTER_PROXY: _unregister_proxy,
            RequestCode.GET_PROXY_LIST: _proxy_list,
            HELLO: _hello,
        }

    @property
    def address(self) -> str:
        return self._address

    @property
    def port(self) -> int:
        return int(self._address.rsplit(":", 1)[1])

    async def start(self) -> None:
        self._server, self._address = await serve_tcp(
            self.frames, self.settings.host, self.settings.port, ssl=self.tls
        )
        self._scanner = asyncio.get_running_loop().create_task(self._scan(), name="namesrv lease scan")

    async def _scan(self) -> None:
        while True:
            await asyncio.sleep(self.settings.scan_interval_s)
            self.routes.scan(self.clock())

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await cancel_and_wait(self._scanner)
        self.frames.abort()
        await close_tcp(self._server)
        self._server = None

    # ------------------------------------------------------------------ FrameHandler
    def opened(self, conn: FrameConnection) -> None:
        pass

    def closed(self, conn: FrameConnection) -> None:
        self.routes.connection_closed(conn)

    async def dispatch(self, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        handler = self.handlers.get(cmd.code)
        try:
            if handler is None:
                resp = cmd.response(R.REQUEST_CODE_NOT_SUPPORTED, f"request type {cmd.code} not supported")
            else:
                resp = await handler(self, conn, cmd)
        except HeaderError as e:
            resp = cmd.response(e.code, str(e))
        except BodyError as e:
            resp = cmd.response(R.SYSTEM_ERROR, str(e))
        except Exception as e:  # noqa: BLE001 - answer, keep serving
            log.exception("name server request %d from %s failed", cmd.code, conn.remote)
            resp = cmd.response(R.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        return None if cmd.is_oneway else resp


def _required(e: Ext, name: str) -> str:
    v = e.str(name).strip()
    if not v:
        raise HeaderError(f"the request field {name} is empty")
    return v


def _timeout_s(e: Ext) -> float | None:
    ms = e.opt_int("heartbeatTimeoutMillis")
    return ms / 1000 if ms and ms > 0 else None


def _lease_ext(ns: NameServer, timeout_s: float | None) -> dict[str, str]:
    return {
        "leasePeriodMillis": str(int(ns.settings.lease_period_s * 1000)),
        "heartbeatTimeoutMillis": str(int((timeout_s or ns.routes.default_timeout_s) * 1000)),
    }


async def _register_broker(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    e = Ext(cmd.ext_fields)
    crc = e.int("bodyCrc32", 0)
    if crc and body_crc32(cmd.body) != crc:
        return cmd.response(R.SYSTEM_ERROR, "crc32 not match")
    topics, version = decode_register_body(cmd.body, e.bool("compressed"))
    logic_queues = decode_logic_queues(cmd.body, e.bool("compressed"))
    timeout = _timeout_s(e)
    master, ha = ns.routes.register_broker(
        cluster=_required(e, "clusterName"),
        addr=_required(e, "brokerAddr"),
        name=_required(e, "brokerName"),
        broker_id=e.int("brokerId", 0),
        ha_addr=e.str("haServerAddr", ""),
        topics=topics if cmd.body else None,
        timeout_s=timeout,
        conn=conn,
        data_version=version,
        logic_queues=logic_queues,
        now=ns.clock(),
    )
    ext = {"masterAddr": master, "haServerAddr": ha, **_lease_ext(ns, timeout)}
    return cmd.response(R.SUCCESS, None, ext, dumps_bytes({"table": {}}))


async def _unregister_broker(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    e = Ext(cmd.ext_fields)
    ns.routes.unregister_broker(e.str("brokerAddr"), e.str("brokerName", ""), e.opt_int("brokerId"))
    return cmd.response(R.SUCCESS)


async def _query_data_version(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    """A broker asks whether its topic configs changed since it last registered (and renews)."""
    addr = Ext(cmd.ext_fields).str("brokerAddr")
    have = ns.routes.data_version(addr)
    try:
        theirs = loads(cmd.body) if cmd.body else {}
    except (ValueError, UnicodeDecodeError):
        theirs = {}
    changed = have is None or have != theirs
    ns.routes.touch_broker(addr, ns.clock())
    body = dumps_bytes(have) if have else b""
    return cmd.response(R.SUCCESS, None, {"changed": "true" if changed else "false"}, body)


async def _broker_heartbeat(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    ns.routes.touch_broker(Ext(cmd.ext_fields).str("brokerAddr"), ns.clock())
    return cmd.response(R.SUCCESS)


async def _get_route(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    topic = Ext(cmd.ext_fields).str("topic")
    found = ns.routes.route(topic)
    if found is None:
        return cmd.response(R.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}")
    data = rd.route_data(*found)
    table = ns.routes.logic_queues.get(topic)
    if table is not None:  # CLUSTER mode: the topic's logical queues over store nodes
        data["logicQueues"] = table
    body = rd.encode(data, wants_standard_json(cmd.version, cmd.ext_fields))
    return cmd.response(R.SUCCESS, None, None, body)


async def _cluster_info(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    data = rd.cluster_info(ns.routes.broker_list())
    return cmd.response(
        R.SUCCESS, None, None, rd.encode(data, wants_standard_json(cmd.version, cmd.ext_fields))
    )


async def _topic_list(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(R.SUCCESS, None, None, dumps_bytes({"topicList": ns.routes.topic_list()}))


async def _get_kv_config(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    e = Ext(cmd.ext_fields)
    return cmd.response(
        R.QUERY_NOT_FOUND, f"No config item, Namespace: {e.str('namespace', '')} Key: {e.str('key', '')}"
    )


async def _register_proxy(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    """REGISTER_PROXY (7001): extFields proxyName*, clusterName, heartbeatTimeoutMillis; body
    `{"endpoints":{"grpc":"host:port",...},"attributes":{...}}`. Renew by sending it again."""
    e = Ext(cmd.ext_fields)
    try:
        data = loads(cmd.body) if cmd.body else {}
    except (ValueError, UnicodeDecodeError) as err:
        return cmd.response(R.SYSTEM_ERROR, f"body is not JSON: {err}")
    if not isinstance(data, dict):
        return cmd.response(R.SYSTEM_ERROR, "body is not a JSON object")
    endpoints = {str(k): str(v) for k, v in (data.get("endpoints") or {}).items()}
    attributes = {str(k): str(v) for k, v in (data.get("attributes") or {}).items()}
    timeout = _timeout_s(e)
    ns.routes.register_proxy(
        name=_required(e, "proxyName"),
        endpoints=endpoints,
        cluster=e.str("clusterName", ""),
        attributes=attributes,
        timeout_s=timeout,
        conn=conn,
        now=ns.clock(),
    )
    return cmd.response(R.SUCCESS, None, _lease_ext(ns, timeout))


async def _hello(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    """HELLO (7004): this name server's protocol version, features and uptime."""
    uptime_ms = int((ns.clock() - ns.started) * 1000)
    return cmd.response(R.SUCCESS, None, {**hello_fields(), "uptimeMillis": str(uptime_ms)})


async def _unregister_proxy(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    ns.routes.unregister_proxy(Ext(cmd.ext_fields).str("proxyName"))
    return cmd.response(R.SUCCESS)


async def _proxy_list(ns: NameServer, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_PROXY_LIST (7003): optional extFields protocol, clusterName -> `{"proxies":[...]}`."""
    e = Ext(cmd.ext_fields)
    now = ns.clock()
    proxies = [p.as_json(now) for p in ns.routes.proxy_list(e.str("protocol", ""), e.str("clusterName", ""))]
    return cmd.response(R.SUCCESS, None, None, json.dumps({"proxies": proxies}, sort_keys=True).encode())


async def serve(
    settings: NamesrvSettings, auth: ClusterAuth | None = None, tls: ssl.SSLContext | None = None
) -> int:
    """Run a name server until SIGTERM/SIGINT (with `auth`: a closed cluster; with `tls`: a server
    context, the port serves TLS only); the exit code."""
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ns = NameServer(settings, auth=auth, tls=tls)
    try:
        await ns.start()
    except OSError as e:
        log.error("namesrv cannot listen on %s:%d: %s", settings.host, settings.port, e.strerror or e)
        return 1
    log.info("namesrv listening on %s", ns.address)
    if auth is not None:
        log.info("closed cluster: every connection must prove the cluster secret first")
    if tls is not None:
        log.info("name server port serves TLS only (certificate %s)", settings.tls_cert)
    log.info(
        "name server ready (lease period %.0f s, expiry %.0f s)",
        settings.lease_period_s,
        settings.lease_expiry_s,
    )
    await stop.wait()
    log.info("name server stopping")
    await ns.stop()
    return 0
