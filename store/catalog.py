"""The catalog: topics and groups (their settings, kept in meta.db) and the consume queues of each
topic, opened on first use. Topics (system ones always) and groups are created on demand."""

from __future__ import annotations

import os

from .config import GroupConfig, Metadata, RetryPolicy, StoreConfig, TopicConfig, check_name
from .consumequeue import ConsumeQueue
from .errors import GroupNotFound, TopicNotFound


class Catalog:
    def __init__(self, config: StoreConfig, meta: Metadata) -> None:
        self.config = config
        self.meta = meta
        self.topic_configs: dict[str, TopicConfig] = meta.load_topics()
        self.group_configs: dict[str, GroupConfig] = meta.load_groups()
        self.cqs: dict[tuple[str, int], ConsumeQueue] = {}
        # the compacted topics (the append path routes their records by key: compaction.py)
        self.compacted: set[str] = {n for n, t in self.topic_configs.items() if t.compacted}
        # a topic's queues, by queue id (the append path reads it directly: keep the same dict)
        self.topic_queues: dict[str, list[ConsumeQueue]] = {}

    def create_topic(
        self,
        name: str,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        compacted: bool = False,
    ) -> TopicConfig:
        check_name("topic", name)
        t = TopicConfig(name, queues or self.config.default_queues, retention_ms, retention_bytes, compacted)
        if not 1 <= t.queues <= 1024:
            raise ValueError("a topic has 1 to 1024 queues")
        old = self.topic_configs.get(name)
        if old is not None and old.queues > t.queues:
            t.queues = old.queues  # queues are never removed while they may hold messages
        self.topic_configs[name] = t
        self.meta.save_topic(t)
        self.topic_queues.pop(name, None)
        self._note_compacted(t)
        return t

    def _note_compacted(self, t: TopicConfig) -> None:
        if t.compacted:
            self.compacted.add(t.name)
        else:
            self.compacted.discard(t.name)

    def set_topic(self, t: TopicConfig) -> None:
        """Take settings as they are (a replica taking its primary's: no queue is removed there)."""
        self.topic_configs[t.name] = t
        self.meta.save_topic(t)
        self.topic_queues.pop(t.name, None)
        self._note_compacted(t)

    def delete_topic(self, name: str) -> None:
        if name not in self.topic_configs:
            raise TopicNotFound(name)
        del self.topic_configs[name]
        self.meta.delete_topic(name)
        self.topic_queues.pop(name, None)
        self.compacted.discard(name)

    def topics(self) -> list[TopicConfig]:
        return [t for n, t in sorted(self.topic_configs.items())]

    def topic(self, name: str, create: bool | None = None) -> TopicConfig:
        t = self.topic_configs.get(name)
        if t is None:
            system = name.startswith("%")  # %HALF%, %SCHEDULE%, %DLQ%...: always created on demand
            if system or (create if create is not None else self.config.auto_create_topics):
                return self.create_topic(name, 1 if system else None)
            raise TopicNotFound(name)
        return t

    def create_group(
        self, name: str, max_attempts: int = 16, retry: RetryPolicy | None = None
    ) -> GroupConfig:
        check_name("group", name)
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        g = GroupConfig(name, max_attempts, retry or RetryPolicy())
        self.group_configs[name] = g
        self.meta.save_group(g)
        return g

    def delete_group(self, name: str) -> None:
        if name not in self.group_configs:
            raise GroupNotFound(name)
        del self.group_configs[name]
        self.meta.delete_group(name)

    def groups(self) -> list[GroupConfig]:
        return [g for n, g in sorted(self.group_configs.items())]

    def group(self, name: str) -> GroupConfig:
        g = self.group_configs.get(name)
        if g is None:
            check_name("group", name)
            g = self.create_group(name)
        return g

    def cq(self, topic: str, qid: int) -> ConsumeQueue:
        """A consume queue, opened (or created) on first use, whether or not its topic exists."""
        cq = self.cqs.get((topic, qid))
        if cq is None:
            path = os.path.join(self.config.data_dir, "consumequeue", topic, str(qid))
            cq = self.cqs[(topic, qid)] = ConsumeQueue(path, topic, qid)
        return cq

    def queues(self, topic: str) -> list[ConsumeQueue]:
        """A topic's queues (the topic is created on demand, see `topic`)."""
        qs = self.topic_queues.get(topic)
        if qs is None:
            n = self.topic(topic).queues
            qs = self.topic_queues[topic] = [self.cq(topic, i) for i in range(n)]
        return qs

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """One queue of an existing topic."""
        if topic not in self.topic_configs:
            raise TopicNotFound(topic)
        qs = self.queues(topic)
        if not 0 <= queue_id < len(qs):
            raise ValueError(f"topic {topic} has no queue {queue_id}")
        return qs[queue_id]
