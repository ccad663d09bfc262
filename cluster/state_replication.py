"""Replication of a store's non-log state inside a replica group (docs/cluster.md, "Replica
groups"): consumer progress (pop, ack, invisible times, committed offsets), key-value data (users,
ACL rules, tokens, MQTT sessions and retained messages, AMQP declarations...) and topic and group
settings. The commit log itself travels by cluster/replication.py.

One request, `REPL_META` (replica -> primary, extFields `replica`, `session`, `cpos`, `kpos`,
`digest`, `wait_ms`), long-polled like the log pull:
- The first request of a replica (or one the primary cannot continue: another `session`, a
  position it no longer holds) gets everything: the consumer progress snapshot, every key-value
  row and the catalog (`full`), with the stream positions they match.
- Later ones get what followed their positions: progress operations (bytes, as the primary's own
  progress log holds them), key-value changes in commit order, and the catalog when its digest
  differs from the replica's.
`kpos` in a request acknowledges the key-value changes (and catalog changes) the replica applied.
Under the sync policy a key-value or catalog write on the primary is answered only once every
replica the sends wait for acknowledged it, so a user created, an ACL rule or an MQTT session
survives a failover as an acknowledged message does. Consumer progress is asynchronous, as in
RocketMQ: a failover redelivers at most the acknowledgements of the last moments (the primary's
progress flush period plus one pull, about 100-200 ms).

Response body: `u32 length` + JSON header (`kv`: [[ns, {key: base64 | null}], ...] or, when
`full`, `rows`: [[ns, key, base64], ...]; `catalog`; `snapshot` flag) + the progress bytes (when
`full`: the snapshot).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import struct
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from remoting import RemotingCommand, ResponseCode
from remoting.client import RemotingClient
from store import Store
from store.state_replica import catalog_digest

from .following import FollowerLoop

log = logging.getLogger("cluster.state_replication")

REPL_META = 9192
MAX_PROGRESS_BYTES = 16 * 1024 * 1024  # progress operations kept for replicas that fall behind
MAX_KV_CHANGES = 20_000
_LEN = struct.Struct("<I")


def _pack(header: dict, data: bytes) -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    return _LEN.pack(len(h)) + h + data


def _unpack(body: bytes) -> tuple[dict, bytes]:
    (n,) = _LEN.unpack_from(body, 0)
    return json.loads(body[4 : 4 + n]), body[4 + n :]


def _b64(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode()


def _unb64(v: str | None) -> bytes | None:
    return None if v is None else base64.b64decode(v)


def info_name(cmd: RemotingCommand) -> str:
    return cmd.ext_fields.get("replica", "?")


@dataclass
class ReplicaState:
    """What the primary knows of one replica's state replication."""

    kpos: int = 0  # key-value and catalog changes applied
    synced: bool = False  # took a full copy in this session
    seen: float = field(default_factory=time.monotonic)


