"""Scenario registry: protocol name → scenario name → Scenario. Later protocols (amqp, http) add a
module here and an entry below."""

from __future__ import annotations

from conformance.protocols import grpc, mqtt

REGISTRY = {
    "grpc": grpc.SCENARIOS,
    "mqtt": mqtt.SCENARIOS,
}
