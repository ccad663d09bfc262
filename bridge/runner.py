"""The asyncio glue of a link, and `Bridges`, the links of one process.

One connection of a link: open the sink, then the source; a reader task takes the source's items,
starts each one's `send` and queues it (at most `inflight` queued: backpressure on the source); an
acker task awaits the sends in receive order and acknowledges each to the source once confirmed.
Any error (a send refused or not confirmed, a connection lost) closes both ends and, after the
backoff `LinkState.failed` chose, connects again: what was read and not acknowledged is sent again
by the source (at least once; at most `inflight` duplicates per failure and link)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from .config import BridgeConfig
from .endpoints import Item, Sink, Source, open_sink, open_source
from .link import LinkState
from .topics import remap

log = logging.getLogger("gateway.bridge")

_DROP = object()


class Link:
    def __init__(self, cfg: BridgeConfig) -> None:
        self.cfg = cfg
        self.state = LinkState(
            cfg.name,
            cfg.source.address(),
            cfg.sink.address(),
            reconnect_min_s=cfg.reconnect_min_s,
            reconnect_max_s=cfg.reconnect_max_s,
        )
        self._task: asyncio.Task[None] | None = None
        self._source: Source | None = None
        self.up = asyncio.Event()  # set while connected (tests and readiness wait on it)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"bridge {self.cfg.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.state.stopped()
        self.up.clear()

    @property
    def backlog(self) -> int | None:
        return self._source.backlog if self._source is not None else None

    async def _run(self) -> None:
        st = self.state
        while True:
            st.connecting()
            try:
                await self._connection()
                err = "the source ended"
            except asyncio.CancelledError:
                raise
            except Exception as e:  # every failure of a connection is retried
                while isinstance(e, ExceptionGroup) and e.exceptions:  # the TaskGroup's: the first
                    e = e.exceptions[0]
                err = f"{type(e).__name__}: {e}"
            self.up.clear()
            delay = st.failed(err, time.monotonic())
            log.warning("bridge %s: %s; reconnecting in %.2f s", self.cfg.name, err, delay)
            await asyncio.sleep(delay)

    async def _connection(self) -> None:
        cfg, st = self.cfg, self.state
        sink, source = open_sink(cfg), open_source(cfg)
        queue: asyncio.Queue[tuple[Item, asyncio.Future[None] | object]] = asyncio.Queue(cfg.inflight)
        try:
            await sink.open()
            await source.open()
            self._source = source
            st.connected(time.monotonic())
            self.up.set()
            log.info("bridge %s up: %s -> %s", cfg.name, st.source, st.sink)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._read(source, sink, queue))
                tg.create_task(self._ack(source, queue))
        finally:
            while not queue.empty():  # sends of this connection not awaited: their sources resend
                _, sending = queue.get_nowait()
                if isinstance(sending, asyncio.Future):
                    sending.cancel()
                    with contextlib.suppress(BaseException):
                        await sending
            st.source_backlog = source.backlog
            self._source = None
            await source.close()
            await sink.close()

    async def _read(self, source: Source, sink: Sink, queue: asyncio.Queue) -> None:
        st, rules = self.state, self.cfg.rules
        async for item in source.items():
            st.on_received(time.monotonic(), item.redelivered)
            topic = remap(rules, item.topic)
            if topic is None:
                await queue.put((item, _DROP))
                continue
            sending = asyncio.ensure_future(sink.send(topic, item))
            await queue.put((item, sending))
        raise ConnectionError("the source ended")

    async def _ack(self, source: Source, queue: asyncio.Queue) -> None:
        st = self.state
        while True:
            item, sending = await queue.get()
            if sending is not _DROP:
                await sending  # type: ignore[misc]  # raises: the TaskGroup closes the connection
            await source.ack(item)
            st.on_forwarded(time.monotonic(), dropped=sending is _DROP)
            st.source_backlog = source.backlog


class Bridges:
    """The links of one process (`gateway bridge` or `gateway start` with `[[bridge]]`)."""

    def __init__(self, configs: Iterable[BridgeConfig]) -> None:
        self.links = [Link(c) for c in configs]

    def start(self) -> None:
        for link in self.links:
            link.start()

    async def stop(self) -> None:
        await asyncio.gather(*(link.stop() for link in self.links))

    def snapshot(self) -> list[dict[str, object]]:
        now = time.monotonic()
        return [link.state.snapshot(now) for link in self.links]

    def metrics(self) -> str:
        """Prometheus text of every link (docs/bridges.md, "Metrics")."""
        from .metrics import render

        return render(self.links)
