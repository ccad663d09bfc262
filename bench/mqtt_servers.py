"""MQTT brokers under test for bench/mqtt_bench.py besides our gateway (common.start_gateway).

Each `start_*` function writes what the broker needs into a fresh work directory, starts it pinned
to one CPU with RLIMIT_NOFILE raised to its hard limit (bench/common.py), waits until it accepts
MQTT connections and returns a `Server`. A broker that cannot start raises `ServerError` with the
tail of its log.

- `gateway` (bench/common.py `start_gateway(workdir, "mqtt", ...)`): `.venv/bin/gateway start
  --data-dir <tmp> --protocols mqtt,http --mqtt-port P --http-port Q` (or `python -m gateway.cli`
  from `--gateway-src`), ready when it logged `gateway ready` and `GET /healthz` answers 200.
  Default settings: flush policy `sync`.
- `mosquitto`: /usr/sbin/mosquitto with a config that never drops QoS 1 messages for slow
  subscribers (`max_queued_messages 0`, `max_queued_bytes 0`, `max_inflight_messages 0`), anonymous,
  no persistence, TCP_NODELAY on, only errors and warnings logged. With `tls=(cert, key)` its
  listener serves MQTT over TLS only (`certfile`, `keyfile`, no client certificates; `user root`:
  see MOSQUITTO_TLS_CONF).
- `amqtt`: the `amqtt` console script next to this interpreter with a YAML config (amqtt 0.12
  `BrokerConfig`: a `default` tcp listener on 127.0.0.1:P, unlimited connections, only
  `AnonymousAuthPlugin` with `allow_anonymous: true`, so no $SYS publishing or packet logging).

Process figures (CPU seconds, RSS, idle detection) come from bench/common.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from common import Server, ServerError, free_port, spawn, tcp_ready, wait_ready

MOSQUITTO = "/usr/sbin/mosquitto"


MOSQUITTO_CONF = """\
listener {port} 127.0.0.1
allow_anonymous true
persistence false
# never drop QoS 1 messages for slow subscribers; no in-flight cap per client
max_queued_messages 0
max_queued_bytes 0
max_inflight_messages 0
max_inflight_bytes 0
set_tcp_nodelay true
connection_messages false
log_dest stderr
log_type error
log_type warning
"""

# appended with `tls`: the listener above serves MQTT over TLS with the bench's certificate. Started
# as root, Mosquitto would switch to user `mosquitto` before reading the key in the bench's private
# work directory; `user root` keeps the starting user (no effect when that is not root).
MOSQUITTO_TLS_CONF = """\
user root
certfile {cert}
keyfile {key}
"""


def start_mosquitto(
    workdir: Path, cpu: int | None, timeout: float = 20.0, tls: tuple[Path, Path] | None = None
) -> Server:
    """Mosquitto on a free port; with `tls` (certificate, key PEM files) that port serves TLS only."""
    if not os.access(MOSQUITTO, os.X_OK):
        raise ServerError(f"{MOSQUITTO} not found (make install-system installs Debian mosquitto)")
    port = free_port()
    conf = workdir / "mosquitto.conf"
    text = MOSQUITTO_CONF.format(port=port)
    if tls is not None:
        text += MOSQUITTO_TLS_CONF.format(cert=tls[0].resolve(), key=tls[1].resolve())
    conf.write_text(text)
    proc, log_path = spawn("mosquitto", [MOSQUITTO, "-c", str(conf)], workdir, cpu)
    server = Server("mosquitto", proc, port, workdir, log_path)
    try:
        out = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True, timeout=5).stdout
        server.info["version"] = out.splitlines()[0] if out else "?"
    except (OSError, subprocess.SubprocessError):
        server.info["version"] = "?"
    server.info["config"] = str(conf)
    return wait_ready(server, lambda: tcp_ready(port), timeout)


AMQTT_CONF = """\
listeners:
  default:
    type: tcp
    bind: 127.0.0.1:{port}
    max_connections: 0
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: true
"""


def start_amqtt(workdir: Path, cpu: int | None, timeout: float = 30.0) -> Server:
    script = Path(sys.executable).parent / "amqtt"
    if not script.exists():
        raise ServerError(f"{script} not found (amqtt is a dev dependency: make install)")
    port = free_port()
    conf = workdir / "amqtt.yaml"
    conf.write_text(AMQTT_CONF.format(port=port))
    proc, log_path = spawn("amqtt", [str(script), "-c", str(conf)], workdir, cpu)
    server = Server("amqtt", proc, port, workdir, log_path)
    try:
        from importlib.metadata import version

        server.info["version"] = f"amqtt {version('amqtt')}"
    except Exception:  # noqa: BLE001
        server.info["version"] = "amqtt ?"
    server.info["config"] = str(conf)
    return wait_ready(server, lambda: tcp_ready(port), timeout)
