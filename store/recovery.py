"""Recovery at open, on the IO thread before anything else runs: from the last checkpoint, check the
queues' newest entries, truncate queue and index files to the checkpoint, replay the commit log
past it into them (cutting a torn or corrupt tail), rebuild everything from the start when the
queues do not line up with the log, and cut consumer progress back to the recovered queue ends."""

from __future__ import annotations

import json
import logging
import os

from . import codec
from .catalog import Catalog
from .checkpoint import write_checkpoint_file
from .commitlog import CommitLog
from .config import StoreConfig
from .consumer import ConsumerProgress
from .index import MessageIndex
from .message import entry_hash
from .retention import SegmentStats

log = logging.getLogger("store")


class Recovery:
    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        index: MessageIndex,
        catalog: Catalog,
        segments: SegmentStats,
    ) -> None:
        self.data_dir = config.data_dir
        self.commitlog = commitlog
        self.index = index
        self.catalog = catalog
        self.cqs = catalog.cqs
        self.segments = segments

    def run(self) -> ConsumerProgress:
        """Bring the files to a consistent state; returns the consumer progress, loaded and cut back."""
        cp_path = os.path.join(self.data_dir, "checkpoint.json")
        cp = {}
        if os.path.exists(cp_path):
            with open(cp_path, "rb") as f:
                cp = json.loads(f.read())
        cl = self.commitlog
        start = max(cp.get("commitlog", 0), cl.min_offset)
        self.segments.load(cp.get("segments", {}))
        expected = {}  # entries each queue had at the checkpoint: a shorter queue file was damaged
        for name, count in cp.get("queues", {}).items():
            topic, _, qid = name.rpartition("/")
            expected[(topic, int(qid))] = count
        for name in set(self._existing_queues()) | set(expected):
            self.catalog.cq(*name)
        if not self._tail_is_valid():
            start = max(start - start % cl.segment_size, cl.min_offset)
            log.warning("data before the checkpoint is damaged: recovering from offset %d", start)
        ok = self._replay_commitlog(start)
        if ok and any(self.cqs[k].max_offset < n for k, n in expected.items()):
            ok = False
        if not ok:
            log.warning("consume queues do not match the commit log: rebuilding them from %d", cl.min_offset)
            for cq in self.cqs.values():
                cq.truncate_to_commitlog(-1)
                cq.rebase(0)
            self.segments.by_base = {}
            self._replay_commitlog(cl.min_offset, rebuild=True)
        cl.truncate(cl.scan_end)
        for cq in self.cqs.values():
            cq.set_min_by_commitlog(cl.min_offset)
        queues = {f"{t}/{q}": cq.max_offset for (t, q), cq in self.cqs.items()}
        for cq in self.cqs.values():
            cq.sync()  # only those recovery wrote or cut: the others were synced by a checkpoint
        self.index.sync()
        write_checkpoint_file(self.data_dir, cl.scan_end, queues, self.segments)
        progress = ConsumerProgress(os.path.join(self.data_dir, "consumers"))
        cut = progress.clamp({k: cq.max_offset for k, cq in self.cqs.items()})
        if cut:
            log.warning("consumer progress of %d queues was past their recovered end: cut back", cut)
            progress.write_checkpoint(progress.snapshot(), progress.take_log())
        return progress

    def _replay_commitlog(self, start: int, rebuild: bool = False) -> bool:
        cl = self.commitlog
        for cq in self.cqs.values():
            cq.truncate_to_commitlog(start)
        self.index.load(start)
        idx = bytearray()
        count_segment = self.segments.count
        for clo, buf, pos, size in cl.scan(start):
            msg = codec.decode(buf, pos, clo)
            cq = self.catalog.cq(msg.topic, msg.queue_id)
            if rebuild and cq.next_offset == cq.base == 0 and msg.queue_offset > 0 and not cq.pending:
                cq.rebase(msg.queue_offset)  # rebuilt after retention removed the first entries
            if msg.queue_offset != cq.next_offset:
                if msg.queue_offset < cq.next_offset:
                    continue
                return False
            cq.reserve(clo, size, entry_hash(msg), msg.store_timestamp)
            self.index.add(msg.message_id, msg.keys, clo)
            idx += MessageIndex.encode(msg.message_id, msg.keys, clo)
            count_segment(clo, msg.topic, size, msg.store_timestamp)
        for cq in self.cqs.values():
            if cq.pending:
                first = cq.max_offset
                cq.write_at(first, cq.take_pending())
                cq.max_offset = cq.file_offset = cq.next_offset
        self.index.append_file(bytes(idx))
        return True

    def _tail_is_valid(self) -> bool:
        """Do the newest consume queue entries point at valid records? (a cheap check at start)"""
        for cq in self.cqs.values():
            if cq.max_offset > cq.base:
                clo, size, _th, _ts = cq.entry(cq.max_offset - 1)
                if clo < self.commitlog.local_min_offset:
                    continue  # its segment is gone (retention; a compacted topic keeps a copy) or tiered
                try:
                    buf = self.commitlog.read(clo, size)
                    codec.check(buf, 0, len(buf))
                except (KeyError, codec.CorruptRecord):
                    return False
        return True

    def _existing_queues(self) -> list[tuple[str, int]]:
        root = os.path.join(self.data_dir, "consumequeue")
        out = []
        if os.path.isdir(root):
            for topic in os.listdir(root):
                for q in os.listdir(os.path.join(root, topic)):
                    if q.isdigit():
                        out.append((topic, int(q)))
        return out
