"""Commit log replication inside a replica group (docs/cluster.md, "Replica groups").

Replicas pull from the primary over the store protocol, so the primary never tracks connections
of its own:

- `REPL_STATE` (replica -> primary): the primary's epochs, log end, log start (its first retained
  segment) and the queue offsets its log starts each queue at. The replica finds where its log and
  the primary's agree (`store.epochs.divergence`), truncates what lies beyond, and takes the
  primary's epoch entries. A replica that holds nothing (a new node, or a lost disk: docs/cluster.md,
  "Lost disk") while the primary's log starts later first re-bases its empty log at that start. A
  replica that holds records but ends before that start cannot catch up: it logs an error and keeps
  retrying, touching nothing, until an operator wipes its data directory.
- `REPL_PULL` (extFields `start`, `max`, `wait_ms`, `replica`): the commit log bytes from `start`
  (the replica's log end), whole records only, exactly as the primary holds them, and the primary's
  log start (extField `start`): the replica deletes its segments below it, as retention did on the
  primary. When there is nothing new the primary waits up to `wait_ms` for an append. `start` is
  also the replica's acknowledgement: it holds everything before `start` durably (its apply returned).

`Primary` is the primary's side: it answers both requests and keeps each replica's acknowledged
offset. `wait_replicated` turns that into the sync acknowledgement policy, as Kafka's ISR does:
a send is acknowledged once every replica in `required` (the SyncStateSet without the primary)
holds its records and `required` still makes `min_insync` nodes with the primary. The group member
keeps the controller's SyncStateSet a subset of `required` (it adds a replica here before recording
it and removes it here only after), so any node the controller may elect holds every acknowledged
send. A send that waits `stall_s` for a replica sets `stalled`: the member then takes the replicas
it waits for out of the SyncStateSet at once (as long as `min_insync` still holds), and waiters
re-evaluate when `required` shrinks (`required_changed`), so the sends in flight when a replica
pauses are acknowledged by the remaining in-sync replicas, within the wait. `Follower` is a
replica's side: one task that pulls and applies, reconnecting after errors (the loop of
cluster/following.py, which state replication runs too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from remoting import RemotingCommand, ResponseCode
from remoting.client import RemotingClient
from remoting.cluster_auth import ClusterAuth
from store import Store, StoreError
from store.epochs import divergence
from store.tier_reads import read_through

from .following import FollowerLoop

log = logging.getLogger("cluster.replication")

REPL_STATE = 9190
REPL_PULL = 9191
CODES = frozenset({REPL_STATE, REPL_PULL})
DEFAULT_CHUNK = 1024 * 1024
POLL_FALLBACK_S = 0.05  # appends the node does not see (delay release, retries) are found this late
BEHIND_RETRY_S = 5.0  # how often a replica that cannot catch up tries (and logs) again
STALL_S = 1.0  # a send waiting this long for a replica has it taken out of the SyncStateSet


class ReplicaBehind(ValueError):
    """The replica's log ends before the primary's log start: it holds records, so it is not
    re-based, and it cannot catch up (its data directory must be wiped)."""


@dataclass
class ReplicaInfo:
    """What the primary knows of one replica: the offset it acknowledged and when."""

    acked: int = 0
    seen: float = field(default_factory=time.monotonic)
    # Kafka's lastCaughtUpTime: the last pull that started at (or past) the log end the primary
    # had when it answered the pull before; a replica that keeps pulling but never gets there
    # (a slow disk, a thin link) is lagging
    caught_up: float = field(default_factory=time.monotonic)
    answered_end: int = 0
    # when it was taken out of the SyncStateSet for stalling a send: it counts as caught up again
    # only with a pull that reaches the log end after that (alive again, not a pull from before)
    evicted: float = 0.0


class Primary:
    """The primary's side of replication for one store (wired into `StoreNode.dispatch`)."""

    def __init__(self, store: Store, *, min_insync: int = 1, stall_s: float = STALL_S) -> None:
        self.store = store
        self.replicas: dict[str, ReplicaInfo] = {}
        self.required: set[str] = set()  # replicas whose acknowledgement a send waits for
        self.min_insync = min_insync  # nodes, this one included, an acknowledged send needs
        self.stall_s = stall_s
        self.stalled = asyncio.Event()  # a wait outlasted `stall_s`: the member re-evaluates the set
        self._appended = asyncio.Event()
        self._acked = asyncio.Event()
        # writes waiting for replicas, oldest first: id -> (since, the required replicas missing)
        self._waits: dict[int, tuple[float, Callable[[], set[str]]]] = {}
        self._wait_ids = 0

    def appended(self) -> None:
        """Wake the pulls waiting at the log end (called after each append the node serves)."""
        self._appended.set()

    def required_changed(self) -> None:
        """Wake the waiting sends: `required` changed (a shrink may satisfy them)."""
        self._acked.set()

    def in_sync(self, max_lag: int | None, max_age_s: float) -> list[str]:
        """Replicas within `max_lag` bytes of the log end (None: any) that pulled in the last
        `max_age_s`."""
        end, now = self.store.log_end, time.monotonic()
        return [
            n
            for n, r in self.replicas.items()
            if (max_lag is None or end - r.acked <= max_lag) and now - r.seen <= max_age_s
        ]

    def lagging(self, max_age_s: float) -> set[str]:
        """Replicas that have not caught up with the log end in the last `max_age_s`, although
        they may still pull (Kafka's replica.lag.time.max.ms), or not since they were evicted."""
        now = time.monotonic()
        return {
            n for n, r in self.replicas.items() if now - r.caught_up > max_age_s or r.caught_up <= r.evicted
        }

    def evict(self, names: set[str]) -> None:
        """Mark `names` as taken out of the SyncStateSet for stalling writes."""
        now = time.monotonic()
        for name in names:
            info = self.replicas.get(name)
            if info is not None:
                info.evicted = now

    def stalled_replicas(self) -> set[str]:
        """The required replicas a write has waited for `stall_s` or longer."""
        now, out = time.monotonic(), set()
        for since, missing in self._waits.values():
            if now - since < self.stall_s:
                break  # (oldest first: the others are younger)
            out |= missing()
        return out & self.required

    @contextlib.contextmanager
    def waiting(self, missing: Callable[[], set[str]]) -> Iterator[None]:
        """Around a write's wait for replicas (`missing`: those it still waits for): after
        `stall_s`, `stalled` is set so the member takes stalled replicas out of the set."""
        self._wait_ids += 1
        key = self._wait_ids
        self._waits[key] = (time.monotonic(), missing)
        timer = asyncio.get_running_loop().call_later(self.stall_s, self.stalled.set)
        try:
            yield
        finally:
            timer.cancel()
            del self._waits[key]

    def _missing(self, end: int) -> set[str]:
        replicas = self.replicas
        return {name for name in self.required if name not in replicas or replicas[name].acked < end}

    def _done(self, end: int) -> bool:
        return len(self.required) + 1 >= self.min_insync and not self._missing(end)

    async def wait_replicated(self, end: int, timeout: float) -> bool:
        """True once every replica in `required` acknowledged `end` (the end of a send's records)
        and `required` makes `min_insync` nodes with this one; False at `timeout`."""
        if self._done(end):
            return True
        deadline = time.monotonic() + timeout
        with self.waiting(lambda: self._missing(end)):
            while not self._done(end):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._acked.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._acked.wait(), left)
        return True

    async def handle(self, cmd: RemotingCommand) -> RemotingCommand:
        store = self.store
        if cmd.code == REPL_STATE:
            start = store.log_start
            state = {
                "epochs": store.epochs.entries,
                "end": store.log_end,
                "start": start,
                "queues": store.queue_bases(start),
            }
            return cmd.response(ResponseCode.SUCCESS, None, None, json.dumps(state).encode())
        f = cmd.ext_fields
        try:
            start, max_bytes = int(f["start"]), int(f.get("max", DEFAULT_CHUNK))
            wait_s, name = int(f.get("wait_ms", 0)) / 1000, f["replica"]
        except (KeyError, ValueError):
            return cmd.response(ResponseCode.SYSTEM_ERROR, "malformed replication pull")
        info = self.replicas.setdefault(name, ReplicaInfo())
        info.acked, info.seen = max(info.acked, start), time.monotonic()
        if start >= info.answered_end:
            info.caught_up = info.seen
        self._acked.set()
        deadline = time.monotonic() + wait_s
        while start >= store.log_end and time.monotonic() < deadline:
            self._appended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._appended.wait(), min(POLL_FALLBACK_S, deadline - time.monotonic())
                )
        if start > store.log_end:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"start {start} is beyond the log end {store.log_end}"
            )
        try:
            data = await _read_chunk(store, start, max_bytes) if start < store.log_end else b""
        except KeyError:  # retention deleted it (the replica re-aligns and finds out it is behind)
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"start {start} is no longer stored: the log starts at {store.log_start}",
            )
        info.answered_end = store.log_end
        return cmd.response(
            ResponseCode.SUCCESS, None, {"end": store.log_end, "start": store.log_start}, data
        )


