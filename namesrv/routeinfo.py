"""The name server's soft state (RocketMQ's RouteInfoManager, plus proxies): which brokers (store
nodes) are alive, which topics and queues each serves, which proxies serve which protocols.

Pure logic over an injected clock (`now`, monotonic seconds). Registrations hold a lease: each
REGISTER_BROKER / REGISTER_PROXY renews it, `scan(now)` drops those not renewed within their
timeout, and closing the connection a broker registered through drops it at once. Nothing is
persisted: a restarted name server is refilled by the next heartbeats."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from remoting.codes import MASTER_ID, PERM_READ_WRITE
from remoting.routes import BrokerData, QueueData

log = logging.getLogger("namesrv")


@dataclass(slots=True)
class TopicQueues:
    """A broker's queues of one topic, as its TopicConfig says."""

    read: int
    write: int
    perm: int = PERM_READ_WRITE
    sys_flag: int = 0


@dataclass(slots=True)
class BrokerLease:
    addr: str
    cluster: str
    name: str
    broker_id: int
    ha_addr: str
    timeout_s: float
    last_update: float
    conn: object = None  # the connection it registered through
    data_version: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ProxyLease:
    name: str
    cluster: str
    endpoints: dict[str, str]  # protocol -> "host:port"
    attributes: dict[str, str]
    timeout_s: float
    last_update: float
    conn: object = None

    def as_json(self, now: float) -> dict[str, Any]:
        return {
            "name": self.name,
            "cluster": self.cluster,
            "endpoints": dict(self.endpoints),
            "attributes": dict(self.attributes),
            "heartbeatTimeoutMillis": int(self.timeout_s * 1000),
            "lastUpdateAgoMillis": int(max(now - self.last_update, 0) * 1000),
        }


