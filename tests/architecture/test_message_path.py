"""The path of one message (MQTT QoS 1 PUBLISH -> store, fdatasync -> PUBACK, and out as an AMQP
basic.deliver) crosses package boundaries no more often, and comes back into a package it has left
no more often, than when it was last measured: `bench/path_trace.py --json` traces it in a child
gateway process and counts by its stated rules (RULE, PACKAGE_RULE; the steps in a fixed order, so
the counts do not depend on timing). Files and returns are reported, not capped (issue 52: a cap on
them bent the code; what matters is how often the message crosses a package and comes back)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Measured on the current tree (issue 52); docs/architecture.md ("Package crossings on this path")
# quotes them. Lower them when the path crosses less; raising them needs a reason there.
# (8 -> 10, issue 52 item 5: both decoders take bytes through the one receive-buffer rule,
# adapters/receive_buffer.py `ReceiveBuffer.feed`: one call out of adapters.mqtt and back per read)
MAX_CROSSINGS = 10
# the send path calls the MQTT adapter's session dispatcher (dispatch.py); the publish runs in the
# read's callback, so the store's return of the append future to the processor is in that step
# (3 -> 4: the MQTT decoder's return from the shared receive buffer)
MAX_REENTRIES = 4

pytest.importorskip("pika")
pytest.importorskip("uvloop")


@pytest.fixture(scope="module")
def path() -> dict:
    r = subprocess.run(
        [sys.executable, str(REPO / "bench" / "path_trace.py"), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_the_path_crosses_packages_no_more_often(path):
    steps = path["package_steps"]
    assert path["crossings"] == sum(len(seq) - 1 for _role, seq in steps)
    assert path["crossings"] == sum(path["crossing_pairs"].values())
    assert path["crossings"] <= MAX_CROSSINGS, steps


def test_the_path_comes_back_into_packages_no_more_often(path):
    steps = path["package_steps"]
    assert path["reentries"] == sum(len(seq) - len(set(seq)) for _role, seq in steps)
    assert path["reentries"] <= MAX_REENTRIES, steps


def test_the_path_goes_from_the_mqtt_adapter_through_the_store_to_the_amqp_adapter(path):
    steps = path["package_steps"]
    assert steps[0][1][0] == "adapters.mqtt"
    assert steps[-1][1][-1] == "adapters.amqp"
    assert any("store" in seq for _role, seq in steps)
    assert path["sequence"][0].startswith("adapters/mqtt/")
    assert path["sequence"][-1].startswith("adapters/amqp/")
    assert path["files"] == len(path["file_list"])


def test_the_counting_rule_on_a_made_up_path():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import path_trace as pt
    finally:
        sys.path.remove(str(REPO / "bench"))
    visits = [
        ("adapters/mqtt/session.py", "f", "one", False),
        ("adapters/mqtt/codec/decoder.py", "f", "one", False),
        ("messaging_processor/processor.py", "f", "one", False),
        ("adapters/limits.py", "f", "one", True),
        ("messaging_processor/processor.py", "f", "one", False),
        ("store/appending.py", "f", "two", False),
        ("messaging_processor/processor.py", "f", "two", False),
    ]
    p = pt.MessagePath([], [], visits)
    assert p.package_steps() == [
        ("one", ["adapters.mqtt", "messaging_processor", "adapters", "messaging_processor"]),
        ("two", ["store", "messaging_processor"]),
    ]
    assert (p.crossings, p.reentries) == (4, 1)
    assert p.crossing_pairs()["messaging_processor -> adapters"] == 1
