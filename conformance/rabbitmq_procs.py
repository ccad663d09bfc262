"""Finding a RabbitMQ started by hand (never as a service) and its processes, for the tests and the
benches that run one beside the gateway (tests/bridge/peers.py, bench/amqp_servers.py): the Debian
package's `rabbitmq-server` script, an AMQP readiness probe, and the `beam.smp` / `epmd` processes
to measure and to clean up. Reads /proc only; imports nothing of the project."""

from __future__ import annotations

import contextlib
import glob
import os
import socket


def rabbitmq_script() -> str | None:
    """The installed `rabbitmq-server` script (Debian's rabbitmq-server package), or None."""
    found = sorted(glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin/rabbitmq-server"))
    return found[-1] if found else None


def amqp_ready(port: int) -> bool:
    """The port answers an AMQP 0-9-1 protocol header with connection.start."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            data = s.recv(64)
            return len(data) >= 11 and data[0] == 1 and data[7:11] == b"\x00\x0a\x00\x0a"
    except OSError:
        return False


def comm(pid: int) -> str:
    """The process's command name ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def epmd_pids(epmd_port: int) -> list[int]:
    """The `epmd` processes serving `epmd_port` (ERL_EPMD_PORT in their environment)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and comm(int(d)) == "epmd":
            with contextlib.suppress(OSError), open(f"/proc/{d}/environ", "rb") as f:
                if f"ERL_EPMD_PORT={epmd_port}".encode() in f.read().split(b"\0"):
                    out.append(int(d))
    return out
