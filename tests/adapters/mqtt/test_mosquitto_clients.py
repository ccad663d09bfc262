"""The Debian `mosquitto_pub` / `mosquitto_sub` command-line clients against a real `gateway start`
process: every QoS, retained messages, wills, and a persistent session that keeps what was published
while it was away, across a gateway restart. Messages are counted from the clients' output, not
trusted from exit codes. (`make install-system` installs mosquitto-clients.)"""

from __future__ import annotations

import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from conformance.streamlines import StreamLines
from tests.adapters.mqtt.support import make_cert
from tests.gateway.support import Proc, start

pytestmark = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None, reason="mosquitto-clients missing: run `make install-system`"
)
T = 20.0


class Gateway:
    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.tmp_path = tmp_path
        self.extra = extra
        self.proc: Proc | None = None
        self.port = 0
        self.listeners: dict[str, str] = {}

    def start(self) -> None:
        args = ("--protocols", "mqtt,http", "--mqtt-port", str(self.port), *self.extra)
        self.proc, self.listeners = start(self.tmp_path, *args)
        self.port = int(self.listeners["mqtt"].rsplit(":", 1)[1])

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.p.send_signal(signal.SIGTERM)
        assert self.proc.p.wait(15) == 0
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc = None


@pytest.fixture
def gw(tmp_path):
    g = Gateway(tmp_path)
    g.start()
    yield g
    g.kill()


def pub(gw: Gateway, topic: str, *args: str, port: int | None = None) -> None:
    r = subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port or gw.port), "-t", topic, *args],
        capture_output=True,
        text=True,
        timeout=T,
    )
    assert r.returncode == 0, r.stderr


class Sub:
    """A running mosquitto_sub (line-buffered through stdbuf, read on a thread); `ready()` waits
    for its SUBACK in the -d debug output."""

    def __init__(self, gw: Gateway, *args: str, port: int | None = None) -> None:
        self.p = subprocess.Popen(
            ["stdbuf", "-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", str(port or gw.port), "-d", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.p.stdout is not None
        self._out = StreamLines(self.p.stdout)
        self.lines = self._out.lines

    def ready(self) -> None:
        if self._out.wait_line("received SUBACK", T):
            return
        ended = self.p.poll() is not None
        self.p.kill()
        what = "mosquitto_sub ended before subscribing" if ended else "no SUBACK"
        pytest.fail(what + ":\n" + "\n".join(self.lines))

    def finish(self) -> list[str]:
        """Wait for the client to exit (it was given -C / -W); its message lines (`-v`: topic payload)."""
        try:
            self.p.wait(T)
        finally:
            self.p.kill()
        self._out.collect(T)
        noise = ("Client ", "Subscribed (mid")
        return [ln for ln in self.lines if not ln.startswith(noise) and ln.strip()]


def test_every_qos_end_to_end(gw):
    topic = f"cli{uuid.uuid4().hex[:6]}"
    sub = Sub(gw, "-t", f"{topic}/#", "-q", "2", "-v", "-C", "3")
    sub.ready()
    for q in ("0", "1", "2"):
        pub(gw, f"{topic}/q{q}", "-q", q, "-m", f"qos{q}")
    assert sorted(sub.finish()) == [f"{topic}/q0 qos0", f"{topic}/q1 qos1", f"{topic}/q2 qos2"]


def test_retained_message_set_and_cleared(gw):
    topic = f"ret{uuid.uuid4().hex[:6]}/state"
    pub(gw, topic, "-r", "-q", "1", "-m", "on")
    got = Sub(gw, "-t", topic, "-q", "1", "-C", "1", "-W", "10", "-F", "%r %p")
    assert got.finish() == ["1 on"]
    pub(gw, topic, "-r", "-q", "1", "-n")  # an empty retained message clears it
    empty = Sub(gw, "-t", topic, "-q", "1", "-C", "1", "-W", "2")
    assert empty.finish() == ["Timed out"]


def test_will_on_kill_not_on_clean_exit(gw):
    base = f"will{uuid.uuid4().hex[:6]}"
    watcher = Sub(gw, "-t", f"{base}/#", "-q", "1", "-v", "-C", "1", "-W", "15")
    watcher.ready()
    clean = Sub(gw, "-t", f"x{base}", "-C", "1", "--will-topic", f"{base}/clean", "--will-payload", "bye")
    clean.ready()
    pub(gw, f"x{base}", "-m", "go")  # after -C 1 message it sends DISCONNECT and exits
    assert clean.finish() == ["go"]
    killed = Sub(gw, "-t", "x/none", "--will-topic", f"{base}/killed", "--will-payload", "lost", "-q", "1")
    killed.ready()
    killed.p.kill()  # no DISCONNECT: the will must be published
    killed.p.wait(T)
    assert watcher.finish() == [f"{base}/killed lost"]


def test_persistent_session_keeps_offline_messages_across_restart(gw):
    topic = f"per{uuid.uuid4().hex[:6]}/inbox"
    cid = "mosq-" + uuid.uuid4().hex[:8]
    first = Sub(gw, "-c", "-i", cid, "-q", "1", "-t", topic, "-E")  # subscribe, then exit
    first.finish()
    assert first.p.returncode == 0
    pub(gw, topic, "-q", "1", "-m", "while-away-1")
    gw.stop()
    gw.start()  # same data directory and port
    pub(gw, topic, "-q", "1", "-m", "while-away-2")
    back = Sub(gw, "-c", "-i", cid, "-q", "1", "-t", topic, "-C", "2", "-W", "15")
    assert back.finish() == ["while-away-1", "while-away-2"]


def test_tls_listener_with_mosquitto_clients(tmp_path):
    cert, key = make_cert(tmp_path)
    gw = Gateway(tmp_path, "--tls-cert", cert, "--tls-key", key, "--mqtt-tls-port", "0", "--https-port", "0")
    gw.start()
    try:
        tls_port = int(gw.listeners["mqtts"].rsplit(":", 1)[1])
        sub = Sub(gw, "--cafile", cert, "-t", "tls/#", "-q", "1", "-v", "-C", "2", port=tls_port)
        sub.ready()
        pub(gw, "tls/a", "--cafile", cert, "-q", "1", "-m", "encrypted", port=tls_port)
        pub(gw, "tls/b", "-q", "1", "-m", "plain")  # the plain listener still works alongside
        assert sorted(sub.finish()) == ["tls/a encrypted", "tls/b plain"]
    finally:
        gw.kill()
