"""The replica-group controller over a real etcd: elections, epochs, SyncStateSets, leases, outages."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster.controller import (
    ControllerUnavailable,
    EtcdController,
    GroupState,
    NotEligible,
    NotPrimary,
    PrimaryExists,
)
from tests.cluster.etcd_support import EtcdProcess, etcd_missing, free_port

pytestmark = pytest.mark.skipif(etcd_missing(), reason="etcd is not installed (deps/debian-packages.txt)")

TTL = 2  # etcd's minimum lease TTL with its default heartbeat


@pytest.fixture
async def controller(etcd: EtcdProcess) -> AsyncIterator[EtcdController]:
    c = EtcdController(etcd.endpoint, prefix="/test", lease_ttl_s=TTL)
    yield c
    await c.close()


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


async def _until_no_primary(controller: EtcdController, group: str, timeout: float) -> GroupState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = await controller.state(group)
        assert state is not None
        if state.primary is None:
            return state
        await asyncio.sleep(0.1)
    raise AssertionError(f"{group} still had a primary after {timeout} s")


async def test_first_election_of_a_new_group(controller: EtcdController, group: str) -> None:
    assert await controller.state(group) is None
    won = await controller.elect(group, "a", "10.0.0.1:10911", ("b", "a"))
    assert (won.primary, won.primary_address, won.epoch) == ("a", "10.0.0.1:10911", 1)
    assert won.sync_state_set == ("a", "b")
    assert await controller.state(group) == won


async def test_claim_kept_alive_blocks_others_and_expires_when_not(
    controller: EtcdController, group: str
) -> None:
    a = await controller.elect(group, "a", "addr-a")
    a = await controller.set_sync_state_set(group, a, ("a", "b"))
    deadline = time.monotonic() + TTL * 1.5  # outlive one TTL by renewing
    while time.monotonic() < deadline:
        assert await controller.keep_primary(group, a) > 0
        await asyncio.sleep(TTL / 4)
    with pytest.raises(PrimaryExists):
        await controller.elect(group, "b", "addr-b")
    started = time.monotonic()
    gone = await _until_no_primary(controller, group, timeout=TTL + 3)  # a stops renewing
    assert time.monotonic() - started < TTL + 2
    assert (gone.epoch, gone.sync_state_set) == (1, ("a", "b"))  # the persistent record stays
    with pytest.raises(NotPrimary):
        await controller.keep_primary(group, a)
    with pytest.raises(NotEligible):
        await controller.elect(group, "c", "addr-c")
    b = await controller.elect(group, "b", "addr-b")
    assert (b.primary, b.epoch, b.sync_state_set) == ("b", 2, ("b",))


async def test_resign_lets_a_sync_member_take_over(controller: EtcdController, group: str) -> None:
    a = await controller.elect(group, "a", "addr-a", ("a", "b"))
    await controller.resign(group, a)
    after = await controller.state(group)
    assert after is not None and after.primary is None and after.epoch == 1
    with pytest.raises(NotPrimary):  # a resigned primary cannot write either
        await controller.set_sync_state_set(group, a, ("a", "b"))
    b = await controller.elect(group, "b", "addr-b")
    assert (b.primary, b.primary_address, b.epoch) == ("b", "addr-b", 2)
    assert await controller.state(group) == b


async def test_sync_state_set_written_by_current_primary_only(controller: EtcdController, group: str) -> None:
    a = await controller.elect(group, "a", "addr-a", ("a", "b", "c"))
    a = await controller.set_sync_state_set(group, a, ("a", "c"))
    assert (await controller.state(group)) == a and a.sync_state_set == ("a", "c")
    with pytest.raises(ValueError):
        await controller.set_sync_state_set(group, a, ("c",))  # must contain the primary
    await controller.resign(group, a)
    c = await controller.elect(group, "c", "addr-c")
    assert c.epoch == 2
    with pytest.raises(NotPrimary):  # the stale primary of epoch 1
        await controller.set_sync_state_set(group, a, ("a", "b"))
    c = await controller.set_sync_state_set(group, c, ("c", "a"))
    state = await controller.state(group)
    assert state is not None and (state.primary, state.epoch, state.sync_state_set) == ("c", 2, ("c", "a"))


async def test_concurrent_elections_have_one_winner(controller: EtcdController, group: str) -> None:
    names = [f"n{i}" for i in range(5)]
    results = await asyncio.gather(
        *(controller.elect(group, n, f"addr-{n}", tuple(names)) for n in names), return_exceptions=True
    )
    winners = [r for r in results if isinstance(r, GroupState)]
    assert len(winners) == 1, results
    assert all(isinstance(r, PrimaryExists) for r in results if r is not winners[0]), results
    assert (await controller.state(group)) == winners[0]
    await controller.resign(group, winners[0])
    eligible = [n for n in names if n in winners[0].sync_state_set]
    results = await asyncio.gather(
        *(controller.elect(group, n, "x") for n in eligible), return_exceptions=True
    )
    winners = [r for r in results if isinstance(r, GroupState)]
    assert len(winners) == 1 and winners[0].epoch == 2, results


async def test_next_endpoint_is_tried_when_one_is_down(etcd: EtcdProcess, group: str) -> None:
    c = EtcdController([f"127.0.0.1:{free_port()}", etcd.endpoint], prefix="/test", lease_ttl_s=TTL)
    try:
        won = await c.elect(group, "a", "addr-a")
        assert await c.state(group) == won
    finally:
        await c.close()


async def test_etcd_outage_raises_unavailable_and_state_survives(tmp_path: Path, group: str) -> None:
    etcd = EtcdProcess(tmp_path)
    etcd.start()
    c = EtcdController(etcd.endpoint, prefix="/test", lease_ttl_s=TTL, timeout_s=1.0)
    try:
        a = await c.elect(group, "a", "addr-a", ("a", "b"))
        etcd.stop()
        calls = [
            c.state(group),
            c.elect(group, "b", "addr-b"),
            c.keep_primary(group, a),
            c.set_sync_state_set(group, a, ("a",)),
        ]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(ControllerUnavailable):
                await call
            assert time.monotonic() - started < 2
        etcd.start()
        state = await c.state(group)
        assert state is not None and (state.epoch, state.sync_state_set) == (1, ("a", "b"))
    finally:
        await c.close()
        etcd.stop()


async def test_group_names_with_a_slash_are_refused(controller: EtcdController) -> None:
    with pytest.raises(ValueError):
        await controller.state("a/b")
