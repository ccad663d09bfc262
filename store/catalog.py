"""The catalog: topics and groups (their settings, kept in meta.db) and the consume queues of each
topic, opened on first use. Topics (system ones always) and groups are created on demand."""

from __future__ import annotations

import os
from collections.abc import Callable

from .config import GroupConfig, Metadata, RetryPolicy, StoreConfig, TopicConfig, check_name
from .consumequeue import ConsumeQueue
from .errors import GroupNotFound, TopicNotFound
from .openfiles import OpenFiles


class Catalog:
    def __init__(self, config: StoreConfig, meta: Metadata) -> None:
        self.config = config
        self.meta = meta
        self.topic_configs: dict[str, TopicConfig] = meta.load_topics()
        self.group_configs: dict[str, GroupConfig] = meta.load_groups()
        self.cqs: dict[tuple[str, int], ConsumeQueue] = {}
        # the consume queue files held open: opened on use, the least recently used closed past it
        self.files = OpenFiles(config.max_open_queue_files)
        # the compacted topics (the append path routes their records by key: compaction.py)
        self.compacted: set[str] = {n for n, t in self.topic_configs.items() if t.compacted}
        # a topic's writable queues, by queue id (the append path reads it directly: keep the same
        # dict), and its readable ones (those plus the sealed ones: pops read it directly)
        self.topic_queues: dict[str, list[ConsumeQueue]] = {}
        self.readable_queues: dict[str, list[ConsumeQueue]] = {}

    def create_topic(
        self,
        name: str,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        compacted: bool = False,
        tier_retention_ms: int | None = None,
    ) -> TopicConfig:
        """Create a topic or change its settings; more queues than it has grow it (`resize`),
        fewer are ignored (a shrink is `resize`'s explicit decision)."""
        check_name("topic", name)
        for v in (retention_ms, retention_bytes, tier_retention_ms):
            if v is not None and v < 1:
                raise ValueError("retention limits must be positive (None: the default)")
        t = TopicConfig(name, queues or self.config.default_queues, retention_ms, retention_bytes, compacted)
        t.tier_retention_ms = tier_retention_ms
        _check_count(t.queues)
        old = self.topic_configs.get(name)
        if old is not None:
            t.queues, t.read_queues, t.epochs = old.queues, old.read_queues, old.epochs
        self.topic_configs[name] = t
        if old is not None and queues is not None and queues > old.queues:
            return self.resize(name, queues)
        self.meta.save_topic(t)
        self._forget_lists(name)
        self._note_compacted(t)
        return t

    def resize(self, name: str, queues: int) -> TopicConfig:
        """Logic queues: `queues` take new messages from now on, without moving any. Queues a
        shrink leaves out are sealed (readable until retention empties them, `trim_sealed`);
        queues a growth brings back continue their offsets. The change is recorded as an epoch (old count, end
        offset of each old queue) so that a message group's later messages wait for its earlier
        ones in its previous queue (popping.py)."""
        _check_count(queues)
        t = self.topic_configs.get(name)
        if t is None:
            raise TopicNotFound(name)
        if queues == t.queues:
            return t
        if t.compacted:
            raise ValueError(
                f"topic {name} is compacted: its queue count is fixed (a key's records stay in one queue)"
            )
        ends = [self.cq(name, q).next_offset for q in range(max(t.readable, queues))]
        t.epochs = [*t.epochs, [t.queues, ends]]
        t.read_queues = max(t.readable, queues)
        t.queues = queues
        self.meta.save_topic(t)
        self._forget_lists(name)
        return t

    def trim_sealed(self, name: str, drained: Callable[[ConsumeQueue], bool]) -> bool:
        """Stop listing sealed queues (from the last) that are `drained`; True if any went."""
        t = self.topic_configs.get(name)
        if t is None or t.read_queues <= t.queues:
            return False
        n = t.read_queues
        while n > t.queues and drained(self.cq(name, n - 1)):
            n -= 1
        if n == t.read_queues:
            return False
        t.read_queues = n if n > t.queues else 0
        self.meta.save_topic(t)
        self._forget_lists(name)
        return True

    def sealed_topics(self) -> list[TopicConfig]:
        return [t for t in self.topic_configs.values() if t.read_queues > t.queues]

    def _forget_lists(self, name: str) -> None:
        self.topic_queues.pop(name, None)
        self.readable_queues.pop(name, None)

    def _note_compacted(self, t: TopicConfig) -> None:
        if t.compacted:
            self.compacted.add(t.name)
        else:
            self.compacted.discard(t.name)

    def set_topic(self, t: TopicConfig) -> None:
        """Take settings as they are (a replica taking its primary's: no queue is removed there)."""
        self.topic_configs[t.name] = t
        self.meta.save_topic(t)
        self._forget_lists(t.name)
        self._note_compacted(t)

    def delete_topic(self, name: str) -> None:
        if name not in self.topic_configs:
            raise TopicNotFound(name)
        del self.topic_configs[name]
        self.meta.delete_topic(name)
        self._forget_lists(name)
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
            cq = self.cqs[(topic, qid)] = ConsumeQueue(path, topic, qid, self.files)
        return cq

    def queues(self, topic: str) -> list[ConsumeQueue]:
        """A topic's writable queues (the topic is created on demand, see `topic`)."""
        qs = self.topic_queues.get(topic)
        if qs is None:
            n = self.topic(topic).queues
            qs = self.topic_queues[topic] = [self.cq(topic, i) for i in range(n)]
        return qs

    def readable(self, topic: str) -> list[ConsumeQueue]:
        """A topic's queues that may hold messages: the writable ones, then the sealed ones."""
        qs = self.readable_queues.get(topic)
        if qs is None:
            n = self.topic(topic).readable
            qs = self.readable_queues[topic] = [self.cq(topic, i) for i in range(n)]
        return qs

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """One queue (writable or sealed) of an existing topic."""
        if topic not in self.topic_configs:
            raise TopicNotFound(topic)
        qs = self.readable(topic)
        if not 0 <= queue_id < len(qs):
            raise ValueError(f"topic {topic} has no queue {queue_id}")
        return qs[queue_id]


def _check_count(queues: int) -> None:
    if not 1 <= queues <= 1024:
        raise ValueError("a topic has 1 to 1024 queues")
