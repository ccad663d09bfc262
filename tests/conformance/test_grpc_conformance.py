"""RocketMQ 5 gRPC conformance: the official Python and Node clients, each in its own process and
environment (.venv-conformance, conformance/clients/node/node_modules; `make install-conformance`),
against a real `gateway start` subprocess. One test per scenario x client, plus a kill -9 restart.
"""

from __future__ import annotations

import threading
import time

import pytest

from conformance.gateway_proc import GatewayProcess
from conformance.protocols.grpc import HELPERS, SCENARIOS
from conformance.runner import Names, Result, new_run_id, run_scenario

PAIRS = [(name, client) for name, spec in SCENARIOS.items() for client in spec.clients]


def _explain(r: Result) -> str:
    head = f"{r.protocol}/{r.scenario}/{r.client}: {r.status} {r.reason}"
    return f"{head}\ndetails: {r.details}\nlogs: {r.log_dir}"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc-conformance")
    gw = GatewayProcess(root / "data")
    gw.start()
    yield gw
    gw.stop()


@pytest.mark.parametrize(("scenario", "client"), PAIRS, ids=[f"{s}-{c}" for s, c in PAIRS])
def test_grpc_scenario(gateway, scenario, client, tmp_path):
    r = run_scenario(gateway.target, "grpc", scenario, client, log_dir=tmp_path)
    assert r.status == "PASS", _explain(r) + f"\ngateway log tail:\n{gateway.log_tail()}"


def _count_lines(path) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def test_kill9_restart_loses_no_acknowledged_message(tmp_path):
    """Messages whose send returned before a SIGKILL of the gateway are all received after a
    restart on the same data dir and ports (the producer is still sending when the kill lands)."""
    gw = GatewayProcess(tmp_path / "data")
    gw.start()
    try:
        names = Names(f"cf{new_run_id()}-restart-python")
        acked = tmp_path / "acked.txt"
        produced: list[Result] = []
        producer = threading.Thread(
            target=lambda: produced.append(
                run_scenario(
                    gw.target,
                    "grpc",
                    HELPERS["produce"],
                    "python",
                    names=names,
                    log_dir=tmp_path / "produce",
                    extra_params={"count": 100_000, "out": str(acked)},
                )
            )
        )
        producer.start()
        deadline = time.monotonic() + 60
        while _count_lines(acked) < 300 and producer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _count_lines(acked) >= 300, f"producer did not get going: {produced and _explain(produced[0])}"
        gw.kill9()
        producer.join(60)
        assert not producer.is_alive(), "producer did not stop after the gateway died"
        before = _count_lines(acked)
        assert produced and produced[0].details.get("stopped_by"), _explain(produced[0])

        gw.start()  # same data dir, same ports
        r = run_scenario(
            gw.target,
            "grpc",
            HELPERS["consume"],
            "python",
            names=names,
            setup=False,
            log_dir=tmp_path / "consume",
            extra_params={"expect": str(acked)},
        )
        assert r.status == "PASS", _explain(r) + f"\ngateway log tail:\n{gw.log_tail()}"
        assert r.details["expected"] == before
        print(f"acked before kill -9: {before}; producer stopped by: {produced[0].details['stopped_by']}")
    finally:
        gw.stop()
