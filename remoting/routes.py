"""Route and cluster bodies the name server (and the gateway's remoting port) answers with.

    TopicRouteData  {"brokerDatas":[{"brokerAddrs":{0:"host:port"},"brokerName":..,"cluster":..}],
                     "filterServerTable":{},"queueDatas":[{"brokerName":..,"perm":6,
                     "readQueueNums":n,"topicSysFlag":0,"writeQueueNums":n}]}
    ClusterInfo     {"brokerAddrTable":{name:BrokerData},"clusterAddrTable":{cluster:[names]}}

`brokerAddrs` maps broker ids (0 = master) to addresses; `encode` writes those keys unquoted for
clients below 4.9.4 (see jsonx.py) and quoted for the rest."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .codes import PERM_READ_WRITE
from .jsonx import dumps_bytes


@dataclass(slots=True)
class BrokerData:
    name: str
    cluster: str
    addrs: dict[int, str] = field(default_factory=dict)  # broker id -> "host:port"

    def as_json(self) -> dict[str, Any]:
        return {"brokerAddrs": dict(self.addrs), "brokerName": self.name, "cluster": self.cluster}


@dataclass(slots=True)
class QueueData:
    broker_name: str
    read_queues: int
    write_queues: int
    perm: int = PERM_READ_WRITE
    topic_sys_flag: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queues,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queues,
        }


def route_data(brokers: list[BrokerData], queues: list[QueueData]) -> dict[str, Any]:
    return {
        "brokerDatas": [b.as_json() for b in sorted(brokers, key=lambda b: b.name)],
        "filterServerTable": {},
        "queueDatas": [q.as_json() for q in sorted(queues, key=lambda q: q.broker_name)],
    }


def cluster_info(brokers: list[BrokerData]) -> dict[str, Any]:
    clusters: dict[str, list[str]] = {}
    for b in brokers:
        clusters.setdefault(b.cluster, []).append(b.name)
    return {
        "brokerAddrTable": {b.name: b.as_json() for b in brokers},
        "clusterAddrTable": {c: sorted(set(names)) for c, names in clusters.items()},
    }


def encode(obj: dict[str, Any], standard_json: bool) -> bytes:
    """Route or cluster JSON; `standard_json=False` writes broker ids as bare numbers."""
    return dumps_bytes(obj, unquoted_int_keys=not standard_json)


def parse_route(data: dict[str, Any]) -> tuple[list[BrokerData], list[QueueData]]:
    """TopicRouteData JSON (as `jsonx.loads` returns it) -> brokers and queue data."""
    brokers = [
        BrokerData(
            str(b.get("brokerName", "")),
            str(b.get("cluster", "")),
            {int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()},
        )
        for b in data.get("brokerDatas") or ()
    ]
    queues = [
        QueueData(
            str(q.get("brokerName", "")),
            int(q.get("readQueueNums", 0)),
            int(q.get("writeQueueNums", 0)),
            int(q.get("perm", PERM_READ_WRITE)),
            int(q.get("topicSysFlag", 0)),
        )
        for q in data.get("queueDatas") or ()
    ]
    return brokers, queues
