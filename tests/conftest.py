"""Process-wide settings of the test run, applied before any test module imports grpc.

gRPC's fork handlers race with its own event-engine threads: after the gRPC tests have run, a
``fork()`` with a ``preexec_fn`` (how PySpark launches its JVM) failed in about 1 of 20 children
(``epoll_wait error: Bad file descriptor``; CI saw Spark's JAVA_GATEWAY_EXITED). No test forks a
child that uses gRPC without exec, so the handlers are switched off.

Gateways the tests spawn take 16 MiB commit log segments (grown to hold the largest body) instead
of 128 MiB: each fresh store zero-fills its first segment, and a run starts hundreds of them.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.setdefault("GATEWAY_SEGMENT_SIZE_MIB", "16")
