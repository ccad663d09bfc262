"""Process-wide settings of the test run, applied before any test module imports grpc.

gRPC's fork handlers race with its own event-engine threads: after the gRPC tests have run, a
``fork()`` with a ``preexec_fn`` (how PySpark launches its JVM) failed in about 1 of 20 children
(``epoll_wait error: Bad file descriptor``; CI saw Spark's JAVA_GATEWAY_EXITED). No test forks a
child that uses gRPC without exec, so the handlers are switched off.

Gateways the tests spawn take 16 MiB commit log segments (grown to hold the largest body) instead
of 128 MiB: each fresh store zero-fills its first segment, and a run starts hundreds of them.

In-process tests hash passwords with argon2id at its lowest cost (`TEST_HASHER`): the product's
(t=3, m=64 MiB, p=4: 0.1-0.2 s of CPU a hash, and as much a verify) was paid for every user every
test adds, thousands of times a run. Verifying reads the cost from the stored hash, so nothing else
changes; spawned gateways keep the product's cost, which
tests/messaging_processor/test_security.py checks in a fresh interpreter.

`make test` runs the suite on every core (pytest-xdist, `--dist loadfile`), then the serial group
alone: the test files in `SERIAL` get the `serial` marker here, each with the reason it cannot share
the machine with other tests.
"""

from __future__ import annotations

import os

import pytest
from argon2 import PasswordHasher

from messaging_processor.security import passwords

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.setdefault("GATEWAY_SEGMENT_SIZE_MIB", "16")
# Spawned gateways start no MQTT over WebSocket listeners (8083/8084 are fixed ports) unless a test
# asks for them (tests/adapters/mqtt/test_websocket_gateway.py).
os.environ.setdefault("GATEWAY_MQTT_WS", "false")

TEST_HASHER = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)  # argon2's minimum
passwords._HASHER = TEST_HASHER
passwords.DUMMY_HASH = TEST_HASHER.hash("no user has this password: it only spends the same time")

# Test files (paths from the repo root) that run alone after the parallel run, and why.
SERIAL = {
    # compares a noisy publisher's throughput with a quiet one's (±30 %, ≥ 70 %): another test's CPU
    # on the same cores is measured as the limiter's error
    "tests/limits/test_rates.py": "measures rates",
    # bounds the gateway's resident memory growth while tens of MB pass through it, under a timeout
    # that assumes the publisher gets a core
    "tests/limits/test_memory.py": "measures memory under load",
    # counts the Python bytes of 200 idle MQTT connections with tracemalloc and times keep-alive
    # closes to a fraction of a second
    "tests/adapters/mqtt/test_idle_cost.py": "measures memory per connection",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        if item.path.relative_to(root).as_posix() in SERIAL:
            item.add_marker(pytest.mark.serial)
