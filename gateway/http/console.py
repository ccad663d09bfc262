"""The web console at `/console` (docs/console.md): static pages committed in the repo
(`console_static/`: one HTML page, one script, one style sheet; no build step) that call the admin
and read APIs the gateway already has, plus `GET /admin/overview`, the one figure set the console
needs that no other endpoint gives in one request (counters per protocol, connections, store size).

The pages are a small hash-routed script rather than server-rendered templates: every page is a
view of JSON the API serves anyway, so there is no second backend and nothing to render twice. Auth:
the console is a route like any other (with `auth` on the browser asks for the admin's credentials,
HTTP Basic, and sends them with every API request it makes)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import FileResponse, RedirectResponse
from pydantic import BaseModel, Field

from messaging_processor import MessagingProcessor

from .deps import get_processor

STATIC = Path(__file__).with_name("console_static")
_FILES = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}

router = APIRouter(tags=["console"])
Processor = Annotated[MessagingProcessor, Depends(get_processor)]


@router.get("/console", include_in_schema=False)
async def console_page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")


@router.get("/console/", include_in_schema=False)
async def console_slash() -> RedirectResponse:
    return RedirectResponse("/console")


@router.get("/console/static/{name}", include_in_schema=False)
async def console_file(name: str) -> FileResponse:
    media = _FILES.get(name)
    if media is None:
        raise HTTPException(404, f"no console file {name}")
    return FileResponse(STATIC / name, media_type=media, headers={"Cache-Control": "no-cache"})


class ProtocolFigures(BaseModel):
    messages_in: int = Field(0, description="messages stored from this protocol (counter)")
    messages_out: int = Field(0, description="messages delivered through this protocol (counter)")
    connections: int = Field(0, description="open connections now")


class Overview(BaseModel):
    time: float = Field(description="server time, epoch seconds (rates are counter deltas over it)")
    protocols: dict[str, ProtocolFigures]
    topics: int
    groups: int
    store: dict[str, int] = Field(description="commitlog_bytes, disk_free_bytes, disk_total_bytes when known")
    bridges: list[dict[str, Any]] = Field(
        default_factory=list, description="the [[bridge]] links run in this process (docs/bridges.md)"
    )


@router.get("/admin/overview", response_model=Overview)
async def overview(p: Processor, request: Request) -> Overview:
    """Counters per protocol (messages in and out, connections), topic and group counts and the
    store's size and free disk: the console's overview page polls it and draws rates from deltas."""
    m = p.metrics
    ins: Counter = Counter()
    outs: Counter = Counter()
    for (protocol, _topic), n in m.messages_in.items():
        ins[protocol] += n
    for (protocol, _topic), n in m.messages_out.items():
        outs[protocol] += n
    limiter = getattr(request.app.state, "limiter", None)
    conns: dict[str, int] = dict(limiter.connections) if limiter is not None else {}
    names = set(ins) | set(outs) | set(conns) | {a.name for a in request.app.state.listeners()}
    protocols = {
        n: ProtocolFigures(messages_in=ins[n], messages_out=outs[n], connections=conns.get(n, 0))
        for n in sorted(names)
        if n
    }
    stats = p.store_stats()
    store = {
        k: int(v)  # type: ignore[call-overload]
        for k in ("commitlog_bytes", "disk_free_bytes", "disk_total_bytes")
        if isinstance(v := stats.get(k), int | float)
    }
    bridges = getattr(request.app.state, "bridges", lambda: None)()
    return Overview(
        time=time.time(),
        protocols=protocols,
        topics=len(await p.list_topics()),
        groups=len(await p.list_groups()),
        store=store,
        bridges=bridges.snapshot() if bridges is not None else [],
    )


class Connection(BaseModel):
    id: str = Field(description="the handle DELETE /admin/connections/{id} takes")
    protocol: str
    client_id: str
    user: str | None = None
    remote: str
    since: float = Field(description="connected at, epoch seconds")
    messages_in: int | None = Field(None, description="messages received from it (MQTT, AMQP)")
    messages_out: int | None = Field(None, description="messages sent to it (MQTT, AMQP)")
    closable: bool = Field(description="whether DELETE can close it (MQTT and AMQP connections)")


def _sources(request: Request) -> list:
    return [a for a in request.app.state.listeners() if hasattr(a, "connections_info")]


@router.get("/admin/connections", response_model=list[Connection])
async def connections(p: Processor, request: Request) -> list[Connection]:
    """Open MQTT and AMQP connections (with their message counts) and the gRPC and 4.x clients the
    processor's registry knows (CloudEvents over HTTP has no lasting connection)."""
    out = [Connection(**c, closable=True) for a in _sources(request) for c in a.connections_info()]
    for c in p.clients.list():
        out.append(
            Connection(
                id=f"{c.protocol}:{c.client_id}",
                protocol=c.protocol,
                client_id=c.client_id,
                remote=c.remote,
                since=c.connected_at,
                closable=False,
            )
        )
    return out


@router.delete("/admin/connections/{conn_id}", status_code=204, response_class=Response)
async def close_connection(conn_id: str, request: Request) -> Response:
    """Close an MQTT connection (5.0: DISCONNECT 0x98 Administrative action) or an AMQP one
    (connection.close 320 CONNECTION_FORCED); 404 when no such open connection."""
    for a in _sources(request):
        if a.close_connection(conn_id):
            return Response(status_code=204)
    raise HTTPException(404, f"no open MQTT or AMQP connection {conn_id}")
