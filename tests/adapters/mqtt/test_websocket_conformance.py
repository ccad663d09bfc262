"""The project's MQTT conformance scenarios (conformance/protocols/mqtt.py) with Eclipse Paho
Python over WebSocket: the same scripts (conformance/clients/python/paho_scenarios.py) with the
params `transport: websockets` and `ws_path`, against a `gateway start` subprocess whose MQTT
endpoint for the scenarios is its mqtt_ws port (the cross-protocol one also uses gRPC)."""

from __future__ import annotations

import dataclasses

import pytest

from conformance.gateway_proc import GatewayProcess
from conformance.protocols.mqtt import SCENARIOS
from conformance.runner import run_scenario

PAHO = [name for name, spec in SCENARIOS.items() if "paho" in spec.clients]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("mqtt-ws-conformance")
    gw = GatewayProcess(
        root / "data", extra_args=["--mqtt-ws", "--mqtt-ws-port", "0", "--mqtt-ws-path", "/ws"]
    )
    gw.start()
    yield gw
    gw.stop()


@pytest.mark.parametrize("scenario", PAHO)
def test_paho_over_websocket(gateway, scenario, tmp_path):
    ws_port = int(gateway.listeners["mqtt_ws"].rsplit(":", 1)[1])
    target = dataclasses.replace(gateway.target, mqtt_port=ws_port)
    params = {"transport": "websockets", "ws_path": "/ws"}
    r = run_scenario(target, "mqtt", scenario, "paho", log_dir=tmp_path, extra_params=params)
    assert r.status == "PASS", f"{r.scenario}: {r.status} {r.reason}\n{r.details}\n{gateway.log_tail()}"
