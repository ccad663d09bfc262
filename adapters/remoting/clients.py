"""Who is connected to the remoting port: producer and consumer groups from HEART_BEAT, their
subscriptions (the tag filter of pulls that carry none), queue locks of orderly consumers.

Soft state of this proxy, like the Java broker's ConsumerManager / ProducerManager: a client that
stops heartbeating for `expiry_s` (or whose connection closes) is dropped, and the remaining
consumers of its group are told (NOTIFY_CONSUMER_IDS_CHANGED) so that they rebalance at once.
Every client is also registered with the processor's client registry (admin API, transaction
checks) as `<clientID>@<group>`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from messaging_processor import ALL, ClientInfo, ClientKind, Filter, MessagingProcessor
from messaging_processor.model import TransactionCheck

log = logging.getLogger("adapters.remoting")
PROTOCOL = "remoting"
LOCK_EXPIRY_S = 60.0  # RebalanceLockManager's default

# Enum ordinals as the C++ client sends them.
_CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY", "CONSUME_POP")
_MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
_FROM_WHERE = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
)


class Conn(Protocol):
    """What the table needs of a connection."""

    remote: str
    closed: bool

    def notify_consumer_ids_changed(self, group: str) -> None: ...
    def transaction_checker(self, group: str) -> TransactionCheck: ...


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The JSON objects of a list field (anything else in it, or a non-list, is ignored)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _enum(value: Any, names: tuple[str, ...], default: str) -> str:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return names[value] if 0 <= value < len(names) else default
    if isinstance(value, str) and value:
        return value.upper()
    return default


@dataclass(slots=True)
class Subscription:
    topic: str
    expression: str = "*"
    expression_type: str = "TAG"

    @property
    def filter(self) -> Filter | None:
        """The store filter; None for expressions this gateway cannot evaluate (SQL92)."""
        return tag_filter(self.expression, self.expression_type)


def tag_filter(expression: str | None, expression_type: str | None = "TAG") -> Filter | None:
    if expression_type and expression_type.upper() not in ("TAG", ""):
        return None
    return Filter.from_expression(expression) if expression else ALL


@dataclass(slots=True, eq=False)
class Member:
    client_id: str
    conn: Conn
    last_seen: float = field(default_factory=time.monotonic)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    consume_type: str = ""
    message_model: str = ""
    consume_from_where: str = ""


class ClientTable:
    """Producer and consumer groups of this remoting listener (see the module docstring)."""

    def __init__(self, processor: MessagingProcessor, expiry_s: float = 120.0) -> None:
        self.processor = processor
        self.expiry_s = expiry_s
        self.consumers: dict[str, dict[str, Member]] = {}
        self.producers: dict[str, dict[str, Member]] = {}
        self.locks: dict[tuple[str, str, int], tuple[str, float]] = {}

    # ------------------------------------------------------------------ registration
    def heartbeat(self, conn: Conn, data: dict[str, Any], language: str = "", version: str = "") -> None:
        client_id = str(data.get("clientID") or conn.remote)
        now = time.monotonic()
        for p in _dicts(data.get("producerDataSet")):
            group = str(p.get("groupName") or "")
            if group:
                self._touch(self.producers, group, client_id, conn, now)
                self._register(client_id, group, ClientKind.PRODUCER, frozenset(), conn, language, version)
        for c in _dicts(data.get("consumerDataSet")):
            group = str(c.get("groupName") or "")
            if not group:
                continue
            new = self._touch(self.consumers, group, client_id, conn, now)
            m = self.consumers[group][client_id]
            m.consume_type = _enum(c.get("consumeType"), _CONSUME_TYPES, "CONSUME_PASSIVELY")
            m.message_model = _enum(c.get("messageModel"), _MESSAGE_MODELS, "CLUSTERING")
            m.consume_from_where = _enum(c.get("consumeFromWhere"), _FROM_WHERE, "CONSUME_FROM_LAST_OFFSET")
            subs: dict[str, Subscription] = {}
            for s in _dicts(c.get("subscriptionDataSet")):
                topic = str(s.get("topic") or "")
                if topic:
                    subs[topic] = Subscription(
                        topic, str(s.get("subString") or "*"), str(s.get("expressionType") or "TAG")
                    )
            changed = new or subs.keys() != m.subscriptions.keys()
            m.subscriptions = subs
            kind = (
                ClientKind.PULL_CONSUMER if m.consume_type == "CONSUME_ACTIVELY" else ClientKind.PUSH_CONSUMER
            )
            self._register(client_id, group, kind, frozenset(subs), conn, language, version)
            if changed:
                self._notify(group)

    def _touch(
        self, table: dict[str, dict[str, Member]], group: str, client_id: str, conn: Conn, now: float
    ) -> bool:
        members = table.setdefault(group, {})
        m = members.get(client_id)
        if m is None or m.conn is not conn:
            members[client_id] = Member(client_id, conn, now)
            if m is not None:
                members[client_id].subscriptions = m.subscriptions
            return m is None
        m.last_seen = now
        return False

    def _register(
        self,
        client_id: str,
        group: str,
        kind: ClientKind,
        topics: frozenset[str],
        conn: Conn,
        language: str,
        version: str,
    ) -> None:
        reg = self.processor.clients
        cid = f"{client_id}@{group}"
        old = reg.get(PROTOCOL, cid)
        if old is not None and old.kind is kind and old.topics == topics and old.remote == conn.remote:
            reg.touch(PROTOCOL, cid)
            return
        info = ClientInfo(cid, PROTOCOL, kind, group, topics, conn.remote, language, version)
        if kind is ClientKind.PRODUCER:
            info.transaction_check = conn.transaction_checker(group)
        reg.register(info)

    def unregister(self, client_id: str, producer_group: str = "", consumer_group: str = "") -> None:
        if producer_group:
            self._remove(self.producers, producer_group, client_id)
        if consumer_group and self._remove(self.consumers, consumer_group, client_id):
            self._release_locks(consumer_group, client_id)
            self._notify(consumer_group)

    def _remove(self, table: dict[str, dict[str, Member]], group: str, client_id: str) -> bool:
        members = table.get(group)
        if not members or members.pop(client_id, None) is None:
            return False
        if not members:
            del table[group]
        self.processor.clients.unregister(PROTOCOL, f"{client_id}@{group}")
        return True

    def connection_closed(self, conn: Conn) -> None:
        self._drop(lambda m: m.conn is conn)

    def expire(self) -> None:
        """Drop clients silent for `expiry_s` (heartbeats come every 30 s)."""
        cutoff = time.monotonic() - self.expiry_s
        self._drop(lambda m: m.last_seen < cutoff)
        now = time.monotonic()
        for k in [k for k, (_c, exp) in self.locks.items() if exp < now]:
            del self.locks[k]

    def _drop(self, gone: Callable[[Member], bool]) -> None:
        for table, consumer in ((self.producers, False), (self.consumers, True)):
            for group in list(table):
                for cid in [cid for cid, m in table[group].items() if gone(m)]:
                    self._remove(table, group, cid)
                    if consumer:
                        self._release_locks(group, cid)
                        self._notify(group)

    def _notify(self, group: str) -> None:
        for m in list(self.consumers.get(group, {}).values()):
            if not m.conn.closed:
                m.conn.notify_consumer_ids_changed(group)

    # ------------------------------------------------------------------ queries
    def consumer_ids(self, group: str) -> list[str]:
        return sorted(self.consumers.get(group, {}))

    def subscription(self, group: str, topic: str) -> Subscription | None:
        for m in self.consumers.get(group, {}).values():
            s = m.subscriptions.get(topic)
            if s is not None:
                return s
        return None

    # ------------------------------------------------------------------ orderly consumers' queue locks
    def lock(
        self, group: str, client_id: str, queues: list[tuple[str, str, int]]
    ) -> list[tuple[str, str, int]]:
        """Lock (topic, broker name, queue id) triples for `client_id`; returns those it now holds."""
        now = time.monotonic()
        held = []
        for topic, broker, qid in queues:
            key = (group, topic, qid)
            owner = self.locks.get(key)
            if owner is None or owner[0] == client_id or owner[1] < now:
                self.locks[key] = (client_id, now + LOCK_EXPIRY_S)
                held.append((topic, broker, qid))
        return held

    def unlock(self, group: str, client_id: str, queues: list[tuple[str, str, int]]) -> None:
        for topic, _broker, qid in queues:
            key = (group, topic, qid)
            owner = self.locks.get(key)
            if owner is not None and owner[0] == client_id:
                del self.locks[key]

    def _release_locks(self, group: str, client_id: str) -> None:
        for k in [k for k, (c, _e) in self.locks.items() if k[0] == group and c == client_id]:
            del self.locks[k]
