"""Which store nodes a proxy uses: the name server's view of the cluster, refreshed every
`refresh_s` (GET_BROKER_CLUSTER_INFO), one `NodeClient` per node, and each node's ordinal (its rank
by name among the nodes seen) and offset tag.

A node whose lease expired (no longer listed) or whose connection broke is skipped until the name
server lists it again and it reconnects; a (re)joining node gets the topics and groups the other
live nodes have. A replica group is one node here (its group name, the primary's address under
broker id 0) with its replicas' addresses (broker ids >= 1) beside: while no primary is registered
or reachable, `readable()` still lists it and reads go to a replica (nodes.py).

A listing without any node of the cluster is not believed for `namesrv_grace_s` (most likely a
restarted name server not refilled yet), nor one without a node that is still connected while
the name server has been up for less than that (refilled by only some heartbeats so far: it says
its uptime at HELLO). While no name server answers, the last listing stays in use: sends and pops
go on over the open connections (`health()` says so). `StaticNodes`
stands in for the name server where the nodes are fixed (`gateway start --workers`: one local
store process)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from namesrv.client import NameServerClient
from remoting.client import RemotingClient
from remoting.cluster_auth import ClusterAuth
from runtime.tasks import cancel_and_wait
from store import Message

from .ids import node_tag
from .nodes import NodeClient, NodeUnavailable

log = logging.getLogger("messaging_processor.cluster")


class StaticNodes:
    """A fixed listing of store nodes ({name: address}) in the name server's answer format: the
    proxies of `gateway start --workers` use their one local store process without a name server."""

    def __init__(self, cluster: str, nodes: dict[str, str]) -> None:
        self.cluster = cluster
        self.nodes = dict(nodes)

    async def cluster_info(self) -> dict[str, Any]:
        return {
            "clusterAddrTable": {self.cluster: sorted(self.nodes)},
            "brokerAddrTable": {n: {"brokerAddrs": {"0": a}} for n, a in self.nodes.items()},
        }

    async def close(self) -> None:
        return None


class Membership:
    """The store nodes of `cluster` listed by the name server(s) `namesrv`. `await start()`, then
    `live()`; `await close()` closes every connection. `on_txn_check(node, msg)` receives the
    transaction checks nodes send."""

    def __init__(
        self,
        namesrv: str | list[str] | StaticNodes,
        cluster: str,
        on_txn_check: Callable[[NodeClient, Message], None],
        *,
        refresh_s: float = 5.0,
        connect_timeout_s: float = 2.0,
        namesrv_grace_s: float = 30.0,
        auth: ClusterAuth | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.auth = auth  # the cluster secret: name server and node connections prove it
        self.tls = tls  # a client context: name server and node connections speak TLS
        self.ns: NameServerClient | StaticNodes = (
            namesrv if isinstance(namesrv, StaticNodes) else NameServerClient(namesrv, auth=auth, tls=tls)
        )
        self.cluster = cluster
        self.refresh_s = refresh_s
        self.connect_timeout_s = connect_timeout_s
        self.namesrv_grace_s = namesrv_grace_s  # how long an empty cluster listing is not believed
        self.on_txn_check = on_txn_check
        self.refreshes = 0  # route refreshes so far
        self.nodes: dict[str, NodeClient] = {}  # every node seen, by name
        self.ordinal: dict[str, int] = {}  # rank by name among the nodes seen
        # handed to each NodeClient: WATCHED and lost connections (watches.py), set before `start`
        self.on_watched: Callable[[NodeClient, str], None] | None = None
        self.on_lost: Callable[[NodeClient, RemotingClient], None] | None = None
        self.by_tag: dict[int, NodeClient] = {}
        self.stats: dict[str, object] = {}  # counters summed over live nodes at the last refresh
        self._absent_since: float | None = None
        self._kept: set[str] = set()  # connected nodes a young name server does not list yet
        self.namesrv_down_since: float | None = None  # no name server answered since then
        self._degraded: set[str] = set()  # groups listed without a primary (logged once)
        self._refresher: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._refresh_lock = asyncio.Lock()
        # logic queues (chain_table.py): told the nodes seen so far before a new one is counted
        # (a join), and after each refresh
        self.before_join: Callable[[list[str]], Awaitable[None]] | None = None
        self.after_refresh: Callable[[], Awaitable[None]] | None = None
        # ... and a node that joined, once it is live and has the topics (the automatic extend)
        self.joined: Callable[[NodeClient], Awaitable[None]] | None = None
        self._joining: set[str] = set()

    async def start(self, wait_s: float = 0.0) -> None:
        """First refresh (retried for up to `wait_s` until a node is live), then refresh every
        `refresh_s` in the background."""
        deadline = time.monotonic() + wait_s
        while True:
            await self.refresh()
            if self.live() or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(0.2, self.refresh_s))
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop(), name="store routes")

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - a bad answer must not end the refreshes
                log.exception("store route refresh failed")

    async def refresh(self) -> None:
        """Ask the name server which store nodes are alive; connect new or returning ones and drop
        those it no longer lists."""
        async with self._refresh_lock:
            self.refreshes += 1
            try:
                info = await self.ns.cluster_info()
            except Exception as e:  # noqa: BLE001 - keep the current view until it answers
                if self.namesrv_down_since is None:
                    self.namesrv_down_since = time.monotonic()
                    names = ", ".join(n.name for n in self.live()) or "none"
                    log.warning(
                        "no name server answers (%s): serving with the last routes (store nodes %s)", e, names
                    )
                await self._reconnect_known()
                return
            if self.namesrv_down_since is not None:
                log.info(
                    "a name server answers again after %.1f s", time.monotonic() - self.namesrv_down_since
                )
                self.namesrv_down_since = None
            clusters = info.get("clusterAddrTable") or {}
            if self.cluster in clusters:
                self._absent_since = None
            elif any(n.alive for n in self.nodes.values()):
                # No store of the cluster listed at all: most likely a restarted name server not
                # refilled yet (soft state). Keep the current stores for one lease period.
                now = time.monotonic()
                if self._absent_since is None:
                    self._absent_since = now
                    log.warning(
                        "the name server lists no store of %s: keeping the current ones", self.cluster
                    )
                if now - self._absent_since < self.namesrv_grace_s:
                    return
            names = set(clusters.get(self.cluster, ()))
            listed: dict[str, tuple[str, list[str]]] = {}  # name -> (primary or "", replicas)
            for name, bd in (info.get("brokerAddrTable") or {}).items():
                addrs = {int(k): v for k, v in (bd.get("brokerAddrs") or {}).items()}
                if name in names and addrs:
                    listed[name] = (addrs.get(0, ""), [addrs[i] for i in sorted(addrs) if i != 0])
            for name, (addr, replicas) in sorted(listed.items()):
                node = self.nodes.get(name)
                if node is None:
                    if self.before_join is not None and any(n.alive for n in self.nodes.values()):
                        try:
                            await self.before_join(sorted(self.nodes))
                        except Exception:  # noqa: BLE001 - the node joins all the same
                            log.exception("preparing the topics for store node %s failed", name)
                        self._joining.add(name)
                    node = self._add(name, addr)
                elif node.addr != addr:
                    await node.close()
                    node.addr = addr
                await node.set_replicas(replicas)
                was_alive = node.alive
                node.listed = True
                if not addr:
                    if name not in self._degraded:
                        self._degraded.add(name)
                        log.warning("store node %s has no primary: reads only, from %s", name, replicas)
                    continue
                self._degraded.discard(name)
                if not node.alive:
                    try:
                        await node.connect(self.connect_timeout_s)
                    except (OSError, TimeoutError) as e:
                        log.warning("store node %s at %s is listed but unreachable: %s", name, addr, e)
                        continue
                if not was_alive:
                    log.info(
                        "store node %s (%s) is live, store protocol version %d%s",
                        name,
                        addr,
                        node.info.version,
                        "" if node.info.version else " (before HELLO: its base operations only)",
                    )
                    self.spawn(self._sync_node(node, name in self._joining))
                    self._joining.discard(name)
            for name, node in self.nodes.items():
                if name in listed:
                    self._kept.discard(name)
                elif node.listed and not self._keep_unlisted(node):
                    node.listed = False
                    self._degraded.discard(name)
                    log.warning(
                        "store node %s (%s) dropped: no longer listed by the name server", name, node.addr
                    )
                    await node.close_all()
            self.spawn(self._refresh_stats())
            if self.after_refresh is not None:
                self.spawn(self.after_refresh())

    async def _reconnect_known(self) -> None:
        """While no name server answers: connect again the listed nodes whose connection broke, at
        their last address (a node restarted meanwhile; HELLO checks that it is the same node)."""
        for node in list(self.nodes.values()):
            if node.listed and node.addr and not node.alive:
                try:
                    await node.connect(self.connect_timeout_s)
                except (OSError, TimeoutError):
                    continue
                log.info("store node %s (%s) is live again, at its last address", node.name, node.addr)

    def _keep_unlisted(self, node: NodeClient) -> bool:
        """Whether a node the name server no longer lists stays in use: yes while it is still
        connected and the name server that answered has been up for less than `namesrv_grace_s`
        (restarted, it lists each node again at the node's next heartbeat); else it is dropped."""
        age = self.ns.listing_age_s() if isinstance(self.ns, NameServerClient) else None
        if not node.alive or age is None or age >= self.namesrv_grace_s:
            self._kept.discard(node.name)
            return False
        if node.name not in self._kept:
            self._kept.add(node.name)
            log.warning(
                "store node %s is not listed by the name server (up for %.1f s) but still connected: kept",
                node.name,
                age,
            )
        return True

    def health(self) -> dict[str, Any]:
        """What this proxy's view of the cluster lacks: `problems` is empty when a name server
        answers and every node seen is live."""
        problems = []
        if self.namesrv_down_since is not None:
            problems.append(
                f"no name server has answered for {time.monotonic() - self.namesrv_down_since:.0f} s:"
                " serving with the last routes"
            )
        if self._absent_since is not None:
            problems.append("the name server lists no store node of the cluster yet: keeping the last ones")
        live = [n.name for n in self.live()]
        if not live:
            problems.append("no store node is live")
        if self._kept:
            problems.append(f"store nodes kept while not listed: {', '.join(sorted(self._kept))}")
        return {
            "namesrv": "ok" if self.namesrv_down_since is None else "unreachable",
            "store_nodes_live": live,
            "store_nodes_known": sorted(self.nodes),
            "problems": problems,
        }

    def _add(self, name: str, addr: str) -> NodeClient:
        node = NodeClient(name, addr, node_tag(name), self.on_txn_check, auth=self.auth, tls=self.tls)
        node.on_watched, node.on_lost = self.on_watched, self.on_lost
        node.connect_timeout_s = self.connect_timeout_s
        other = self.by_tag.get(node.tag)
        if other is not None:
            log.error("store nodes %s and %s share offset tag %d: rename one", name, other.name, node.tag)
        self.nodes[name] = node
        self.by_tag[node.tag] = node
        self.ordinal = {n: i for i, n in enumerate(sorted(self.nodes))}
        return node

    def live(self) -> list[NodeClient]:
        """The nodes in use now, by name."""
        return [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].alive]

    def need_live(self) -> list[NodeClient]:
        """As `live()`; NodeUnavailable when there is none."""
        nodes = self.live()
        if not nodes:
            raise NodeUnavailable("no store node is available")
        return nodes

    def node_count(self) -> int:
        """Nodes seen: global queue ids interleave them (`local * node_count + ordinal`, ids.py)."""
        return max(len(self.ordinal), 1)

    def readable(self) -> list[NodeClient]:
        """The nodes reads can use now, by name: live ones and groups served by a replica."""
        return [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].readable]

    def need_readable(self) -> list[NodeClient]:
        """As `readable()`; NodeUnavailable when there is none."""
        nodes = self.readable()
        if not nodes:
            raise NodeUnavailable("no store node is available")
        return nodes

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run `coro` in the background until it ends or `close()`."""
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _sync_node(self, node: NodeClient, joined: bool = False) -> None:
        """Give a (re)joining node the topics and groups the other live nodes have (then, for a
        node that joined, tell `joined`)."""
        others = [n for n in self.live() if n is not node]
        if not others:
            return
        await self._copy_catalog(node, others)
        if joined and self.joined is not None:
            try:
                await self.joined(node)
            except Exception:  # noqa: BLE001 - logged; an operator can extend by hand
                log.exception("extending topics onto store node %s failed", node.name)

    async def _copy_catalog(self, node: NodeClient, others: list[NodeClient]) -> None:
        try:
            mine = {t["name"] for t in await node.value("list_topics")}
            theirs = await others[0].value("list_topics")
            for t in theirs:
                if t["name"] not in mine and not t["name"].startswith("%"):
                    await node.value(
                        "create_topic",
                        {
                            k: t.get(k)
                            for k in ("name", "queues", "retention_ms", "retention_bytes", "compacted")
                        },
                    )
            my_groups = {g["name"] for g in await node.value("list_groups")}
            for g in await others[0].value("list_groups"):
                if g["name"] not in my_groups and not g["name"].startswith("%"):
                    await node.value("create_group", g)
        except Exception as e:  # noqa: BLE001 - best effort; admin calls fix the rest
            log.warning("syncing topics and groups to store node %s failed: %s", node.name, e)

    async def _refresh_stats(self) -> None:
        total: dict[str, float] = {}
        for node in self.live():
            try:
                for k, v in (await node.value("stats")).items():
                    if isinstance(v, int | float):
                        total[k] = total.get(k, 0) + v
            except Exception:  # noqa: BLE001, S112 - stats are best effort
                continue
        self.stats = {**total, "store_nodes_live": len(self.live()), "store_nodes_known": len(self.nodes)}

    async def close(self) -> None:
        await cancel_and_wait(self._refresher)
        for t in list(self._tasks):
            t.cancel()
        for node in self.nodes.values():
            await node.close_all()
        await self.ns.close()
