"""HTTP / CloudEvents conformance: the CloudEvents Python SDK with httpx (and Paho for the
cross-protocol scenario), in .venv-conformance (`make install-conformance`), against a real
`gateway start` subprocess (gRPC, HTTP and MQTT on ephemeral ports). One test per scenario; the
JSON format and binary-mode test vectors are conformance/vectors/*.json.
"""

from __future__ import annotations

import pytest

from conformance.gateway_proc import GatewayProcess
from conformance.protocols.cloudevents import SCENARIOS
from conformance.runner import Result, run_scenario

PAIRS = [(name, client) for name, spec in SCENARIOS.items() for client in spec.clients]


def _explain(r: Result) -> str:
    head = f"{r.protocol}/{r.scenario}/{r.client}: {r.status} {r.reason}"
    return f"{head}\ndetails: {r.details}\nlogs: {r.log_dir}"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("http-conformance")
    gw = GatewayProcess(root / "data")
    gw.start()
    yield gw
    gw.stop()


@pytest.mark.parametrize(("scenario", "client"), PAIRS, ids=[f"{s}-{c}" for s, c in PAIRS])
def test_http_scenario(gateway, scenario, client, tmp_path):
    r = run_scenario(gateway.target, "http", scenario, client, log_dir=tmp_path)
    assert r.status == "PASS", _explain(r) + f"\ngateway log tail:\n{gateway.log_tail()}"
