"""The controller of replica groups: who leads each group, at which epoch, with which SyncStateSet.

A replica group (RocketMQ 5 style) has one primary that takes writes and replicas that copy its log.
Each change of primary starts a new epoch; the primary tracks the SyncStateSet (the members caught
up with it), and only a member of the stored SyncStateSet may become the next primary. The
controller is the strongly consistent record of that; this module is its interface, free of any
backend (`etcd.py` implements it over etcd).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GroupState:
    """One replica group as the controller records it.

    `primary` / `primary_address` name the live primary, or are None when no primary holds a claim
    (its lease expired or it resigned); `epoch` and `sync_state_set` outlive the claim.
    `revision`, `leader_revision` and `lease_id` are the backend's compare-and-swap tokens: a state
    whose tokens no longer match the record is stale, and writes made with it are refused.
    """

    group: str
    primary: str | None
    primary_address: str | None
    epoch: int
    sync_state_set: tuple[str, ...]
    revision: int = 0  # version of the persistent record (etcd: the state key's mod_revision)
    leader_revision: int = 0  # version of the live claim, 0 if none (etcd: leader key's create_revision)
    lease_id: int = 0  # the claim's lease, 0 if none


class ControllerError(Exception):
    """Base of the controller's errors."""


class ControllerUnavailable(ControllerError):
    """The backend cannot be reached: callers keep serving with the state they have."""


class PrimaryExists(ControllerError):
    """An election was refused: the group has a live primary."""


class NotEligible(ControllerError):
    """An election was refused: the candidate is not in the group's SyncStateSet."""


class NotPrimary(ControllerError):
    """A primary's write or keep-alive was refused: its claim is gone or its state is stale."""


class Controller(Protocol):
    """The record of replica groups' primaries, epochs and SyncStateSets."""

    async def state(self, group: str) -> GroupState | None:
        """The group's current state; None if the group was never elected."""
        ...

    async def elect(
        self, group: str, candidate: str, address: str, sync_state_set_if_new: tuple[str, ...] = ()
    ) -> GroupState:
        """Make `candidate` the primary at the next epoch, with a live claim (a lease).

        Allowed when the group is new (its SyncStateSet becomes `sync_state_set_if_new` plus the
        candidate), or when it has no live primary and the candidate is in its SyncStateSet (which then
        becomes just the candidate: the others must catch up with the new primary to rejoin).
        Raises PrimaryExists or NotEligible otherwise.
        """
        ...

    async def keep_primary(self, group: str, state: GroupState) -> float:
        """Renew the primary's claim once; the seconds it now lasts. Raises NotPrimary if it is gone.

        A primary calls it well within the lease TTL (e.g. every TTL/3) for as long as it serves.
        """
        ...

    async def set_sync_state_set(self, group: str, state: GroupState, members: tuple[str, ...]) -> GroupState:
        """Record the primary's new SyncStateSet (which must contain the primary); the new state.

        Compare-and-swap: raises NotPrimary if `state` is stale (another epoch, or the claim is gone).
        """
        ...

    async def resign(self, group: str, state: GroupState) -> None:
        """Give up the primary's claim now (epoch and SyncStateSet stay) so another may be elected."""
        ...

    async def close(self) -> None:
        """Release the backend connection."""
        ...
