"""`PopHandles`: the latest receipt handle of each message popped through this proxy, by (group,
topic, queue, offset), for clients that rebuild extraInfo without it (handlers/pop.py)."""

from __future__ import annotations

import time

HandleKey = tuple[str, str, int, int]  # group, topic, queue id, queue offset
_KEEP_S = 60.0  # how long a handle is remembered past its invisible time


class PopHandles:
    """(group, topic, queue, offset) -> latest receipt handle of messages popped here."""

    def __init__(self) -> None:
        self._map: dict[HandleKey, tuple[str, float]] = {}
        self._next_sweep = 0.0

    def put(self, key: HandleKey, handle: str, invisible_ms: int) -> None:
        now = time.monotonic()
        self._map[key] = (handle, now + invisible_ms / 1000 + _KEEP_S)
        if now > self._next_sweep:
            self._next_sweep = now + 10.0
            for k in [k for k, (_h, exp) in self._map.items() if exp < now]:
                del self._map[k]

    def get(self, key: HandleKey) -> str | None:
        hit = self._map.get(key)
        return hit[0] if hit else None

    def pop(self, key: HandleKey) -> None:
        self._map.pop(key, None)

    def __len__(self) -> int:
        return len(self._map)
