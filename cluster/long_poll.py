"""A long poll over every live store node at once (pops.py, tails.py): each node gets the same
request; the first non-empty answer wins and the other polls are cancelled (CANCEL). The polls are
re-issued every LONG_POLL_SLICE_S, so that a node that (re)joined is polled too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .membership import Membership
from .nodes import NodeClient

LONG_POLL_SLICE_S = 5.0

T = TypeVar("T")
# poll(node, wait_ms, opaques): one node's request; it records its frame's opaque in `opaques`
Poll = Callable[[NodeClient, int, dict[str, int]], Awaitable[list[T]]]


async def first_answer(
    members: Membership,
    poll: Poll[T],
    wait_ms: int,
    on_extra: Callable[[list[T]], None],
    on_abandoned: Callable[[asyncio.Future], None],
) -> list[T]:
    """The first non-empty answer of `poll` on the live nodes within `wait_ms` ([] if none).
    `on_extra(answer)`: another node's non-empty answer that came in the same turn as the winner;
    `on_abandoned(task)`: a poll cancelled on its node that is still running here."""
    deadline = time.monotonic() + wait_ms / 1000
    while (left := deadline - time.monotonic()) > 0:
        slice_ms = int(min(left, LONG_POLL_SLICE_S) * 1000)
        opaques: dict[str, int] = {}
        tasks = {asyncio.ensure_future(poll(n, slice_ms, opaques)): n for n in members.need_live()}
        pending = set(tasks)
        failed: list[BaseException] = []
        winner: list[T] = []
        try:
            while pending and not winner:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t.exception() is not None:
                        failed.append(t.exception())  # type: ignore[arg-type]
                    elif t.result():
                        if winner:
                            on_extra(t.result())
                        else:
                            winner = t.result()
            if not winner and len(failed) == len(tasks):
                raise failed[0]  # every node refused: do not spin until the deadline
        finally:
            for t in pending:
                node = tasks[t]
                if node.name in opaques:
                    node.cancel(opaques[node.name])
                on_abandoned(t)
        if winner:
            return winner
    return []
