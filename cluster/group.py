"""One store node as a member of a replica group: primary or replica, as the controller decides
(docs/cluster.md, "Replica groups").

Every `poll_s` the member reads the group's state from the controller:
- **Primary.** It renews its claim and records its SyncStateSet, which is itself plus the replicas
  that pulled recently and are close to its log end. A write that has waited `stall_s` for a
  replica wakes it at once: the replicas that write waits for leave the set (as long as it keeps
  `min_insync` nodes), so the writes in flight are acknowledged by the others within their wait.
  If the claim is gone (`NotPrimary`), it stops taking writes and becomes a replica again.
- **Replica.** It follows the primary the state names. When the group has no live primary, it
  stands for election. The controller lets only a member of the stored SyncStateSet win. The
  winner starts a new epoch at its log end and takes writes.

Only the primary serves writes. Every member registers with the name server under the group's
name: the primary as its master (broker id 0), so proxies follow a failover through their route
refresh; replicas with their own broker id, so proxies read from them while the group has no
primary. Replicas answer reads only.

While the controller cannot be reached, every member keeps its role, as in RocketMQ: the
controller is needed only to change the primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from runtime.tasks import cancel_and_wait

from .controller import Controller, ControllerError, ControllerUnavailable, GroupState, NotPrimary
from .replication import STALL_S, Follower, Primary
from .state_replication import StateFeed, StateFollower
from .store_node import StoreNode

log = logging.getLogger("cluster.group")
IN_SYNC_LAG = 1024 * 1024  # bytes behind the log end a replica may be and still join the SyncStateSet


class GroupMember:
    """Runs `node`'s role in replica group `group`; `await start()`, `role`, `await stop()`."""

    def __init__(
        self,
        node: StoreNode,
        controller: Controller,
        group: str,
        *,
        poll_s: float = 1.0,
        in_sync_age_s: float = 3.0,
        wait_ms: int = 1000,
        stall_s: float = STALL_S,
    ) -> None:
        self.node = node
        self.controller = controller
        self.group = group
        self.poll_s = poll_s
        self.in_sync_age_s = in_sync_age_s
        self.wait_ms = wait_ms
        self.stall_s = stall_s  # a write waiting this long for a replica takes it out of the set
        self.role = "replica"
        self.state: GroupState | None = None  # the last state read or written
        self.follower: Follower | None = None
        self.state_follower: StateFollower | None = None
        self._task: asyncio.Task | None = None
        self._reregistration: asyncio.Task | None = None
        node.accepts_writes = False
        node.store.pause_own_writes()

    @property
    def name(self) -> str:
        return self.node.name

    async def start(self) -> None:
        """Take a role now if the controller answers (else the loop keeps trying), then run."""
        try:
            await self._step()
        except ControllerError as e:
            log.warning("group %s: %s has no role yet: %s", self.group, self.name, e)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"group {self.group}")

    async def stop(self, resign: bool = True) -> None:
        """Stop the role; a primary gives up its claim (`resign`) so a replica takes over at once."""
        await cancel_and_wait(self._task, errors=True)
        self._task = None
        await self._stop_following()
        if resign and self.role == "primary" and self.state is not None:
            with contextlib.suppress(ControllerError):
                await self.controller.resign(self.group, self.state)

    async def _pause(self) -> None:
        """`poll_s`, or less when a write stalls on a replica (a primary's `stalled`)."""
        primary = self.node.replication if self.role == "primary" else None
        if primary is None:
            await asyncio.sleep(self.poll_s)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(primary.stalled.wait(), self.poll_s)
        primary.stalled.clear()

    async def _run(self) -> None:
        while True:
            await self._pause()
            try:
                await self._step()
            except ControllerUnavailable as e:
                log.warning(
                    "group %s: controller unavailable, %s stays %s: %s", self.group, self.name, self.role, e
                )
            except ControllerError as e:
                log.warning("group %s: %s", self.group, e)

    async def _step(self) -> None:
        if self.role == "primary":
            await self._serve()
            return
        state = await self.controller.state(self.group)
        if state is None or state.primary is None:
            await self._stand()
        elif state.primary != self.name:
            self.state = state
            await self._follow(state.primary_address or "")

    # ------------------------------------------------------------------ primary
    async def _serve(self) -> None:
        assert self.state is not None
        try:
            await self.controller.keep_primary(self.group, self.state)
            await self._record_sync_state_set()
        except NotPrimary:
            log.warning("group %s: %s lost its claim: no longer primary", self.group, self.name)
            self._demote()

    async def _record_sync_state_set(self) -> None:
        """Bring the SyncStateSet to the replicas that pull and keep up, keeping the recorded set
        a subset of the replicas sends wait for: a replica is required before it is recorded, and
        stops being required only once its removal is recorded."""
        primary, state = self.node.replication, self.state
        assert primary is not None and state is not None
        recorded = set(state.sync_state_set) - {self.name}
        caught_up = set(primary.in_sync(IN_SYNC_LAG, self.in_sync_age_s))
        pulling = set(primary.in_sync(None, self.in_sync_age_s))
        feed = self.node.state_feed
        if feed is not None:  # the key-value data and consumer progress too
            caught_up &= feed.in_sync(self.in_sync_age_s)
            pulling &= feed.pulling(self.in_sync_age_s)
        # a replica joins once close to the log end, and leaves once it stops pulling or has not
        # caught up with the log end for `in_sync_age_s` (then sends stop waiting for it)
        lagging = primary.lagging(self.in_sync_age_s)
        remove = recorded - (pulling - lagging)
        # ... or at once when a write has waited `stall_s` for it, while the others make min-insync
        # (Kafka's ISR shrink: the writes in flight are then acknowledged by the remaining replicas)
        evict = self._stalling(recorded - remove)
        remove |= evict
        caught_up -= lagging | remove
        add = caught_up - recorded
        if not add and not remove:
            return
        primary.required |= add
        members = (self.name, *sorted((recorded | add) - remove))
        try:
            self.state = await self.controller.set_sync_state_set(self.group, state, members)
        except ControllerError:
            primary.required -= add - recorded
            raise
        primary.evict(evict)
        primary.required -= remove
        primary.required_changed()
        if self.node.state_feed is not None:
            self.node.state_feed.wake()
        if evict:
            names = ", ".join(sorted(evict))
            log.warning("group %s: %s out of the SyncStateSet: stalled writes", self.group, names)
        log.info("group %s: SyncStateSet %s", self.group, ", ".join(members))

    def _stalling(self, members: set[str]) -> set[str]:
        """The replicas of `members` a write has waited `stall_s` for, the furthest behind first,
        as many as can leave while the set keeps `min_insync` nodes."""
        primary = self.node.replication
        assert primary is not None
        stalled = primary.stalled_replicas() & members
        room = len(members) + 1 - self.node.config.min_insync
        if not stalled or room <= 0:
            return set()
        info = primary.replicas
        return set(sorted(stalled, key=lambda n: (info[n].acked if n in info else -1, n))[:room])

    async def _stand(self) -> None:
        """Stand for election (the controller refuses a node outside the SyncStateSet)."""
        try:
            won = await self.controller.elect(self.group, self.name, self.node.advertised)
        except ControllerError as e:
            if isinstance(e, ControllerUnavailable):
                raise
            log.debug("group %s: %s not elected: %s", self.group, self.name, e)
            return
        await self._promote(won)

    async def _promote(self, state: GroupState) -> None:
        await self._stop_following()
        store = self.node.store
        current = store.epochs.current
        if current is None or current[0] < state.epoch:
            store.epochs.start(state.epoch, store.log_end)
        self.state = state
        await store.state.take_over()
        self.node.replication = Primary(store, min_insync=self.node.config.min_insync, stall_s=self.stall_s)
        self.node.state_feed = StateFeed(store)
        store.resume_own_writes()
        self.node.accepts_writes = True
        self.role = "primary"
        log.warning("group %s: %s is primary at epoch %d", self.group, self.name, state.epoch)
        with contextlib.suppress(Exception):
            await self.node.register()

    def _demote(self) -> None:
        self.node.accepts_writes = False
        self.node.store.pause_own_writes()
        self.node.replication = None
        if self.node.state_feed is not None:
            self.node.state_feed.close()
            self.node.state_feed = None
        self.role = "replica"
        self.state = None
        # registered again at once, as a replica (broker id >= 1), not at the next lease renewal
        self._reregistration = asyncio.get_running_loop().create_task(self.node.register())
        self._reregistration.add_done_callback(lambda t: t.cancelled() or t.exception())

    # ------------------------------------------------------------------ replica
    async def _follow(self, address: str) -> None:
        if self.follower is not None and self.follower.primary == address:
            return
        await self._stop_following()
        if not address:
            return
        auth, tls = self.node.config.auth, self.node.config.cluster_tls
        self.follower = Follower(
            self.node.store, self.name, address, wait_ms=self.wait_ms, auth=auth, tls=tls
        )
        self.follower.start()
        self.state_follower = StateFollower(
            self.node.store, self.name, address, wait_ms=self.wait_ms, auth=auth, tls=tls
        )
        self.state_follower.start()

    async def _stop_following(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None
        if self.state_follower is not None:
            await self.state_follower.stop()
            self.state_follower = None


__all__ = ["GroupMember"]
