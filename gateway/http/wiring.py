"""The gateway's HTTP listener, wired: the FastAPI app (CloudEvents, the admin and read APIs, the
console, /metrics, /healthz) with MQTT over WebSocket at `mqtt_ws_path` when MQTT runs too
(adapters/mqtt/asgi_websocket.py), served by HttpAdapter on the HTTP (and HTTPS) port."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Wired(Protocol):
    """What `http_adapter` reads of the gateway (gateway/server.py `Gateway`)."""

    settings: Any
    processor: Any
    extra_routers: Sequence[Any]
    listeners: Any
    limiter: Any
    os_limits: Any
    bridges: Any
    adapters: Sequence[Any]
    worker: Any

    def _tls_context(self) -> Any: ...


def http_adapter(gw: Wired) -> Any:
    """The HTTP adapter of `gw` (started by the caller, as every listener)."""
    from adapters.cloudevents import CloudEvents
    from gateway.http import HttpAdapter, create_app
    from gateway.http.metrics import MetricsOptions

    s = gw.settings
    ce = CloudEvents(gw.processor, dedup_window_s=s.cloudevents_dedup_window_s, limiter=gw.limiter)
    routers = [*ce.routers(), *gw.extra_routers]
    if "mqtt" in s.protocols:  # MQTT over WebSocket on this port too (docs/mqtt.md)
        from adapters.mqtt.asgi_websocket import router as mqtt_ws_router

        routers.append(
            mqtt_ws_router(lambda: next((a for a in gw.adapters if a.name == "mqtt"), None), s.mqtt_ws_path)
        )
    app = create_app(gw.processor, routers, listeners=gw.listeners)
    app.state.limiter = gw.limiter  # /metrics: gateway_limit_refusals_total
    app.state.os_limits = gw.os_limits  # /metrics: gateway_fd_limit, gateway_accept_errors_total
    app.state.metrics_options = MetricsOptions(s.metrics_per_object, s.metrics_max_objects)
    app.state.bridges = lambda: gw.bridges  # /metrics: gateway_bridge_* (docs/bridges.md)
    http = HttpAdapter(
        app,
        s.host,
        s.http_port,
        access_log=s.log_level == "debug",
        ssl=gw._tls_context(),
        tls_port=s.https_port,
        limiter=gw.limiter,
        reuse_port=gw.worker is not None,
    )
    return ce.serve(http)
