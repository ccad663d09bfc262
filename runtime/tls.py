"""The server TLS material of every listener (`--tls-cert`, `--tls-key`, `--tls-client-ca`): one
`ServerTls` loads the files, hands each listener its own `ssl.SSLContext`, and on `reload()`
(SIGHUP) loads the files again into those same context objects, so that new handshakes use the new
certificate while the servers keep the context they were started with. A file that does not load
keeps the previous certificate. The PEM bytes and a `generation` counter are kept for gRPC, whose
servers take certificates as bytes (adapters/grpc/server.py). Imports nothing from the project."""

from __future__ import annotations

import logging
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

_PEM_KEY = re.compile(
    rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----.+?-----END (?:[A-Z]+ )?PRIVATE KEY-----\s*", re.S
)
TLS_RECORD_HANDSHAKE = 0x16  # the first byte of a ClientHello record


class TlsError(Exception):
    """A certificate, key or CA file that cannot be read or does not load; one-line reason."""


@dataclass(frozen=True)
class TlsFiles:
    """Where the server certificate lives and how clients are verified."""

    cert: str  # PEM certificate chain
    key: str | None = None  # PEM private key (None: inside the cert file)
    client_ca: str | None = None  # PEM CA(s) client certificates are verified against (asked for)
    require_client_cert: bool = False  # refuse a handshake without a verified client certificate


@dataclass(frozen=True)
class CertPair:
    """One loaded certificate chain and its private key, as PEM bytes."""

    chain: bytes
    key: bytes


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise TlsError(f"cannot read the TLS {what} {path}: {e.strerror or e}") from e


def _context(files: TlsFiles) -> ssl.SSLContext:
    """A fresh server context with the certificate and the client verification of `files`."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"cannot load the TLS certificate {files.cert}: {e}") from e
    if files.client_ca is not None:
        try:
            ctx.load_verify_locations(files.client_ca)
        except (OSError, ssl.SSLError) as e:
            raise TlsError(f"cannot load the TLS client CA {files.client_ca}: {e}") from e
        ctx.verify_mode = ssl.CERT_REQUIRED if files.require_client_cert else ssl.CERT_OPTIONAL
    elif files.require_client_cert:
        raise TlsError("require_client_cert needs a client CA to verify certificates against")
    return ctx


def _pair(files: TlsFiles) -> CertPair:
    chain = _read(files.cert, "certificate")
    keyfile = _read(files.key, "key") if files.key is not None else chain
    m = _PEM_KEY.search(keyfile)
    if m is None:
        raise TlsError(f"no PEM private key in {files.key or files.cert}")
    return CertPair(chain, m.group(0))


class ServerTls:
    """The loaded TLS material; `context()` for each TLS listener, `reload()` on SIGHUP.
    Raises TlsError when the files do not load."""

    def __init__(self, files: TlsFiles, log: logging.Logger | None = None) -> None:
        self.files = files
        self.log = log or logging.getLogger("tls")
        _context(files)  # fails here, with a reason, rather than in a listener
        self.pair = _pair(files)
        self.client_ca = _read(files.client_ca, "client CA") if files.client_ca else None
        self.generation = 0  # bumped by every successful reload
        self._contexts: list[ssl.SSLContext] = []

    @property
    def verifies_clients(self) -> bool:
        return self.files.client_ca is not None

    def context(self, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
        """A server context for one listener, kept up to date by `reload()`."""
        ctx = _context(self.files)
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        self._contexts.append(ctx)
        return ctx

    def reload(self) -> bool:
        """Load the files again; on success every context made by `context()` serves the new
        certificate to new connections. On failure the previous certificate stays (logged)."""
        try:
            _context(self.files)  # all of it loads, or nothing changes
            pair = _pair(self.files)
            for ctx in self._contexts:
                ctx.load_cert_chain(self.files.cert, self.files.key)
        except (TlsError, OSError, ssl.SSLError) as e:
            self.log.warning("TLS certificate not reloaded, keeping the previous one: %s", e)
            return False
        self.pair = pair
        self.generation += 1
        self.log.info("TLS certificate reloaded from %s", self.files.cert)
        return True


def client_context(ca: str | None = None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A client context for the cluster's own connections (docs/security.md, "Closed cluster"):
    the server's certificate is verified against `ca` (None: the system store) and its host name
    or IP address; `cert` (and `key`) is presented when the server asks for a client certificate.
    TlsError when a file does not load."""
    try:
        ctx = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"cannot load the cluster TLS CA {ca}: {e}") from e
    if cert is not None:
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            raise TlsError(f"cannot load the TLS certificate {cert}: {e}") from e
    return ctx


def peer_common_name(cert: dict | None) -> str | None:
    """The subject CN of a verified peer certificate (`SSLObject.getpeercert()`), or None."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
