"""The in-process test environment the adapters' tests share.

`Core`: a Store and a MessagingProcessor on one data directory, opened with the given StoreConfig
keyword arguments and MessagingProcessor keyword arguments. A test adds the adapter(s) it needs
(`add` starts one and stops it on close); `close` stops what was added (last first), then the
processor, then the store; `restart` closes and opens a new Core on the same directory with the same
settings (adapters are the caller's to add again). Each protocol's support.py builds its `Env` (the
Core, its adapter and that protocol's client factories) on it.

`FakeTransport`: what a protocol (MqttProtocol, AmqpProtocol) uses of its asyncio transport, for
tests that drive `data_received` directly and read back what it wrote. No sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from messaging_processor import LocalStoreClient, MessagingProcessor
from messaging_processor.security import Security
from messaging_processor.tracing import recorder_for
from store import Store, StoreConfig

if TYPE_CHECKING:
    from gateway.server import Gateway

T = 10.0  # seconds any single awaited event may take
MIB = 1024 * 1024
# commit log segments of the stores and gateways tests open (as tests/conftest.py gives spawned
# gateways): each zero-fills its first segment, and the 128 MiB default cost a run ~90 s
TEST_SEGMENT_SIZE_MIB = 16


A = TypeVar("A")  # an adapter: `await start()`, `await stop(grace)`


class Core:
    """Store + MessagingProcessor on `data_dir`; see the module docstring."""

    def __init__(
        self,
        store: Store,
        processor: MessagingProcessor,
        store_kw: dict[str, Any],
        processor_kw: dict[str, Any],
    ) -> None:
        self.store = store
        self.processor = processor
        self.data_dir = store.config.data_dir
        self._store_kw = store_kw
        self._processor_kw = processor_kw
        self._on_close: list[Callable[[], Awaitable[object]]] = []
        self._auth = False

    @classmethod
    async def open(
        cls,
        data_dir: str,
        *,
        processor_kw: dict[str, Any] | None = None,
        auth: bool = False,
        traced: bool = False,
        **store_kw: Any,
    ) -> Core:
        """Open the store (`StoreConfig(data_dir=data_dir, **store_kw)`; topics are not auto-created
        unless `auto_create_topics` says so) and start `MessagingProcessor(store, **processor_kw)`.
        `auth`: with authentication and ACLs on (`processor.security`; add users and rules through
        `core.security` / `core.security.directory`). `traced`: with the message trace on (1 h)."""
        store_kw.setdefault("auto_create_topics", False)
        largest = store_kw.get("max_message_size", StoreConfig().max_message_size)
        store_kw.setdefault("segment_size", max(TEST_SEGMENT_SIZE_MIB * MIB, largest + MIB))
        processor_kw = dict(processor_kw or {})
        store = await Store.open(StoreConfig(data_dir=data_dir, **store_kw))
        kw = dict(processor_kw)
        if auth:
            kw["security"] = Security(LocalStoreClient(store), poll_s=0.5)
        if traced:
            kw["tracer"] = recorder_for(LocalStoreClient(store), 3_600_000)
        processor = MessagingProcessor(LocalStoreClient(store), **kw)
        await processor.start()
        core = cls(store, processor, store_kw, processor_kw)
        core._auth = auth
        core._traced = traced
        return core

    @property
    def security(self) -> Security:
        """The processor's Security (only with `auth=True`)."""
        assert self.processor.security is not None, "open the Core with auth=True"
        return self.processor.security

    async def add(self, adapter: A, *, grace: float = 1.0) -> A:
        """Start `adapter` (built on `self.processor`); `close` stops it with `stop(grace)`."""
        await adapter.start()
        self.on_close(lambda: adapter.stop(grace))
        return adapter

    def on_close(self, step: Callable[[], Awaitable[object]]) -> None:
        """Await `step()` on close, before the steps and adapters added earlier and the processor."""
        self._on_close.append(step)

    async def close(self) -> None:
        while self._on_close:
            await self._on_close.pop()()
        await self.processor.close()
        await self.store.close()

    async def restart(self) -> Core:
        """Close this core and open a new one on the same data directory with the same settings."""
        await self.close()
        return await Core.open(
            self.data_dir,
            processor_kw=self._processor_kw,
            auth=self._auth,
            traced=self._traced,
            **self._store_kw,
        )


class FakeTransport:
    """What MqttProtocol / AmqpProtocol and their sessions use of an asyncio transport. Records every
    write; `close` delivers `connection_lost` on the next loop iteration, as asyncio's transports do;
    `peer_reset` delivers it at once with a ConnectionResetError (the peer went away)."""

    def __init__(self, protocol: asyncio.BaseProtocol, peer: tuple[str, int] = ("192.0.2.7", 50123)) -> None:
        self.protocol = protocol
        self.peer = peer  # what get_extra_info("peername") answers
        self.data = bytearray()
        self.writes = 0
        self.late_writes = 0  # writes after close: the protocol must not make any
        self.closing = False
        self.aborted = False
        self.paused = False
        self.pauses = 0
        self.resumes = 0
        self.changed = asyncio.Event()  # set on every write and on close
        self.lost = asyncio.Event()  # set once the protocol got connection_lost

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer}.get(name, default)

    def write(self, data: bytes) -> None:
        if self.closing:
            self.late_writes += 1
            return
        self.data += data
        self.writes += 1
        self.changed.set()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.changed.set()
        asyncio.get_running_loop().call_soon(self._lost, None)

    def abort(self) -> None:
        self.aborted = True
        self.close()

    def peer_reset(self) -> None:
        """The peer went away without saying so (connection reset)."""
        self.closing = True
        self.changed.set()
        self._lost(ConnectionResetError("reset by peer"))

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False
        self.resumes += 1

    def _lost(self, exc: Exception | None) -> None:
        if not self.lost.is_set():
            self.protocol.connection_lost(exc)
            self.lost.set()


async def wait_until(cond: Callable[[], bool], timeout: float = T) -> None:
    """Poll `cond()` (state the code under test announces no event for) until it holds."""

    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def start_gateway(data_dir: str, protocols: tuple[str, ...], **settings: Any) -> Gateway:
    """An in-process gateway (`gateway.server.Gateway`, LOCAL mode), started, with `protocols`
    listening on ephemeral ports, `flush="async"` and 4 MiB segments unless `settings` say
    otherwise; the caller stops it (`running_gateway` does)."""
    from gateway.config import Settings
    from gateway.server import Gateway

    kw: dict[str, Any] = {f"{p}_port": 0 for p in protocols} | {"flush": "async", "segment_size_mib": 4}
    g = Gateway(Settings(data_dir=data_dir, protocols=protocols, **(kw | settings)))
    await g.start()
    return g


def listener(gw: Gateway, name: str) -> Any:
    """The gateway's adapter named `name` ("mqtt", "amqp", "http", ...)."""
    return next(a for a in gw.adapters if a.name == name)


@contextlib.asynccontextmanager
async def running_gateway(
    data_dir: str, protocols: tuple[str, ...], **settings: Any
) -> AsyncIterator[Gateway]:
    """`start_gateway`, stopped on exit."""
    g = await start_gateway(data_dir, protocols, **settings)
    try:
        yield g
    finally:
        await g.stop()
