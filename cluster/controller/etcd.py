"""`EtcdController`: the controller of replica groups kept in etcd (docs/cluster.md, "Controller").

Each group has two keys under `<prefix>/<cluster>/controller/groups/<group>/`:

- `state`: JSON {group, primary, primary_address, epoch, sync_state_set}, persistent: the epoch and
  SyncStateSet outlive the primary;
- `leader`: JSON {primary, address, epoch}, attached to the primary's lease: the live claim, gone
  within the lease TTL once the primary stops renewing it.

Every change is one etcd transaction guarded by compares (compare-and-swap), so concurrent
candidates and stale primaries are refused by etcd itself: an election needs no `leader` key and an
unchanged `state` key; a SyncStateSet update needs the very `leader` key its primary created.

Over etcd's JSON API with a hand-written client (`etcd_api.py`, which says why: no well-kept asyncio
etcd v3 client fits the project's protobuf 7 lock, and only five calls are used).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from cluster.controller.base import (
    ControllerError,
    GroupState,
    NotEligible,
    NotPrimary,
    PrimaryExists,
)
from cluster.controller.etcd_api import EtcdApi, b64, unb64

_ELECTION_ATTEMPTS = 5


def _unique(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


def _put(key: str, value: dict[str, Any], lease_id: int = 0) -> dict[str, Any]:
    request: dict[str, Any] = {"key": b64(key), "value": b64(json.dumps(value, separators=(",", ":")))}
    if lease_id:
        request["lease"] = str(lease_id)
    return {"request_put": request}


def _created_at(key: str, revision: int) -> dict[str, Any]:
    """Compare: `key` was created at `revision` (0: it does not exist)."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}


def _modified_at(key: str, revision: int) -> dict[str, Any]:
    """Compare: `key` was last written at `revision`."""
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


class EtcdController:
    """The `Controller` over etcd v3 (one or more endpoints of one etcd cluster)."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        prefix: str = "/gateway",
        cluster: str = "DefaultCluster",
        lease_ttl_s: int = 10,
        *,
        timeout_s: float = 3.0,
        connect_timeout_s: float = 1.0,
    ) -> None:
        self.lease_ttl_s = lease_ttl_s
        self._root = f"{prefix.rstrip('/')}/{cluster}/controller/groups/"
        self._api = EtcdApi(endpoints, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)

    def _group_prefix(self, group: str) -> str:
        if not group or "/" in group:
            raise ValueError(f"bad group name {group!r}")
        return f"{self._root}{group}/"

    async def state(self, group: str) -> GroupState | None:
        base = self._group_prefix(group)
        _, kvs = await self._api.range_prefix(base)
        by_key = {unb64(kv["key"]).decode(): kv for kv in kvs}
        stored = by_key.get(base + "state")
        if stored is None:
            return None
        record = json.loads(unb64(stored.get("value", "")))
        leader = by_key.get(base + "leader")
        live = (
            leader is not None and json.loads(unb64(leader.get("value", ""))).get("epoch") == record["epoch"]
        )
        return GroupState(
            group=group,
            primary=record["primary"] if live else None,
            primary_address=record["primary_address"] if live else None,
            epoch=int(record["epoch"]),
            sync_state_set=tuple(record["sync_state_set"]),
            revision=int(stored["mod_revision"]),
            leader_revision=int(leader["create_revision"]) if live and leader else 0,
            lease_id=int(leader.get("lease", 0)) if live and leader else 0,
        )

    async def elect(
        self, group: str, candidate: str, address: str, sync_state_set_if_new: tuple[str, ...] = ()
    ) -> GroupState:
        base = self._group_prefix(group)
        for _ in range(_ELECTION_ATTEMPTS):
            current = await self.state(group)
            if current is None:
                epoch, members = 1, _unique((candidate, *sync_state_set_if_new))
                unchanged = _created_at(base + "state", 0)
            elif current.primary is not None:
                raise PrimaryExists(f"{group}: {current.primary} is primary at epoch {current.epoch}")
            elif candidate not in current.sync_state_set:
                raise NotEligible(f"{group}: {candidate} is not in {list(current.sync_state_set)}")
            else:
                epoch, members = current.epoch + 1, (candidate,)
                unchanged = _modified_at(base + "state", current.revision)
            lease_id, _ = await self._api.grant(self.lease_ttl_s)
            record = {
                "group": group,
                "primary": candidate,
                "primary_address": address,
                "epoch": epoch,
                "sync_state_set": list(members),
            }
            claim = {"primary": candidate, "address": address, "epoch": epoch}
            won, revision = await self._api.txn(
                [unchanged, _created_at(base + "leader", 0)],
                [_put(base + "state", record), _put(base + "leader", claim, lease_id)],
            )
            if won:  # both keys were written at the transaction's revision
                return GroupState(group, candidate, address, epoch, members, revision, revision, lease_id)
            await self._api.revoke(lease_id)  # lost a race: look again, the answer may now differ
        raise ControllerError(f"{group}: election kept losing races")

    async def keep_primary(self, group: str, state: GroupState) -> float:
        if not state.lease_id:
            raise NotPrimary(f"{group}: the state holds no claim")
        ttl = await self._api.keepalive(state.lease_id)
        if ttl <= 0:
            raise NotPrimary(f"{group}: {state.primary}'s claim at epoch {state.epoch} has expired")
        return float(ttl)

    async def set_sync_state_set(self, group: str, state: GroupState, members: tuple[str, ...]) -> GroupState:
        base = self._group_prefix(group)
        members = _unique(members)
        if state.primary is None or not state.leader_revision:
            raise NotPrimary(f"{group}: the state holds no claim")
        if state.primary not in members:
            raise ValueError(f"{group}: the SyncStateSet must contain the primary {state.primary}")
        record = {
            "group": group,
            "primary": state.primary,
            "primary_address": state.primary_address,
            "epoch": state.epoch,
            "sync_state_set": list(members),
        }
        # Only the holder of this very claim writes `state` while the claim lives: comparing the
        # claim's creation revision is comparing primary and epoch.
        done, revision = await self._api.txn(
            [_created_at(base + "leader", state.leader_revision)], [_put(base + "state", record)]
        )
        if not done:
            raise NotPrimary(f"{group}: {state.primary} at epoch {state.epoch} is no longer the primary")
        return dataclasses.replace(state, sync_state_set=members, revision=revision)

    async def resign(self, group: str, state: GroupState) -> None:
        self._group_prefix(group)
        if state.lease_id:
            await self._api.revoke(state.lease_id)  # deletes the leader key attached to it

    async def close(self) -> None:
        await self._api.aclose()