class StateFeed:
    """The primary's side: keeps the recent changes and answers `REPL_META`. `close()` stops it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.session = uuid.uuid4().hex
        self.progress = bytearray()
        self.progress_base = 0  # stream position of progress[0]
        self.kv: deque[tuple[int, str | None, dict[str, bytes | None] | None]] = deque()
        self.kv_seq = 0  # sequence number of the last change (None namespace: a catalog change)
        self.replicas: dict[str, ReplicaState] = {}
        self._changed = asyncio.Event()
        self._acked = asyncio.Event()
        store.state.watch(self._on_progress, self._on_kv)

    def close(self) -> None:
        self.store.state.watch(None, None)

    # ----- changes ---------------------------------------------------------------------------
    def _on_progress(self, data: bytes) -> None:
        self.progress += data
        extra = len(self.progress) - MAX_PROGRESS_BYTES
        if extra > 0:
            del self.progress[:extra]
            self.progress_base += extra
        self._changed.set()

    def _on_kv(self, ns: str | None, items: dict[str, bytes | None] | None) -> None:
        self.kv_seq += 1
        self.kv.append((self.kv_seq, ns, items))
        if len(self.kv) > MAX_KV_CHANGES:
            self.kv.popleft()
        self._changed.set()

    def catalog_changed(self) -> None:
        """A topic or group setting changed (sent whole; the sequence number is what sync waits on)."""
        self._on_kv(None, None)

    # ----- acknowledgements ------------------------------------------------------------------
    def in_sync(self, max_age_s: float) -> set[str]:
        """Replicas that took a full copy and pulled in the last `max_age_s`."""
        now = time.monotonic()
        return {n for n, r in self.replicas.items() if r.synced and now - r.seen <= max_age_s}

    def pulling(self, max_age_s: float) -> set[str]:
        """Replicas that pulled in the last `max_age_s`."""
        now = time.monotonic()
        return {n for n, r in self.replicas.items() if now - r.seen <= max_age_s}

    def missing(self, seq: int, names: set[str]) -> set[str]:
        """The replicas of `names` that have not applied change `seq` yet."""
        replicas = self.replicas
        return {n for n in names if n not in replicas or replicas[n].kpos < seq}

    def wake(self) -> None:
        """Wake the waiting writes: the replicas they wait for changed (a shrink may satisfy them)."""
        self._acked.set()

    async def wait_replicated(self, seq: int, names: set[str], timeout: float, min_nodes: int = 0) -> bool:
        """True once every replica in `names` applied change `seq` and `names` makes `min_nodes`
        nodes with the primary; False at `timeout`."""
        deadline = time.monotonic() + timeout
        while len(names) + 1 < min_nodes or self.missing(seq, names):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._acked.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked.wait(), left)
        return True

    # ----- REPL_META -------------------------------------------------------------------------
    async def handle(self, cmd: RemotingCommand) -> RemotingCommand:
        f = cmd.ext_fields
        try:
            name, session = f["replica"], f.get("session", "")
            cpos, kpos, digest = int(f.get("cpos", 0)), int(f.get("kpos", 0)), f.get("digest", "")
            wait_s = int(f.get("wait_ms", 0)) / 1000
        except (KeyError, ValueError):
            return cmd.response(ResponseCode.SYSTEM_ERROR, "malformed state replication pull")
        info = self.replicas.setdefault(name, ReplicaState())
        info.seen = time.monotonic()
        if session != self.session or not self._can_continue(cpos, kpos):
            info.synced, info.kpos = False, 0
            return await self._full(cmd, info)
        if kpos > info.kpos:
            info.kpos = kpos
            self._acked.set()
        info.synced = True
        deadline = time.monotonic() + wait_s
        while not self._news(cpos, kpos, digest) and time.monotonic() < deadline:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), deadline - time.monotonic())
        return self._increment(cmd, cpos, kpos, digest)

    def _can_continue(self, cpos: int, kpos: int) -> bool:
        first_kept = self.kv[0][0] if self.kv else self.kv_seq + 1
        return (
            self.progress_base <= cpos <= self.store.state.progress_position
            and kpos <= self.kv_seq
            and kpos + 1 >= first_kept
        )

    def _news(self, cpos: int, kpos: int, digest: str) -> bool:
        return (
            self.progress_base + len(self.progress) > cpos
            or self.kv_seq > kpos
            or self.store.state.catalog_digest() != digest
        )

    def _increment(self, cmd: RemotingCommand, cpos: int, kpos: int, digest: str) -> RemotingCommand:
        state = self.store.state
        data = bytes(self.progress[max(cpos - self.progress_base, 0) :])
        changes = [
            [ns, {k: _b64(v) for k, v in items.items()}]
            for seq, ns, items in self.kv
            if seq > kpos and ns is not None and items is not None
        ]
        header: dict = {"kv": changes}
        catalog = state.catalog_state()
        if catalog_digest(catalog) != digest:
            header["catalog"] = catalog
            digest = catalog_digest(catalog)
        ext = {"session": self.session, "cpos": cpos + len(data), "kpos": self.kv_seq, "digest": digest}
        return cmd.response(ResponseCode.SUCCESS, None, ext, _pack(header, data))

    async def _full(self, cmd: RemotingCommand, info: ReplicaState) -> RemotingCommand:
        state = self.store.state
        snapshot, cpos = state.progress_snapshot(), state.progress_position
        kpos = self.kv_seq  # changes after this one may also be in the dump: applied again, harmless
        rows = await self.store.kv.dump()
        catalog = state.catalog_state()
        header = {"full": True, "rows": [[ns, k, _b64(v)] for ns, k, v in rows], "catalog": catalog}
        ext = {"session": self.session, "cpos": cpos, "kpos": kpos, "digest": catalog_digest(catalog)}
        log.info(
            "state replication: full copy for %s (%d key-value rows)", cmd.ext_fields["replica"], len(rows)
        )
        return cmd.response(ResponseCode.SUCCESS, None, ext, _pack(header, snapshot))


class StateFollower(FollowerLoop):
    """A replica's side: pulls the primary's state into `store` until stopped (`synced`: a full
    copy taken in this connection)."""

    stream = "state replication"
    task = "state"
    log = log
    errors = (*FollowerLoop.errors, KeyError, struct.error)
    # where the stream stands: the primary's session and the positions its answers gave
    session = ""
    cpos = 0
    kpos = 0
    digest = ""

    @property
    def synced(self) -> asyncio.Event:
        """Set once a full copy is taken (cleared on reconnects)."""
        return self.ready

    async def _session(self, client: RemotingClient) -> None:
        while True:
            await self._pull(client)

    async def _pull(self, client: RemotingClient) -> None:
        ext = {
            "replica": self.name,
            "session": self.session,
            "cpos": self.cpos,
            "kpos": self.kpos,
            "digest": self.digest,
            "wait_ms": self.wait_ms,
        }
        r = await client.invoke(REPL_META, ext, timeout=self.wait_ms / 1000 + 10.0)
        if r.code != ResponseCode.SUCCESS:
            raise ValueError(f"state pull refused: {r.remark}")
        header, data = _unpack(r.body)
        state, kv = self.store.state, self.store.kv
        if "catalog" in header:
            state.apply_catalog(header["catalog"])
        if header.get("full"):
            await kv.replace_all([(ns, k, base64.b64decode(v)) for ns, k, v in header["rows"]])
            await state.replace_progress(data)
            self.ready.set()
        else:
            for ns, items in header["kv"]:
                await kv.put_many(
                    ns, {k: None if v is None else base64.b64decode(v) for k, v in items.items()}
                )
            if data:
                state.apply_progress(data)
        f = r.ext_fields
        self.session, self.cpos, self.kpos = f["session"], int(f["cpos"]), int(f["kpos"])
        self.digest = f["digest"]


__all__ = ["REPL_META", "StateFeed", "StateFollower"]
