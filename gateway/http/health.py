"""GET /healthz: 200 when every enabled listener is up, 503 otherwise. In CLUSTER mode the body
also says what the proxy's view of the cluster lacks (`cluster`, from the StoreClient's `health()`):
while no name server answers, or no store node is live, the status is `degraded` (still 200: the
proxy serves with the routes it has, docs/cluster.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from .deps import get_listeners, get_processor

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str  # "ok", "degraded" (serving, something is missing) or "unavailable"
    listeners: dict[str, str]  # listener name -> bound "host:port"
    down: list[str] = []  # enabled listeners that are not accepting
    cluster: dict[str, Any] | None = None  # CLUSTER mode: name server, store nodes, problems


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: {"model": Health, "description": "a listener is not up"}},
)
async def healthz(request: Request) -> JSONResponse:
    adapters = get_listeners(request)
    listeners = {a.name: a.address for a in adapters}
    down = [a.name for a in adapters if not a.listening]
    report = getattr(get_processor(request).store, "health", None)
    cluster = report() if callable(report) else None
    status = "unavailable" if down else "degraded" if cluster and cluster.get("problems") else "ok"
    body = Health(status=status, listeners=listeners, down=down, cluster=cluster)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=503 if down else 200)
