"""Routes and administration: topics and groups (create, resize, delete, describe, list), backlog
counts, compaction, and the durable key-value table adapters keep their metadata in.

`Admin` is handed the `StoreClient`, the processor's `Limits`, the set of topics known to exist
(shared with the send path, which it keeps true on create and delete) and the send path's
`ensure_topic` (a route query may create its topic as a send would)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from store import CompactionStats, GroupConfig, RetryPolicy, TopicConfig

from .errors import ErrorKind, ProcessorError, StoreCall
from .model import ClientContext, GroupInfo, Permission, QueueRoute, Route, TopicInfo
from .store_client import StoreClient
from .validation import Limits, check_group, check_topic

EnsureTopic = Callable[[str, bool | None], Awaitable[None]]


class Admin:
    """The processor's route and admin calls over `store` (see the module docstring)."""

    def __init__(
        self, store: StoreClient, limits: Limits, known_topics: set[str], ensure_topic: EnsureTopic
    ) -> None:
        self.store = store
        self.limits = limits
        self._known_topics = known_topics
        self._ensure_topic = ensure_topic

    # ------------------------------------------------------------------ routes and topics
    async def query_route(self, ctx: ClientContext, topic: str, *, auto_create: bool | None = None) -> Route:
        """The queues of `topic` (creating it when allowed)."""
        check_topic(topic, self.limits)
        await self._ensure_topic(topic, auto_create)
        t = await self.store.get_topic(topic)
        if t is None:
            self._known_topics.discard(topic)
            raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        # logic queues: queues a shrink sealed are listed for reading until retention empties them
        return Route(
            topic,
            tuple(
                QueueRoute(i, Permission.READ_WRITE if i < t.queues else Permission.READ)
                for i in range(t.readable)
            ),
        )

    async def create_topic(
        self,
        name: str,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        compacted: bool = False,
    ) -> TopicInfo:
        check_topic(name, self.limits, for_send=True)
        with StoreCall(None, "", ""):
            t = await self.store.create_topic(name, queues, retention_ms, retention_bytes, compacted)
        self._known_topics.add(name)
        return self._topic_info(t)

    async def resize_topic(self, name: str, queues: int) -> TopicInfo:
        """Logic queues: `queues` (per store) take new messages from now on, without moving any;
        a shrink seals the queues it leaves out (readable until retention empties them). docs/store.md."""
        check_topic(name, self.limits)
        with StoreCall(None, "", ""):
            t = await self.store.resize_topic(name, queues)
        return self._topic_info(t)

    def _topic_info(self, t: TopicConfig, messages: int = 0) -> TopicInfo:
        per_store = t.queues // max(self.store.store_count(), 1)
        return TopicInfo(
            t.name, t.queues, t.retention_ms, t.retention_bytes, messages, per_store, t.compacted, t.readable
        )

    async def delete_topic(self, name: str) -> None:
        self._known_topics.discard(name)
        with StoreCall(None, "", ""):
            await self.store.delete_topic(name)

    async def get_topic(self, name: str) -> TopicInfo:
        t = await self.store.get_topic(name)
        if t is None:
            raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {name} does not exist")
        n = 0
        for q in range(t.readable):
            n += await self.store.max_offset(name, q) - await self.store.min_offset(name, q)
        return self._topic_info(t, n)

    async def topic_consumers(self, name: str) -> dict[str, dict[str, int]]:
        """{group: {backlog, inflight}} for every group that has consumed topic `name`."""
        out = {}
        for group, topic in await self.store.subscriptions():
            if topic == name:
                out[group] = {
                    "backlog": await self.store.backlog(group, name),
                    "inflight": await self.store.inflight_count(group, name),
                }
        return out

    async def list_topics(self, *, include_system: bool = False) -> list[TopicInfo]:
        return [
            self._topic_info(t)
            for t in await self.store.list_topics()
            if include_system or not t.name.startswith("%") or t.name.startswith("%DLQ%")
        ]

    async def compact(self) -> CompactionStats:
        """Compact every compacted topic now (it also runs in the background)."""
        with StoreCall(None, "", ""):
            return await self.store.compact()

    # ------------------------------------------------------------------ groups
    async def create_group(
        self, name: str, max_attempts: int = 16, retry: RetryPolicy | None = None
    ) -> GroupInfo:
        check_group(name, self.limits)
        with StoreCall(None, "", ""):
            g = await self.store.create_group(name, max_attempts, retry)
        return GroupInfo(g.name, g.max_attempts, g.retry.initial_ms, g.retry.multiplier, g.retry.max_ms)

    async def delete_group(self, name: str) -> None:
        with StoreCall(None, "", ""):
            await self.store.delete_group(name)

    async def get_group(self, name: str) -> GroupInfo:
        """A group with backlog and in-flight counts for each topic it has consumed."""
        g = await self.store.get_group(name)
        if g is None:
            raise ProcessorError(ErrorKind.GROUP_NOT_FOUND, f"consumer group {name} does not exist")
        return await self._group_info(g, [t for grp, t in await self.store.subscriptions() if grp == name])

    async def list_groups(self) -> list[GroupInfo]:
        """Every group but the system ones, as `get_group` (the subscriptions are read once)."""
        topics: dict[str, list[str]] = {}
        for grp, topic in await self.store.subscriptions():
            topics.setdefault(grp, []).append(topic)
        gs = [g for g in await self.store.list_groups() if not g.name.startswith("%")]
        return [await self._group_info(g, topics.get(g.name, [])) for g in gs]

    async def _group_info(self, g: GroupConfig, topics: list[str]) -> GroupInfo:
        info = GroupInfo(g.name, g.max_attempts, g.retry.initial_ms, g.retry.multiplier, g.retry.max_ms)
        for topic in topics:
            if await self.store.get_topic(topic) is not None:
                info.topics[topic] = {
                    "backlog": await self.store.backlog(g.name, topic),
                    "inflight": await self.store.inflight_count(g.name, topic),
                }
        return info

    async def group_names(self) -> list[str]:
        """The names of the groups, system ones included (no counts: cheap with many groups)."""
        return [g.name for g in await self.store.list_groups()]

    async def backlog(self, group: str, topic: str) -> tuple[int, int]:
        """(messages of `topic` not yet acked by `group`, how many of those are in flight)."""
        with StoreCall(None, "", ""):
            return await self.store.backlog(group, topic), await self.store.inflight_count(group, topic)

    async def get_max_attempts(self, group: str) -> int:
        g = await self.store.get_group(group)
        return g.max_attempts if g is not None else 16

    # ------------------------------------------------------------------ durable protocol metadata
    # Adapters keep what must outlive a proxy (MQTT sessions, AMQP declarations, webhook
    # subscriptions) here, under a namespace of their own ("mqtt.session").
    async def kv_put(self, ns: str, key: str, value: bytes) -> None:
        """Store `value` under (ns, key); returns once durable."""
        await self.store.kv_put(ns, key, value)

    async def kv_put_many(self, ns: str, items: dict[str, bytes | None]) -> None:
        """Set several keys (None deletes) in one durable transaction."""
        await self.store.kv_put_many(ns, items)

    async def kv_put_if_absent(self, ns: str, key: str, value: bytes) -> bytes | None:
        """Store `value` unless (ns, key) exists, atomically, on the store every proxy shares:
        None when stored (durable), else the value already there."""
        return await self.store.kv_put_if_absent(ns, key, value)

    async def kv_get(self, ns: str, key: str) -> bytes | None:
        return await self.store.kv_get(ns, key)

    async def kv_delete(self, ns: str, key: str) -> bool:
        return await self.store.kv_delete(ns, key)

    async def kv_scan(self, ns: str, prefix: str = "") -> list[tuple[str, bytes]]:
        """(key, value) pairs of `ns` whose key starts with `prefix`, in key order."""
        return await self.store.kv_scan(ns, prefix)

    def store_stats(self) -> dict[str, object]:
        return self.store.stats()
