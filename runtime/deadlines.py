"""One timer for many idle connections: a wheel of deadlines (keep-alive, heartbeats).

A connection that waits for its peer does not hold an event-loop timer of its own: it puts itself in
the slot of its deadline (`schedule`, `resolution` seconds wide; the slot's time is never before the
deadline) and takes itself out when it closes (`cancel`). One loop timer, armed for the earliest
non-empty slot, calls `deadline()` on every item of each slot that is due; an item that is not
really late (it heard from its peer meanwhile) schedules itself again. So an item is checked at most
`resolution` (plus loop latency) after its deadline and never before it, and idle connections cost a
dict entry each, not a TimerHandle and a libuv timer each.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import weakref
from typing import Protocol

RESOLUTION_S = 0.25


class Due(Protocol):
    def deadline(self) -> None:
        """The item's deadline has passed (check, then close or `schedule` again)."""


class DeadlineWheel:
    __slots__ = ("loop", "resolution", "_slots", "_keys", "_timer", "_armed")

    def __init__(self, loop: asyncio.AbstractEventLoop, resolution: float = RESOLUTION_S) -> None:
        self.loop = loop
        self.resolution = resolution
        self._slots: dict[int, dict[Due, None]] = {}  # slot -> its items (an ordered set)
        self._keys: list[int] = []  # heap of the slots (lazily deleted)
        self._timer: asyncio.TimerHandle | None = None
        self._armed = 0  # the slot the timer is armed for

    def __len__(self) -> int:
        return sum(len(s) for s in self._slots.values())

    def schedule(self, item: Due, when: float) -> int:
        """Call `item.deadline()` once the loop time `when` has passed; returns the slot, which the
        caller keeps to `cancel`. An item is in one slot at a time only if its owner cancels first."""
        k = math.ceil(when / self.resolution)
        slot = self._slots.get(k)
        if slot is None:
            slot = self._slots[k] = {}
            heapq.heappush(self._keys, k)
        slot[item] = None
        if self._timer is None or k < self._armed:
            self._arm(k)
        return k

    def cancel(self, item: Due, slot: int) -> None:
        """Take `item` out of `slot` (no error if it is not there)."""
        s = self._slots.get(slot)
        if s is not None and s.pop(item, 0) is None and not s:
            del self._slots[slot]  # its heap key goes when it comes up

    def _arm(self, k: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = k
        self._timer = self.loop.call_at(k * self.resolution, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self.loop.time()
        keys, slots = self._keys, self._slots
        while keys and keys[0] * self.resolution <= now:
            items = slots.pop(heapq.heappop(keys), None)
            for item in items or ():
                item.deadline()  # may schedule into a later slot (never this one: it is past)
        while keys and keys[0] not in slots:  # slots emptied by `cancel`
            heapq.heappop(keys)
        if keys:
            self._arm(keys[0])


_wheels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DeadlineWheel] = weakref.WeakKeyDictionary()


def wheel_of(loop: asyncio.AbstractEventLoop) -> DeadlineWheel:
    """`loop`'s wheel (one per event loop, shared by every protocol)."""
    w = _wheels.get(loop)
    if w is None:
        w = _wheels[loop] = DeadlineWheel(loop)
    return w
