"""Scenario registry: protocol name → scenario name → Scenario. A new protocol adds a module here
and an entry below."""

from __future__ import annotations

from conformance.protocols import amqp, cloudevents, grpc, mqtt

REGISTRY = {
    "grpc": grpc.SCENARIOS,
    "mqtt": mqtt.SCENARIOS,
    "http": cloudevents.SCENARIOS,
    "amqp": amqp.SCENARIOS,
}
