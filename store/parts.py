"""The parts of an open store, made once recovery is done over the files it recovered, each handed
only what it uses: the append path (appending.py, writing through writer.py), reads (reading.py),
pop consumption and long polling (popping.py), tail reads (tailing.py), checkpoints
(checkpoint.py), delayed and transactional messages (scheduling.py), compaction (compaction.py),
retention (retention.py), cold reads (cold_reads.py), the replication of state and of the commit
log (state_replica.py, replication.py). `Store.open` makes one `Parts`; the Store's API calls
into them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .appending import Appender
from .catalog import Catalog
from .checkpoint import Checkpointer
from .cold_reads import ColdReads
from .commitlog import CommitLog
from .compaction import Compactor
from .config import StoreConfig
from .consumer import ConsumerProgress
from .epochs import EpochLog
from .errors import TieredRangeNotCached
from .index import MessageIndex
from .kv import KeyValueStore
from .popping import LongPolling, Popper
from .reading import Reader
from .replication import LogReplica
from .retention import Retention, SegmentStats
from .scheduling import DelayedMessages, Transactions
from .state_replica import StateReplica
from .tailing import Tails
from .tiering import TieredLog
from .writer import GroupCommitWriter


class Parts:
    """One object per concern of an open store, wired together."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        run_io: Callable[..., asyncio.Future],
        config: StoreConfig,
        catalog: Catalog,
        commitlog: CommitLog,
        index: MessageIndex,
        segments: SegmentStats,
        epochs: EpochLog,
        kv: KeyValueStore,
        progress: ConsumerProgress,
        metrics: dict[str, int],
        flush_latency_ms: list[float],
        tier: TieredLog | None,
        fetch_tiered: Callable[[TieredRangeNotCached], Awaitable[None]],
    ) -> None:
        cl = commitlog
        self.polls = polls = LongPolling(loop)
        self.appender = appender = Appender(
            loop, config, catalog, cl, index, segments, polls, metrics, flush_latency_ms
        )
        self.writer: GroupCommitWriter = appender.writer
        self.reader = reader = Reader(cl, index, catalog, progress)
        self.pops = pops = Popper(catalog, progress, cl.read_message, appender.submit, polls, metrics)
        self.checkpoints = checkpoints = Checkpointer(
            loop, run_io, config, self.writer, cl, index, catalog.cqs, segments, progress
        )
        self.delays = delays = DelayedMessages(
            catalog,
            cl,
            progress,
            cl.read_message,
            reader.get_by_id,
            appender.submit,
            checkpoints.flush_progress,
        )
        self.transactions = transactions = Transactions(
            config, catalog, cl, progress, reader.get_message, reader.get_by_id, appender.submit
        )
        appender.on_delayed = delays.schedule
        appender.on_half = transactions.track
        self.compactor = compactor = Compactor(
            config, catalog, cl, run_io, cl.read_message, checkpoints.checkpoint
        )
        compactor.attach()
        self.retention = retention = Retention(
            config, catalog, cl, index, segments, delays, transactions, checkpoints, run_io
        )
        retention.uncompacted_floor = compactor.uncompacted_floor
        retention.expire()  # (what per-topic retention hid stays hidden after a restart)
        self.tails = Tails(reader, catalog, polls, fetch_tiered)
        self.cold = ColdReads(config, catalog, cl)  # old data's reads, apart from the live tail
        if tier is not None:
            tier.run_io = run_io
            tier.floor = retention.held_floor  # (read synchronously: stays local)
            pops.fetch_tiered = fetch_tiered
        self.state = StateReplica(run_io, catalog, progress, kv, checkpoints)
        self.replica = LogReplica(
            loop,
            run_io,
            config,
            catalog,
            cl,
            index,
            segments,
            self.writer,
            checkpoints,
            progress,
            polls,
            delays,
            transactions,
            epochs,
        )
