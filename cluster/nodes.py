"""One store node as a proxy sees it: a remoting connection with request/reply by store
operation (`NodeClient.call`), and the coalescing of concurrent single-message sends to one node
and topic into batches (`AppendBatcher`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from remoting import RemotingCommand, ResponseCode, parse_host_port
from remoting.client import RemotingClient, RemotingClientError
from store import Message, StoreError

from . import store_wire as w


class NodeUnavailable(StoreError):
    """A store node could not be reached (connection refused, closed or timed out)."""


class NodeClient:
    """One store node: `call(op, args, body)` over a remoting connection."""

    def __init__(
        self, name: str, addr: str, tag: int, on_txn_check: Callable[[NodeClient, Message], None]
    ) -> None:
        self.name = name
        self.addr = addr
        self.tag = tag  # the node's commit log offset tag (ids.node_tag)
        self.listed = False  # the name server lists it (lease alive)
        self.conn: RemotingClient | None = None
        self._on_txn_check = on_txn_check
        self._connecting: asyncio.Lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        return self.listed and self.conn is not None and not self.conn.closed.is_set()

    async def connect(self, timeout: float) -> None:
        async with self._connecting:
            if self.conn is not None and not self.conn.closed.is_set():
                return
            host, port = parse_host_port(self.addr, 10911)
            self.conn = await RemotingClient.connect(host, port, self._on_request, timeout=timeout)

    def _on_request(self, cmd: RemotingCommand) -> None:
        if cmd.code == w.TXN_CHECK:
            for m in w.decode_messages(cmd.body):
                self._on_txn_check(self, m)

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        body: bytes = b"",
        *,
        timeout: float = 10.0,
        sent: Callable[[int], None] | None = None,
    ) -> RemotingCommand:
        """The SUCCESS reply of `op`; raises the store exception a failure stands for, or
        NodeUnavailable. `sent(opaque)` is called once the request is on its way."""
        conn = self.conn
        if conn is None or conn.closed.is_set():
            raise NodeUnavailable(f"store node {self.name} is not connected")
        cmd = conn.command(w.OPS[op], {"a": w.dumps(args)} if args else None, body)
        if sent is not None:
            sent(cmd.opaque)
        try:
            r = await conn.invoke(cmd, timeout=timeout)
        except (RemotingClientError, OSError, TimeoutError) as e:
            raise NodeUnavailable(f"store node {self.name} ({self.addr}): {e or type(e).__name__}") from e
        if r.code != ResponseCode.SUCCESS:
            if "error" in r.ext_fields:
                raise w.make_error(r.ext_fields["error"], r.remark or "")
            raise StoreError(f"store node {self.name}: {r.remark} (code {r.code})")
        return r

    async def value(self, op: str, args: dict[str, Any] | None = None, body: bytes = b"") -> Any:
        return w.reply_value((await self.call(op, args, body)).body)

    def cancel(self, opaque: int) -> None:
        conn = self.conn
        if conn is not None and not conn.closed.is_set():
            conn.oneway(w.CANCEL, {"opaque": opaque})


class AppendBatcher:
    """Concurrent single-message appends for one node and topic, coalesced: at most `max_inflight`
    append requests are on the wire; messages that arrive meanwhile leave together as one batch
    (one request, one group commit on the node). Alone, a message leaves at once.

    A batch holds one topic, so the node refuses all of it or none (a missing topic, a closed
    store); a refused batch is retried message by message so each caller gets its own answer."""

    def __init__(self, node: NodeClient, timeout: float, max_inflight: int = 2, max_batch: int = 256) -> None:
        self.node = node
        self.timeout = timeout
        self.max_inflight = max_inflight
        self.max_batch = max_batch
        self.pending: list[tuple[Message, asyncio.Future[list[Any]]]] = []
        self.inflight = 0

    def submit(self, msg: Message) -> asyncio.Future[list[Any]]:
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.pending.append((msg, fut))
        self._kick()
        return fut

    def _kick(self) -> None:
        while self.pending and self.inflight < self.max_inflight:
            batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch :]
            self.inflight += 1
            asyncio.ensure_future(self._send(batch))

    async def _send(self, batch: list[tuple[Message, asyncio.Future[list[Any]]]]) -> None:
        try:
            try:
                r = await self.node.call(
                    "append", None, w.encode_messages([m for m, _ in batch]), timeout=self.timeout
                )
                results = w.reply_value(r.body)
            except NodeUnavailable as e:
                for _, f in batch:
                    if not f.done():
                        f.set_exception(e)
                return
            except Exception as e:  # noqa: BLE001 - refused as a whole: answer each on its own
                if len(batch) == 1:
                    if not batch[0][1].done():
                        batch[0][1].set_exception(e)
                    return
                for m, f in batch:
                    try:
                        one = await self.node.call(
                            "append", None, w.encode_messages([m]), timeout=self.timeout
                        )
                        if not f.done():
                            f.set_result(w.reply_value(one.body)[0])
                    except Exception as e1:  # noqa: BLE001 - that caller's failure
                        if not f.done():
                            f.set_exception(e1)
                return
            for (_, f), v in zip(batch, results, strict=True):
                if not f.done():
                    f.set_result(v)
        finally:
            self.inflight -= 1
            self._kick()