async def _read_chunk(store: Store, start: int, max_bytes: int) -> bytes:
    """`store.read_log_chunk`, fetching a tiered range from object storage when it is not cached
    (a replica far behind catches up through the primary's tier cache: store/tier_reads.py)."""
    return await read_through(store.read_log_chunk, store.fetch_tiered, start, max_bytes)


class Follower(FollowerLoop):
    """A replica's side: pulls the primary's log into `store` until stopped (`connected`: aligned
    with the primary and pulling)."""

    stream = "replication"
    task = "follow"
    log = log
    errors = (*FollowerLoop.errors, StoreError)

    def __init__(
        self,
        store: Store,
        name: str,
        primary: str,
        *,
        chunk: int = DEFAULT_CHUNK,
        wait_ms: int = 1000,
        retry_s: float = 0.5,
        auth: ClusterAuth | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(store, name, primary, wait_ms=wait_ms, retry_s=retry_s, auth=auth, tls=tls)
        self.chunk = chunk
        self.truncated: list[int] = []  # offsets truncated to on (re)joins (for tests and logs)
        self.rebased: list[int] = []  # offsets its empty log was re-based at (for tests and logs)
        self.behind: int | None = None  # the primary's log start when this replica cannot catch up

    @property
    def connected(self) -> asyncio.Event:
        """Set while aligned with the primary and pulling."""
        return self.ready

    async def _session(self, client: RemotingClient) -> None:
        await self._align(client)
        self.ready.set()
        await self._pull(client)

    def _failed(self, e: Exception) -> None:
        if not isinstance(e, ReplicaBehind):
            super()._failed(e)
            return
        log.error(
            "replica %s cannot catch up from %s: %s; stop it, wipe its data directory and start"
            " it again (docs/cluster.md, 'Lost disk')",
            self.name,
            self.primary,
            e,
        )

    def _retry_delay(self) -> float:
        return BEHIND_RETRY_S if self.behind is not None else self.retry_s

    async def _align(self, client: RemotingClient) -> None:
        """Truncate what the primary does not have; take its epochs."""
        r = await client.invoke(REPL_STATE, timeout=10.0)
        if r.code != ResponseCode.SUCCESS:
            raise ValueError(f"state refused: {r.remark}")
        state = json.loads(r.body)
        theirs = [tuple(e) for e in state["epochs"]]
        store, their_start = self.store, int(state.get("start", 0))
        empty = store.log_end == store.log_start
        if empty and their_start > 0 and store.log_end <= their_start:
            # a new (or wiped) replica: its log starts where the primary's does (the primary
            # retains nothing below), each queue at the offset the primary's log starts it at
            if store.log_end != their_start:
                log.warning(
                    "replica %s: its empty log starts at %d, as the primary's", self.name, their_start
                )
            await store.reset_empty_log(their_start, {k: int(v) for k, v in state.get("queues", {}).items()})
            self.rebased.append(their_start)
        elif store.log_end < their_start:
            self.behind = their_start
            raise ReplicaBehind(f"its log ends at {store.log_end}, the primary's starts at {their_start}")
        self.behind = None
        epochs = store.epochs
        agree = divergence(epochs.entries, theirs, store.log_end, int(state["end"]))
        if agree < store.log_end and store.log_end > store.log_start:
            if agree < store.log_start:
                self.behind = their_start
                raise ReplicaBehind(
                    f"it shares no record with the primary above its log start {store.log_start}"
                )
            log.warning("replica %s: truncating its log from %d to %d", self.name, store.log_end, agree)
            await store.truncate_log(agree)
            self.truncated.append(agree)
        epochs.truncate_from(0)
        for epoch, start in theirs:
            epochs.start(epoch, start)

    async def _pull(self, client: RemotingClient) -> None:
        store = self.store
        while True:
            start = store.log_end
            r = await client.invoke(
                REPL_PULL,
                {"start": start, "max": self.chunk, "wait_ms": self.wait_ms, "replica": self.name},
                timeout=self.wait_ms / 1000 + 10.0,
            )
            if r.code != ResponseCode.SUCCESS:
                raise ValueError(f"pull refused: {r.remark}")
            if r.body:
                await store.apply_log_chunk(start, r.body)
            their_start = int(r.ext_fields.get("start", 0))
            if their_start > store.log_start:  # the primary's retention deleted segments: so do we
                await store.delete_log_before(their_start)


__all__ = ["CODES", "REPL_PULL", "REPL_STATE", "Follower", "Primary", "ReplicaBehind", "ReplicaInfo"]
