"""Who is connected, through which protocol, as what: the processor's client registry.

Clients that register (gRPC, RocketMQ 4.x) are kept here. Adapters whose consumers live in their
own connection state (AMQP `basic.consume`, MQTT subscriptions) do not copy them in: each hands in
one `ConsumerReport`, a function the registry calls when asked (`consumers`), which returns that
adapter's live consumers as `ConsumerRow`s, described in the protocol's own words (`details`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from .model import ClientInfo, ClientKind


@dataclass(slots=True)
class ConsumerRow:
    """One live consumer an adapter reports: who, on which group and topics, and the protocol's
    own facts about it (`details`, e.g. AMQP channel and prefetch, MQTT filter and QoS)."""

    protocol: str
    client_id: str
    group: str = ""  # the consumer group it takes messages with ("" when it has none)
    topics: frozenset[str] = frozenset()  # store topics it reads ("*": every topic)
    remote: str = ""
    since: float = 0.0  # connected at, epoch seconds
    connection: str = ""  # the connection's id (the console's close handle), when it has one
    details: dict[str, str | int | bool] = field(default_factory=dict)


ConsumerReport = Callable[[], Iterable[ConsumerRow]]


_CONSUMING = frozenset({ClientKind.PUSH_CONSUMER, ClientKind.SIMPLE_CONSUMER, ClientKind.PULL_CONSUMER})


class ClientRegistry:
    """Clients keyed by (protocol, client_id). Adapters register on connect (or first request),
    touch on heartbeat and unregister on disconnect; `expire` drops clients that went quiet."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, str], ClientInfo] = {}
        self._rr = itertools.count()
        self._reports: list[ConsumerReport] = []
        # told of each client that registers anew (reason None) or goes ("unregistered", "expired"):
        # the client events of registering protocols (client_events.py `watch`); None: nobody
        self.watch: Callable[[ClientInfo, str | None], None] | None = None

    def add_consumer_report(self, report: ConsumerReport) -> None:
        """An adapter hands in the function that lists its live consumers (`consumers` calls it)."""
        self._reports.append(report)

    def remove_consumer_report(self, report: ConsumerReport) -> None:
        if report in self._reports:
            self._reports.remove(report)

    def reported_consumers(self) -> list[ConsumerRow]:
        """What the adapters' reports give (not the registered clients)."""
        return [row for report in list(self._reports) for row in report()]

    def consumers(self, group: str | None = None, topic: str | None = None) -> list[ConsumerRow]:
        """Live consumers of every protocol (of `group`, or reading `topic`): the registered
        clients that consume, then what each adapter's report gives."""
        rows = [
            ConsumerRow(
                c.protocol,
                c.client_id,
                c.group,
                c.topics,
                c.remote,
                c.connected_at,
                details={"kind": c.kind.value},
            )
            for c in self._clients.values()
            if c.kind in _CONSUMING
        ]
        rows.extend(self.reported_consumers())
        return [
            r
            for r in rows
            if (group is None or r.group == group) and (topic is None or topic in r.topics or "*" in r.topics)
        ]

    def register(self, info: ClientInfo) -> ClientInfo:
        """Add or replace a client; returns what is now registered."""
        old = self._clients.get((info.protocol, info.client_id))
        if old is not None:
            info.connected_at = old.connected_at
            if info.transaction_check is None:
                info.transaction_check = old.transaction_check
        self._clients[(info.protocol, info.client_id)] = info
        if old is None and self.watch is not None:
            self.watch(info, None)
        return info

    def get(self, protocol: str, client_id: str) -> ClientInfo | None:
        return self._clients.get((protocol, client_id))

    def touch(self, protocol: str, client_id: str) -> bool:
        info = self._clients.get((protocol, client_id))
        if info is None:
            return False
        info.last_seen = time.time()
        return True

    def unregister(self, protocol: str, client_id: str) -> ClientInfo | None:
        info = self._clients.pop((protocol, client_id), None)
        if info is not None and self.watch is not None:
            self.watch(info, "unregistered")
        return info

    def expire(self, max_idle_s: float, protocol: str | None = None) -> list[ClientInfo]:
        """Drop clients (of `protocol`, or all) not seen for `max_idle_s`; returns them."""
        cutoff = time.time() - max_idle_s
        gone = [
            k
            for k, c in self._clients.items()
            if c.last_seen < cutoff and (protocol is None or k[0] == protocol)
        ]
        out = [self._clients.pop(k) for k in gone]
        if self.watch is not None:
            for c in out:
                self.watch(c, "expired")
        return out

    def __iter__(self) -> Iterator[ClientInfo]:
        return iter(list(self._clients.values()))

    def __len__(self) -> int:
        return len(self._clients)

    def list(
        self, protocol: str | None = None, group: str | None = None, kind: ClientKind | None = None
    ) -> list[ClientInfo]:
        return [
            c
            for c in self._clients.values()
            if (protocol is None or c.protocol == protocol)
            and (group is None or c.group == group)
            and (kind is None or c.kind == kind)
        ]

    def transaction_checkers(self, topic: str) -> list[ClientInfo]:
        """Producers of `topic` able to resolve an orphaned transaction, rotated for fairness."""
        cands = [
            c
            for c in self._clients.values()
            if c.transaction_check is not None and (not c.topics or topic in c.topics)
        ]
        if len(cands) > 1:
            k = next(self._rr) % len(cands)
            cands = cands[k:] + cands[:k]
        return cands
