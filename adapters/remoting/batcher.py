"""Single-message sends that arrive in the same event-loop turn (many producers, or pipelined
oneway sends) are stored with one `processor.send` call (one store `append_many`, one future).

Messages are grouped by the sender's identity (authorization is per identity). If the combined
call fails for a reason that may concern only some messages (validation, a missing topic), each
message of the group is sent again on its own so that every sender gets its own answer."""

from __future__ import annotations

import asyncio
import logging

from messaging_processor import (
    ClientContext,
    ErrorKind,
    Identity,
    Message,
    MessagingProcessor,
    ProcessorError,
    SendReceipt,
)

log = logging.getLogger("adapters.remoting")

# Failures that are the same for every message of a group: no point in retrying one by one (and a
# group the store wrote but did not replicate in time must not be written again).
_SHARED = frozenset(
    {ErrorKind.UNAVAILABLE, ErrorKind.NOT_REPLICATED, ErrorKind.STORE_FULL, ErrorKind.INTERNAL}
)
Item = tuple[ClientContext, Message, asyncio.Future[SendReceipt]]


class SendBatcher:
    def __init__(self, processor: MessagingProcessor, max_batch: int = 256) -> None:
        self.processor = processor
        self.max_batch = max_batch
        self._pending: dict[Identity, list[Item]] = {}
        self._scheduled = False
        self._tasks: set[asyncio.Task] = set()

    def send(self, ctx: ClientContext, msg: Message) -> asyncio.Future[SendReceipt]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SendReceipt] = loop.create_future()
        self._pending.setdefault(ctx.identity, []).append((ctx, msg, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        loop = asyncio.get_running_loop()
        for items in pending.values():
            for i in range(0, len(items), self.max_batch):
                t = loop.create_task(self._send(items[i : i + self.max_batch]))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)

    async def _send(self, items: list[Item]) -> None:
        if len(items) == 1:
            await self._one(items[0])
            return
        try:
            receipts = await self.processor.send(items[0][0], [m for _c, m, _f in items])
        except ProcessorError as e:
            if e.kind in _SHARED:
                for _c, _m, f in items:
                    if not f.done():
                        f.set_exception(e)
                return
            for it in items:
                await self._one(it)
            return
        except Exception as e:  # noqa: BLE001 - hand the failure to every sender
            for _c, _m, f in items:
                if not f.done():
                    f.set_exception(e)
            return
        for (_c, _m, f), r in zip(items, receipts, strict=True):
            if not f.done():
                f.set_result(r)

    async def _one(self, item: Item) -> None:
        ctx, msg, fut = item
        try:
            r = (await self.processor.send(ctx, [msg]))[0]
        except Exception as e:  # noqa: BLE001
            if not fut.done():
                fut.set_exception(e)
            return
        if not fut.done():
            fut.set_result(r)

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
