"""PySpark analytics over gateway topics (docs/analytics.md).

- `analytics.source`: the `gateway` Python data source (batch and streaming) reading topics through
  the gateway's HTTP read API (`analytics.client`).
- `analytics.functions`: column helpers (JSON telemetry bodies, device ids from topic paths).
- `analytics.telemetry`: the `gateway analytics telemetry` Structured Streaming job.
- `analytics.session`: a SparkSession with the source registered and laptop-safe settings.

Names are imported lazily so that `import analytics` (the gateway CLI) does not start pyspark."""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "GatewayDataSource": "analytics.source",
    "SCHEMA": "analytics.source",
    "ReadClient": "analytics.client",
    "parse_json_body": "analytics.functions",
    "device_id": "analytics.functions",
    "spark_session": "analytics.session",
    "register": "analytics.session",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'analytics' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
