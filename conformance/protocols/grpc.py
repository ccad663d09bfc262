"""RocketMQ 5 gRPC (apache.rocketmq.v2) scenarios, run with the official Python and Node clients.

The scripts live in conformance/clients/<client>/scenarios.{py,js}; a scenario here declares what
the runner creates first (topics, groups with their retry settings), the parameters and timeout.
"""

from __future__ import annotations

from conformance.runner import Names, Scenario

BOTH = ("python", "node")
MIB = 1024 * 1024
MAX_ATTEMPTS = 3

_scenarios = [
    Scenario(
        "normal",
        "send normal messages; SimpleConsumer receives body/tag/keys/properties, tag filter, ack",
        BOTH,
        topics={"main": {}},
        groups={"all": {}, "taga": {}},
        timeout=60,
    ),
    Scenario(
        "fifo",
        "FIFO: 3 message groups x 5, each group consumed in send order",
        BOTH,
        topics={"main": {}},
        groups={"main": {}},
        timeout=60,
    ),
    Scenario(
        "delay",
        "delay message delivered at its delivery time (±1 s), later messages not held up",
        BOTH,
        topics={"main": {}},
        groups={"main": {}},
        params={"delay_s": 3, "tolerance_s": 1.0},
        timeout=60,
    ),
    Scenario(
        "transaction",
        "commit delivered; rollback never; unresolved -> checker asked, its answer applied",
        BOTH,
        topics={"main": {}},
        groups={"main": {}},
        timeout=90,
    ),
    Scenario(
        "simple_consumer",
        "ack; change invisible: short -> redelivery with attempt 2, long -> new handle",
        BOTH,
        topics={"main": {}},
        groups={"main": {}},
        timeout=60,
    ),
    Scenario(
        "push_consumer",
        f"PushConsumer: SUCCESS acks, FAILURE redelivers, {MAX_ATTEMPTS} tries -> %DLQ%group",
        BOTH,
        topics={"main": {}},
        groups={
            "main": {
                "max_attempts": MAX_ATTEMPTS,
                "retry_initial_ms": 500,
                "retry_multiplier": 1.0,
                "retry_max_ms": 1000,
            },
            "dlq": {},
        },
        params={"max_attempts": MAX_ATTEMPTS},
        timeout=120,
    ),
    Scenario(
        "group_split",
        "two SimpleConsumers in one group split 20 messages: no duplicates, together all",
        BOTH,
        topics={"main": {}},
        groups={"main": {}},
        timeout=60,
    ),
    Scenario(
        "topic_not_found",
        "send to a topic that does not exist -> TOPIC_NOT_FOUND (40402)",
        BOTH,
        params=lambda names: {"missing_topic": names.topic("missing")},
        timeout=45,
    ),
    Scenario(
        "body_too_large",
        "body of max+1 bytes -> MESSAGE_BODY_TOO_LARGE (41301); body of max bytes accepted",
        BOTH,
        topics={"main": {}},
        params={"max_body_size": 4 * MIB},
        timeout=60,
    ),
]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in _scenarios}

# Used by tests/conformance's kill -9 restart test, not listed in the table: "produce" appends each
# acknowledged message id to params["out"], "consume" receives until all ids in params["expect"].
HELPERS: dict[str, Scenario] = {
    "produce": Scenario(
        "produce",
        "send and record acknowledged ids",
        ("python",),
        topics={"main": {}},
        groups={"main": {}},
        timeout=120,
    ),
    "consume": Scenario(
        "consume",
        "receive until all expected ids",
        ("python",),
        topics={"main": {}},
        groups={"main": {}},
        timeout=120,
    ),
}

__all__ = ["HELPERS", "SCENARIOS", "Names"]
