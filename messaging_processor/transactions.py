"""Transactional messages: ending a half message (commit or roll back) and the store's check of an
unresolved one, routed to a connected producer of its topic.

`Transactions` is handed the `StoreClient`, the processor's `Metrics`, its `Dispatchers` (a committed
message's copies for the sessions whose filters match it, dispatch.py) and the `ClientRegistry`
(which producers can answer a check)."""

from __future__ import annotations

import logging

from store import Message, MessageType

from .dispatch import Dispatchers
from .errors import ErrorKind, ProcessorError, StoreCall
from .metrics import Metrics
from .model import ClientContext, SendReceipt
from .registry import ClientRegistry
from .store_client import StoreClient

log = logging.getLogger("messaging_processor")

# Internal properties the store adds to redirected (delayed / half) messages.
INTERNAL_PROPS = ("__REAL_TOPIC", "__REAL_QID", "TRANSACTION_CHECK_TIMES")


class Transactions:
    """End and check half messages (see the module docstring)."""

    def __init__(
        self, store: StoreClient, metrics: Metrics, dispatchers: Dispatchers, clients: ClientRegistry
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.dispatchers = dispatchers
        self.clients = clients

    async def end_transaction(
        self, ctx: ClientContext, transaction_id: str, commit: bool, *, message_id: str = ""
    ) -> SendReceipt | None:
        """Commit (deliver) or roll back a half message. `transaction_id` is the one the send
        receipt gave; `message_id` is a fallback. Returns where a committed message landed."""
        tid: int | str
        try:
            tid = int(transaction_id)
        except ValueError:
            if not message_id:
                raise ProcessorError(
                    ErrorKind.TRANSACTION_NOT_FOUND, f"unknown transaction id {transaction_id!r}"
                ) from None
            tid = message_id
        with StoreCall(self.metrics, ctx.protocol, "end_transaction"):
            r = await self.store.end_transaction(tid, commit)
        if r is None:
            return None
        if commit and self.dispatchers:  # a committed message's copies (dispatch.py): a write of
            # their own after the commit (a crash between the two loses them, not the message)
            with StoreCall(self.metrics, ctx.protocol, "end_transaction"):
                stored = await self.store.get_message(r.commitlog_offset)
                copies = self.dispatchers.copies_of_committed(stored, r.topic)
                if copies:
                    await self.store.append_many(copies)
        self.metrics.messages_in[(ctx.protocol, r.topic)] += 1
        return SendReceipt(
            r.message_id, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset, r.store_timestamp
        )

    async def check_transaction(self, half: Message) -> None:
        """Store callback for an unresolved half message: ask one connected producer of its topic."""
        topic = half.properties.get("__REAL_TOPIC", half.topic)
        tid = str(half.commitlog_offset)
        props = {k: v for k, v in half.properties.items() if k not in INTERNAL_PROPS}
        msg = Message(
            topic=topic,
            body=half.body,
            tag=half.tag,
            keys=half.keys,
            properties=props,
            message_group=half.message_group,
            message_id=half.message_id,
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            msg_type=MessageType.TRANSACTION,
            store_timestamp=half.store_timestamp,
            queue_offset=half.queue_offset,
            commitlog_offset=half.commitlog_offset,
        )
        for client in self.clients.transaction_checkers(topic):
            try:
                await client.transaction_check(msg, tid)  # type: ignore[misc]
                return
            except Exception as e:  # noqa: BLE001 - try the next producer
                log.warning("transaction check via %s failed: %s", client.client_id, e)
        log.info("no producer of %s can check transaction %s now; asking again later", topic, tid)
