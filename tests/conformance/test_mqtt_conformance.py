"""MQTT conformance: Eclipse Paho Python, MQTT.js and mosquitto_pub/mosquitto_sub, each scenario x
client in its own process and environment (.venv-conformance, conformance/clients/node/node_modules,
Debian mosquitto-clients; `make install-conformance`, `make install-system`), against a real
`gateway start` subprocess with the MQTT listener on an ephemeral port. One test per scenario x
client, in MQTT 3.1.1 and 5.0.
"""

from __future__ import annotations

import pytest

from conformance.gateway_proc import GatewayProcess
from conformance.protocols.mqtt import SCENARIOS
from conformance.runner import Result, run_scenario

PAIRS = [(name, client) for name, spec in SCENARIOS.items() for client in spec.clients]


def _explain(r: Result) -> str:
    head = f"{r.protocol}/{r.scenario}/{r.client}: {r.status} {r.reason}"
    return f"{head}\ndetails: {r.details}\nlogs: {r.log_dir}"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("mqtt-conformance")
    gw = GatewayProcess(root / "data")
    gw.start()
    yield gw
    gw.stop()


@pytest.mark.parametrize(("scenario", "client"), PAIRS, ids=[f"{s}-{c}" for s, c in PAIRS])
def test_mqtt_scenario(gateway, scenario, client, tmp_path):
    r = run_scenario(gateway.target, "mqtt", scenario, client, log_dir=tmp_path)
    assert r.status == "PASS", _explain(r) + f"\ngateway log tail:\n{gateway.log_tail()}"
