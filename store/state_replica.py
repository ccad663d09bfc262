"""The store's non-log state, for replica groups (docs/store.md, "Replication primitives"): what a
primary hands out and what a replica takes, besides the commit log (store/replication.py).

- **Consumer progress.** A primary's progress operations are a byte stream already (the log of
  store/consumer.py); `watch` sees every chunk as it is flushed, and `progress_snapshot` is the
  whole state at the stream position `progress_position`. A replica `replace_progress`es once
  (then writes a checkpoint) and `apply_progress`es what follows; its own log keeps it.
- **Key-value data.** `watch` sees every committed change; `store.kv.dump`/`replace_all` copy the
  table. A replica applies changes with the ordinary `kv.put_many`.
- **Catalog** (topic and group settings): small, so copied whole (`catalog_state`,
  `apply_catalog`) whenever its `catalog_digest` differs.

`take_over` is for a replica promoted to primary: progress that points past its queues' ends (messages
the old primary handed out before they were replicated, and lost) is cut back, as recovery does
after a machine crash, so that the records taking those offsets next are delivered. Progress is
replicated asynchronously, so the old primary may also have handed out messages this node holds
without the pop reaching it: the next `UNCERTAIN_POPS` offsets past each queue's cursor count as a
second delivery when handed out (AMQP's `redelivered`, gRPC's delivery attempt 2), a hint that may
be wrong the other way round for a message no one had, as AMQP allows.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from .catalog import Catalog
from .checkpoint import Checkpointer
from .config import GroupConfig, RetryPolicy, TopicConfig
from .consumer import ConsumerProgress
from .kv import Change, KeyValueStore

# offsets past each queue's cursor a previous primary may have handed out unreplicated: the pops of
# its last progress flush and pull (about 100-200 ms), per group and queue
UNCERTAIN_POPS = 1024


def catalog_digest(state: dict[str, Any]) -> str:
    """A short digest of a `catalog_state`."""
    return hashlib.blake2b(json.dumps(state).encode(), digest_size=12).hexdigest()


class StateReplica:
    """Hand out (primary) or take (replica) consumer progress, key-value data and the catalog."""

    def __init__(
        self,
        run_io: Callable[..., asyncio.Future],
        catalog: Catalog,
        progress: ConsumerProgress,
        kv: KeyValueStore,
        checkpoints: Checkpointer,
    ) -> None:
        self.run_io = run_io
        self.catalog = catalog
        self.progress = progress
        self.kv = kv
        self.checkpoints = checkpoints
        self.progress_taken = 0  # bytes of progress operations flushed since `watch`

    # ----- primary ---------------------------------------------------------------------------
    def watch(self, on_progress: Callable[[bytes], None] | None, on_kv: Change | None) -> None:
        """Hear progress chunks and key-value changes from now on (None, None: stop)."""
        self.progress_taken = 0
        if on_progress is None:
            self.progress.on_taken = None
        else:

            def taken(data: bytes) -> None:
                self.progress_taken += len(data)
                on_progress(data)

            self.progress.on_taken = taken
        self.kv.on_change = on_kv

    @property
    def progress_position(self) -> int:
        """The position in the watched progress stream that `progress_snapshot` matches now."""
        return self.progress_taken + len(self.progress.buf)

    def progress_snapshot(self) -> bytes:
        return self.progress.snapshot()

    def catalog_state(self) -> dict[str, Any]:
        c = self.catalog
        return {
            "topics": [asdict(t) for _, t in sorted(c.topic_configs.items())],
            "groups": [asdict(g) for _, g in sorted(c.group_configs.items())],
        }

    def catalog_digest(self) -> str:
        return catalog_digest(self.catalog_state())

    # ----- replica ---------------------------------------------------------------------------
    async def replace_progress(self, snapshot: bytes) -> None:
        """Take a primary's whole consumer progress and make it this store's checkpoint."""
        async with self.checkpoints.lock:
            self.progress.replace(snapshot)
            self.progress.ops = 0
            await self.run_io(self.progress.write_checkpoint, self.progress.snapshot(), b"")

    def apply_progress(self, data: bytes) -> None:
        """Apply a primary's progress operations (whole records; logged here by the usual flush)."""
        self.progress.apply(data)

    def apply_catalog(self, state: dict[str, Any]) -> None:
        """Make topic and group settings those of `state` (`catalog_state` of the primary). A topic
                takes the primary's queue count even when it made more for a record that came
        before the settings (the primary's records never use a queue beyond its count)."""
        c = self.catalog
        topics = {t["name"]: TopicConfig.from_dict(t) for t in state["topics"]}
        groups = {}
        for g in state["groups"]:
            g = dict(g)
            g["retry"] = RetryPolicy(**g["retry"])
            groups[g["name"]] = GroupConfig(**g)
        for name in [n for n in c.topic_configs if n not in topics]:
            c.delete_topic(name)
        for name, t in topics.items():
            if c.topic_configs.get(name) != t:
                c.set_topic(t)
        for name in [n for n in c.group_configs if n not in groups]:
            c.delete_group(name)
        for name, g in groups.items():
            if c.group_configs.get(name) != g:
                c.create_group(name, g.max_attempts, g.retry)

    async def take_over(self) -> int:
        """A replica becoming primary: cut progress back to the queues' ends and rebuild what pop
        derives from it; returns how many queues were cut back."""
        async with self.checkpoints.lock:
            progress = self.progress
            ends = {k: cq.max_offset for k, cq in self.catalog.cqs.items()}
            cut = progress.clamp(ends)
            progress.rederive()
            progress.mark_uncertain(ends, UNCERTAIN_POPS)
            if cut:
                await self.run_io(progress.write_checkpoint, progress.snapshot(), progress.take_log())
            return cut


__all__ = ["StateReplica", "catalog_digest"]
