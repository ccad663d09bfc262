"""The Telemetry stream of one client: its Settings in, `{status OK, settings}` and transaction
checks out (the RocketMQ 5 clients' bidirectional session channel).

`telemetry_commands` is handed what it uses: the refusal of the stream's signature (None: let in),
the ACL check of a Settings command, `ClientSessions.apply` and the processor's client registry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from adapters.grpc import codes
from adapters.grpc.convert import message_to_proto
from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.sessions import PROTOCOL
from messaging_processor import ClientContext, ClientInfo, ClientRegistry, Message

log = logging.getLogger("adapters.grpc")

SettingsCheck = Callable[[ClientContext, d.Settings], Awaitable[d.Status | None]]
Apply = Callable[[ClientContext, d.Settings, Callable], Awaitable[tuple[d.Settings, ClientInfo]]]


async def telemetry_commands(
    ctx: ClientContext,
    request_iterator: AsyncIterator[s.TelemetryCommand],
    refused: d.Status | None,
    settings_refused: SettingsCheck,
    apply: Apply,
    clients: ClientRegistry,
) -> AsyncIterator[s.TelemetryCommand]:
    """The commands to answer `request_iterator` with, until it ends. Unauthenticated (`refused`):
    the stream stays open and every command is answered with a status-only command (the Node client
    fails its startup with it; ending the stream would make the clients reopen it every second)."""
    cid = ctx.client_id
    out: asyncio.Queue[s.TelemetryCommand | None] = asyncio.Queue()
    closed = False
    registered: list[ClientInfo] = []

    async def transaction_check(msg: Message, transaction_id: str) -> None:
        if closed:
            raise ConnectionError(f"telemetry stream of {cid} is closed")
        cmd = s.RecoverOrphanedTransactionCommand(
            message=message_to_proto(msg), transaction_id=transaction_id
        )
        out.put_nowait(s.TelemetryCommand(recover_orphaned_transaction_command=cmd))

    async def read() -> None:
        try:
            async for cmd in request_iterator:
                if refused is not None:
                    out.put_nowait(s.TelemetryCommand(status=refused))
                elif cmd.WhichOneof("command") == "settings":
                    if (st := await settings_refused(ctx, cmd.settings)) is not None:
                        out.put_nowait(s.TelemetryCommand(status=st))  # no settings: not registered
                        continue
                    reply, info = await apply(ctx, cmd.settings, transaction_check)
                    registered[:] = [info]
                    out.put_nowait(s.TelemetryCommand(status=codes.OK, settings=reply))
                # thread_stack_trace / verify_message_result answer commands we never send.
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the stream ends; the client reconnects
            log.info("telemetry of %s ended: %s", cid, e)
        finally:
            out.put_nowait(None)

    reader = asyncio.get_running_loop().create_task(read())
    try:
        while (item := await out.get()) is not None:
            yield item
    finally:
        closed = True
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        if registered and clients.get(PROTOCOL, cid) is registered[0]:
            clients.unregister(PROTOCOL, cid)
