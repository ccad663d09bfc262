"""AMQP 0-9-1 conformance: pika 1.4.4 and aio-pika 10.2.1 (.venv-conformance, `make
install-conformance`), each scenario x client in its own process, against a real `gateway start`
subprocess with the AMQP listener on an ephemeral port (conformance/protocols/amqp.py); then a fast,
stable part of aiormq's own broker-facing test suite (conformance/amqp_suite.py) against another
spawned gateway with TLS, asserting the pass count does not drop below the recorded floor.
"""

from __future__ import annotations

import os

import pytest

from conformance import amqp_suite
from conformance.gateway_proc import GatewayProcess
from conformance.protocols.amqp import SCENARIOS
from conformance.runner import Result, _python_installed, run_scenario

PAIRS = [(name, client) for name, spec in SCENARIOS.items() for client in spec.clients]

# A fast part of aiormq's suite (~25 s): its channel, nowait, consumer, confirm, publish-cancel and
# delivery-error tests over plain TCP (the full suite, 1043 tests with the TLS and named-connection
# parametrisations and the slow close "stairway", takes ~10 minutes: `python -m conformance.amqp_suite`).
# 164 selected: 158 passed, 1 skipped when recorded; the 5 known failures (docs/conformance.md):
# test_big_message x4 (20 MiB body > our 4 MiB limit), test_exclusive_queue_locked (exclusive compared
# on redeclare).
SUITE_SELECT = (
    "(test_channel or test_nowait or test_consumer or test_late_confirms or test_publish_cancel "
    "or test_delivery_error) and not amqp-named and not amqps"
)
# The floor leaves 2 for the timing-dependent tests seen failing once on the loaded machine (e.g.
# test_consumer_can_catch_publish_error): 157 was seen once in 6 runs.
SUITE_FLOOR = int(os.environ.get("AMQP_SUITE_FLOOR", "156"))


def _explain(r: Result) -> str:
    head = f"{r.protocol}/{r.scenario}/{r.client}: {r.status} {r.reason}"
    return f"{head}\ndetails: {r.details}\nlogs: {r.log_dir}"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("amqp-conformance")
    gw = GatewayProcess(root / "data")
    gw.start()
    yield gw
    gw.stop()


@pytest.mark.parametrize(("scenario", "client"), PAIRS, ids=[f"{s}-{c}" for s, c in PAIRS])
def test_amqp_scenario(gateway, scenario, client, tmp_path):
    r = run_scenario(gateway.target, "amqp", scenario, client, log_dir=tmp_path)
    assert r.status == "PASS", _explain(r) + f"\ngateway log tail:\n{gateway.log_tail()}"


def test_aiormq_suite_pass_floor(tmp_path):
    missing = _python_installed("aiormq", "pytest", "aiomisc_pytest.py")()
    if missing:
        pytest.fail(missing)
    try:
        sdist = amqp_suite.fetch_sdist()
    except OSError as e:  # no network and no cached sdist
        pytest.skip(f"aiormq sdist unavailable: {e}")
    res = amqp_suite.run_suite(tmp_path, sdist=str(sdist), select=SUITE_SELECT, timeout=50)
    assert res["passed"] >= SUITE_FLOOR, res
