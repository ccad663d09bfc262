"""The outbound bound of gRPC clients (docs/limits.md "Memory per connection"): body bytes that the
ReceiveMessage calls of one client id have popped and grpc has not yet taken for sending.

grpc.aio's HTTP/2 flow control stops the writes to a client that does not read (a ReceiveMessage
generator is resumed only once its previous item is accepted), but each call pops its whole batch
first, and a client may run many calls at once: without this, a client that never reads holds
calls x batch x message size. With it, a call waits (within its long poll) while its client is over
the bound, and asks for about the bytes left, by the mean message size seen so far."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from messaging_processor import Delivery


class OutboundBudgets:
    """Per client id: bytes held, whether one of its calls is popping (then the others wait: its size
    is not known yet), and an event for the calls waiting."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._held: dict[str, int] = {}  # only clients holding something
        self._popping: set[str] = set()
        self._waiting: dict[str, asyncio.Event] = {}  # only clients with waiting calls
        self._mean = 0  # body size of the deliveries popped, over all clients

    def held(self, client_id: str) -> int:
        return self._held.get(client_id, 0)

    def _free(self, client_id: str) -> bool:
        return client_id not in self._popping and self._held.get(client_id, 0) < self.bound

    async def acquire(self, client_id: str, timeout: float) -> bool:
        """Wait up to `timeout` s until `client_id` holds less than the bound and pops nothing; then
        it pops (call `took` after, also when the pop failed). Whether it may pop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._free(client_id):
            ev = self._waiting.setdefault(client_id, asyncio.Event())
            try:
                await asyncio.wait_for(ev.wait(), deadline - loop.time())
            except TimeoutError:
                return False
        self._popping.add(client_id)
        return True

    def batch(self, client_id: str, batch: int) -> int:
        """How many to pop: `batch`, or fewer when that would go far past the bytes left."""
        if not self._mean:
            return batch
        left = self.bound - self._held.get(client_id, 0)
        return max(1, min(batch, left // self._mean))

    def took(self, client_id: str, deliveries: Sequence[Delivery]) -> None:
        """The pop `acquire` allowed is over: `deliveries` are held until `sent`."""
        self._popping.discard(client_id)
        if deliveries:
            n = sum(len(dl.message.body) for dl in deliveries)
            self._held[client_id] = self._held.get(client_id, 0) + n
            size = max(1, n // len(deliveries))
            self._mean = (self._mean + size) // 2 if self._mean else size
        self._wake(client_id)

    def sent(self, client_id: str, nbytes: int) -> None:
        """`nbytes` of `client_id`'s deliveries were taken by grpc (or given back)."""
        left = self._held.get(client_id, 0) - nbytes
        if left > 0:
            self._held[client_id] = left
        else:
            self._held.pop(client_id, None)
        self._wake(client_id)

    def _wake(self, client_id: str) -> None:
        if self._free(client_id):
            ev = self._waiting.pop(client_id, None)
            if ev is not None:
                ev.set()
