"""Test certificates, made with the openssl CLI at test time (never committed): a CA, server
certificates for 127.0.0.1/localhost with chosen serial numbers, client certificates with a CN."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


_NEW_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class Issued:
    cert: str
    key: str
    serial: int


class TestCa:
    """A CA in `directory`; `server(name, serial)` and `client(cn)` issue leaf certificates."""

    __test__ = False  # not a test class

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert = str(self.dir / "ca.pem")
        self.key = str(self.dir / "ca.key")
        _openssl("req", "-x509", *_NEW_EC_KEY, "-days", "2", "-keyout", self.key, "-out", self.cert,
                 "-subj", "/CN=gateway test CA")  # fmt: skip

    def _issue(self, name: str, subject: str, serial: int, ext: str) -> Issued:
        key, csr, cert = (str(self.dir / f"{name}.{s}") for s in ("key", "csr", "pem"))
        extfile = self.dir / f"{name}.ext"
        extfile.write_text(ext)
        _openssl("req", *_NEW_EC_KEY, "-keyout", key, "-out", csr, "-subj", subject)
        _openssl("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key, "-set_serial",
                 str(serial), "-days", "2", "-out", cert, "-extfile", str(extfile))  # fmt: skip
        return Issued(cert, key, serial)

    def server(self, name: str, serial: int) -> Issued:
        ext = (
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
            "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
        )
        return self._issue(name, "/CN=localhost", serial, ext)

    def client(self, cn: str, serial: int = 1000) -> Issued:
        ext = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n"
        return self._issue(f"client-{cn}", f"/CN={cn}", serial, ext)
