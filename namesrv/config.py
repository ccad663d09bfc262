"""Name server settings, layered like the gateway's: defaults < TOML file < GATEWAY_NAMESRV_* env <
flags of `gateway namesrv`. A TOML file may hold the keys at top level or in a [namesrv] table.
`cluster_secret_file` and the TLS files also come from GATEWAY_CLUSTER_SECRET_FILE, GATEWAY_TLS_CERT,
GATEWAY_TLS_KEY and GATEWAY_TLS_CLIENT_CA (one variable for every process of a cluster) when the
GATEWAY_NAMESRV_* one is not set."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime import EVENT_LOOPS, LOG_LEVELS
from runtime import settings as shared

ENV_PREFIX = "GATEWAY_NAMESRV_"


@dataclass(frozen=True)
class NamesrvSettings:
    host: str = "127.0.0.1"
    port: int = 9876
    lease_period_s: float = 30.0  # how often registrants should renew (told in register replies)
    lease_expiry_s: float = 120.0  # a registration not renewed for this long is dropped
    scan_interval_s: float = 5.0  # how often leases are checked
    # the cluster secret (remoting/cluster_auth.py): every connection authenticates with it first
    cluster_secret_file: str | None = None
    # TLS on the port (TLS only; docs/security.md, "Closed cluster"), as the gateway's --tls-* settings
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    tls_require_client_cert: bool = False
    event_loop: str = "uvloop"
    log_level: str = "info"

    def __post_init__(self) -> None:
        shared.check_strings(self, ("host",))
        shared.check_int("port", self.port, 0, 65535)
        shared.check_leases(self, ("lease_period_s", "lease_expiry_s", "scan_interval_s"))
        shared.check_file_paths(self, ("cluster_secret_file", "tls_cert", "tls_key", "tls_client_ca"))
        shared.check_bools(self, ("tls_require_client_cert",))
        shared.check_needs(self, ("tls_key", "tls_client_ca", "tls_require_client_cert"), "tls_cert")
        shared.check_needs(self, ("tls_require_client_cert",), "tls_client_ca")
        shared.check_choices(self, (("event_loop", EVENT_LOOPS), ("log_level", LOG_LEVELS)))


FIELDS = tuple(shared.field_types(NamesrvSettings))
_TYPES = shared.field_types(NamesrvSettings)
# GATEWAY_NAMESRV_HOST, ...; the secret and TLS files also from the variable every process reads
ENV_VARS = {ENV_PREFIX + name.upper(): name for name in FIELDS}
SHARED_VARS = {
    "GATEWAY_" + name.upper(): name
    for name in ("cluster_secret_file", "tls_cert", "tls_key", "tls_client_ca")
}


def load(
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    toml_path: str | Path | None = None,
) -> NamesrvSettings:
    values: dict[str, Any] = {}
    if toml_path is not None:
        values.update(shared.read_toml(toml_path, FIELDS, table="namesrv"))
    if env:
        values.update(shared.from_env(env, ENV_VARS, _TYPES))
        common = shared.from_env(env, SHARED_VARS, _TYPES)
        values.update({k: v for k, v in common.items() if not env.get(ENV_PREFIX + k.upper())})
    shared.overlay(values, overrides, FIELDS)
    return NamesrvSettings(**values)
