"""Which process owns a shared thing, and whether that process still runs: owner names, liveness
and leases, for state that several processes over one store share (the workers of `gateway start
--workers N`, the proxies of a cluster) and that must have one owner or die with it.

- An owner is named `<host>/<pid>/<start time>` (`this_process`; the start time from /proc, so a
  reused pid is not taken for the old process).
- On this host, `alive` asks /proc: at once and exactly.
- On another host (`foreign`), the owner's lease tells (`OwnerLeases`): every process rewrites its
  lease record in the key-value table every `BEAT_INTERVAL_S` (2 s) with a random value. A process
  whose record did not change (or is missing) over three beats is gone. Values are compared, not
  clocks, so hosts need not agree on the time. The check takes that long, so a caller runs it in
  the background and treats the owner meanwhile as running.
- A name that is not a well-formed owner counts as dead.
- `Claims`: a name one process at a time may hold, taken over by the process that claims it after
  the holder let it go (the supervisor's claims under `--workers`: gateway/workers/claims.py).

Used by the AMQP adapter (the transient declarations and exclusive queues a gone process left:
adapters/amqp/records.py, declaration_sync.py) and the MQTT adapter (client ids unique across the
workers: adapters/mqtt/registry.py). Each names its own key-value namespace for its leases."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
from typing import Protocol

log = logging.getLogger("messaging_processor.ownership")

BEAT_INTERVAL_S = 2.0


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()  # after the command name, which may hold spaces
    return fields[19].decode() if len(fields) > 19 else None


@functools.cache
def this_process() -> str:
    """The owner name of this process (fixed for its life)."""
    pid = os.getpid()
    return f"{socket.gethostname()}/{pid}/{_start_time(pid) or ''}"


def alive(owner: object) -> bool:
    """Whether the process named `owner` runs (on this host) now, and is another process: what
    this process recorded before the part that asks started belongs to an earlier incarnation of
    it (tests restart a proxy in the same process)."""
    parts = _parts(owner)
    if parts is None or owner == this_process() or parts[0] != socket.gethostname():
        return False
    return _start_time(parts[1]) == parts[2]


def foreign(owner: object) -> bool:
    """Whether `owner` names a process on another host: only its lease tells whether it runs."""
    parts = _parts(owner)
    return parts is not None and parts[0] != socket.gethostname()


def _parts(owner: object) -> tuple[str, int, str] | None:
    """(host, pid, start time) of a well-formed owner name, else None."""
    if not isinstance(owner, str):
        return None
    host, _, rest = owner.partition("/")
    pid, _, started = rest.partition("/")
    if not host or not pid.isdigit() or not started:
        return None
    return host, int(pid), started


class LeaseTable(Protocol):
    """The part of the processor's key-value table the leases use."""

    async def kv_get(self, ns: str, key: str) -> bytes | None: ...
    async def kv_put(self, ns: str, key: str, value: bytes) -> None: ...
    async def kv_delete(self, ns: str, key: str) -> bool: ...


class OwnerLeases:
    """This process's lease in namespace `ns` of the key-value table (`start`: written, then
    rewritten every `interval_s`; `close`: deleted) and the check of other hosts' processes
    (`gone`)."""

    def __init__(self, kv: LeaseTable, me: str, ns: str, interval_s: float = BEAT_INTERVAL_S) -> None:
        self.kv = kv
        self.me = me
        self.ns = ns  # key: an owner name; value: random bytes, rewritten every beat
        self.interval_s = interval_s
        self.ttl_s = 3 * interval_s  # no change over this long: the process is gone
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self._beat()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            with contextlib.suppress(Exception):  # the store may be gone already
                await self.kv.kv_delete(self.ns, self.me)

    async def _beat(self) -> None:
        await self.kv.kv_put(self.ns, self.me, secrets.token_bytes(8))

    async def _run(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self._beat()
            except Exception as e:  # noqa: BLE001 - beat again next time (logged once per outage)
                if not failing:
                    log.warning("renewing this process's lease (%s) failed (retrying): %s", self.ns, e)
                failing = True
            else:
                if failing:
                    log.info("this process's lease (%s) is renewed again", self.ns)
                failing = False

    async def gone(self, owners: set[str]) -> set[str]:
        """Of `owners`, those whose lease did not change (or is missing) over `ttl_s`."""
        before = {o: await self.kv.kv_get(self.ns, o) for o in owners}
        await asyncio.sleep(self.ttl_s)
        out: set[str] = set()
        for o in owners:
            now = await self.kv.kv_get(self.ns, o)
            if now is None or now == before[o]:
                out.add(o)
        return out


class Claims(Protocol):
    """Names one process at a time holds, across the processes serving one listener: `claim`
    returns once no other process holds `name` (its holder was asked to let it go first);
    `release` says this process holds it no more."""

    async def claim(self, name: str) -> None: ...

    def release(self, name: str) -> None: ...
