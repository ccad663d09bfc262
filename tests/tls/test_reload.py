"""SIGHUP reloads the certificate of every TLS listener: new connections see the new certificate;
a file that does not load keeps the previous one and says why in the log."""

from __future__ import annotations

import shutil
import signal

from tests.tls.certs import TestCa
from tests.tls.support import peer_serial, start_gateway

TLS_LISTENERS = {"mqtts": (), "amqps": (), "https": (), "grpc": ("h2",), "remoting": ()}


def serials(gw, ca: TestCa) -> dict[str, int]:  # noqa: ANN001
    return {name: peer_serial(gw.listeners[name], ca.cert, alpn) for name, alpn in TLS_LISTENERS.items()}


def test_sighup_reloads_certificates_and_keeps_them_on_a_bad_file(tmp_path):
    ca = TestCa(tmp_path / "ca")
    a, b = ca.server("a", 101), ca.server("b", 202)
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(a.cert, cert)
    shutil.copy(a.key, key)
    gw = start_gateway(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        assert serials(gw, ca) == dict.fromkeys(TLS_LISTENERS, 101)

        shutil.copy(b.cert, cert)
        shutil.copy(b.key, key)
        gw.p.send_signal(signal.SIGHUP)
        assert gw.wait_line("TLS certificate reloaded", 10), gw.output()
        assert serials(gw, ca) == dict.fromkeys(TLS_LISTENERS, 202)

        cert.write_text("not a certificate\n")
        gw.p.send_signal(signal.SIGHUP)
        line = gw.wait_line("TLS certificate not reloaded, keeping the previous one", 10)
        assert line and str(cert) in line.string, gw.output()
        assert serials(gw, ca) == dict.fromkeys(TLS_LISTENERS, 202)
        assert gw.alive()
    finally:
        assert gw.stop() == 0
