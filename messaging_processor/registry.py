"""Who is connected, through which protocol, as what: the processor's client registry."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

from .model import ClientInfo, ClientKind


class ClientRegistry:
    """Clients keyed by (protocol, client_id). Adapters register on connect (or first request),
    touch on heartbeat and unregister on disconnect; `expire` drops clients that went quiet."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, str], ClientInfo] = {}
        self._rr = itertools.count()

    def register(self, info: ClientInfo) -> ClientInfo:
        """Add or replace a client; returns what is now registered."""
        old = self._clients.get((info.protocol, info.client_id))
        if old is not None:
            info.connected_at = old.connected_at
            if info.transaction_check is None:
                info.transaction_check = old.transaction_check
        self._clients[(info.protocol, info.client_id)] = info
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
        return self._clients.pop((protocol, client_id), None)

    def expire(self, max_idle_s: float, protocol: str | None = None) -> list[ClientInfo]:
        """Drop clients (of `protocol`, or all) not seen for `max_idle_s`; returns them."""
        cutoff = time.time() - max_idle_s
        gone = [
            k
            for k, c in self._clients.items()
            if c.last_seen < cutoff and (protocol is None or k[0] == protocol)
        ]
        return [self._clients.pop(k) for k in gone]

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
