"""GET /healthz: 200 when every enabled listener is up, 503 otherwise."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from .deps import get_listeners

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str  # "ok" or "unavailable"
    listeners: dict[str, str]  # listener name -> bound "host:port"
    down: list[str] = []  # enabled listeners that are not accepting


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: {"model": Health, "description": "a listener is not up"}},
)
async def healthz(request: Request) -> JSONResponse:
    adapters = get_listeners(request)
    listeners = {a.name: a.address for a in adapters}
    down = [a.name for a in adapters if not a.listening]
    body = Health(status="unavailable" if down else "ok", listeners=listeners, down=down)
    return JSONResponse(body.model_dump(), status_code=503 if down else 200)