class RouteInfo:
    """Brokers, topics and proxies with their leases (see the module docstring)."""

    def __init__(self, default_timeout_s: float = 120.0) -> None:
        self.default_timeout_s = default_timeout_s
        self.brokers: dict[str, BrokerData] = {}  # broker name -> addresses by broker id
        self.clusters: dict[str, set[str]] = {}  # cluster -> broker names
        self.topics: dict[str, dict[str, TopicQueues]] = {}  # topic -> broker name -> queues
        self.leases: dict[str, BrokerLease] = {}  # broker address -> lease
        self.proxies: dict[str, ProxyLease] = {}
        # topic -> its logic queue table (CLUSTER mode: the highest epoch a store node registered)
        self.logic_queues: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ brokers
    def register_broker(
        self,
        *,
        cluster: str,
        addr: str,
        name: str,
        broker_id: int,
        ha_addr: str = "",
        topics: dict[str, TopicQueues] | None = None,
        timeout_s: float | None = None,
        conn: object = None,
        data_version: dict[str, Any] | None = None,
        logic_queues: dict[str, dict[str, Any]] | None = None,
        now: float,
    ) -> tuple[str, str]:
        """Register or renew a broker; a master (id 0) that sends topic configs replaces its queue
        data with them. Returns (master address, master HA address) for the reply."""
        self.clusters.setdefault(cluster, set()).add(name)
        bd = self.brokers.get(name)
        if bd is None:
            bd = self.brokers[name] = BrokerData(name, cluster)
        # One address per broker id: a broker that moved replaces its old address.
        old_addr = bd.addrs.get(broker_id)
        if old_addr is not None and old_addr != addr:
            self.leases.pop(old_addr, None)
        for bid, a in list(bd.addrs.items()):
            if a == addr and bid != broker_id:
                del bd.addrs[bid]
        bd.addrs[broker_id] = addr
        first = addr not in self.leases
        self.leases[addr] = BrokerLease(
            addr,
            cluster,
            name,
            broker_id,
            ha_addr,
            self.default_timeout_s if not timeout_s or timeout_s <= 0 else timeout_s,
            now,
            conn,
            dict(data_version or {}),
        )
        if broker_id == MASTER_ID and topics is not None:
            for t in [t for t, per in self.topics.items() if name in per and t not in topics]:
                self._drop_queue(t, name)
            for t, q in topics.items():
                self.topics.setdefault(t, {})[name] = q
        for t, table in (logic_queues or {}).items():
            have = self.logic_queues.get(t)
            if t in self.topics and (have is None or int(table["epoch"]) > int(have["epoch"])):
                self.logic_queues[t] = table
        if first:
            log.info("broker %s (%s id %d, cluster %s) registered", addr, name, broker_id, cluster)
        master = bd.addrs.get(MASTER_ID, "")
        master_lease = self.leases.get(master)
        return (master, master_lease.ha_addr if master_lease else "") if broker_id != MASTER_ID else ("", "")

    def touch_broker(self, addr: str, now: float) -> bool:
        lease = self.leases.get(addr)
        if lease is None:
            return False
        lease.last_update = now
        return True

    def unregister_broker(self, addr: str, name: str = "", broker_id: int | None = None) -> bool:
        lease = self.leases.pop(addr, None)
        if lease is None:
            return False
        name = lease.name or name
        bd = self.brokers.get(name)
        if bd is not None:
            for bid, a in list(bd.addrs.items()):
                if a == addr:
                    del bd.addrs[bid]
            if not bd.addrs:
                del self.brokers[name]
                names = self.clusters.get(bd.cluster)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self.clusters[bd.cluster]
                for t in [t for t, per in self.topics.items() if name in per]:
                    self._drop_queue(t, name)
            elif lease.broker_id == MASTER_ID:
                # The master left but slaves remain: its topics stay routable (read) via them.
                pass
        log.info("broker %s (%s) unregistered", addr, name)
        return True

    def _drop_queue(self, topic: str, broker: str) -> None:
        per = self.topics.get(topic)
        if per is not None:
            per.pop(broker, None)
            if not per:
                del self.topics[topic]
                self.logic_queues.pop(topic, None)

    # ------------------------------------------------------------------ proxies
    def register_proxy(
        self,
        *,
        name: str,
        endpoints: dict[str, str],
        cluster: str = "",
        attributes: dict[str, str] | None = None,
        timeout_s: float | None = None,
        conn: object = None,
        now: float,
    ) -> ProxyLease:
        first = name not in self.proxies
        p = self.proxies[name] = ProxyLease(
            name,
            cluster,
            dict(endpoints),
            dict(attributes or {}),
            self.default_timeout_s if not timeout_s or timeout_s <= 0 else timeout_s,
            now,
            conn,
        )
        if first:
            log.info(
                "proxy %s registered: %s", name, ", ".join(f"{k} {v}" for k, v in sorted(endpoints.items()))
            )
        return p

    def unregister_proxy(self, name: str) -> bool:
        if self.proxies.pop(name, None) is None:
            return False
        log.info("proxy %s unregistered", name)
        return True

    def proxy_list(self, protocol: str = "", cluster: str = "") -> list[ProxyLease]:
        return [
            p
            for _n, p in sorted(self.proxies.items())
            if (not protocol or protocol in p.endpoints) and (not cluster or p.cluster == cluster)
        ]

    # ------------------------------------------------------------------ leases
    def scan(self, now: float) -> list[str]:
        """Drop brokers and proxies whose lease ran out; returns what was dropped."""
        gone = []
        for addr, lease in list(self.leases.items()):
            if now - lease.last_update > lease.timeout_s:
                log.warning("broker %s (%s) lease expired after %.0f s", addr, lease.name, lease.timeout_s)
                self.unregister_broker(addr)
                gone.append(f"broker {addr}")
        for name, p in list(self.proxies.items()):
            if now - p.last_update > p.timeout_s:
                log.warning("proxy %s lease expired after %.0f s", name, p.timeout_s)
                del self.proxies[name]
                gone.append(f"proxy {name}")
        return gone

    def connection_closed(self, conn: object) -> None:
        for addr, lease in list(self.leases.items()):
            if lease.conn is conn:
                self.unregister_broker(addr)
        for name, p in list(self.proxies.items()):
            if p.conn is conn:
                self.unregister_proxy(name)

    # ------------------------------------------------------------------ queries
    def route(self, topic: str) -> tuple[list[BrokerData], list[QueueData]] | None:
        """Brokers and queue data of `topic`; None when no live broker serves it."""
        per = self.topics.get(topic)
        if not per:
            return None
        queues, brokers = [], []
        for name, q in per.items():
            bd = self.brokers.get(name)
            if bd is None or not bd.addrs:
                continue
            queues.append(QueueData(name, q.read, q.write, q.perm, q.sys_flag))
            brokers.append(BrokerData(bd.name, bd.cluster, dict(bd.addrs)))
        return (brokers, queues) if queues else None

    def broker_list(self) -> list[BrokerData]:
        return [BrokerData(b.name, b.cluster, dict(b.addrs)) for _n, b in sorted(self.brokers.items())]

    def topic_list(self) -> list[str]:
        return sorted(self.topics)

    def data_version(self, addr: str) -> dict[str, Any] | None:
        lease = self.leases.get(addr)
        return lease.data_version if lease else None
