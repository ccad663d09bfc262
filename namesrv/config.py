"""Name server settings, layered like the gateway's: defaults < TOML file < GATEWAY_NAMESRV_* env <
flags of `gateway namesrv`. A TOML file may hold the keys at top level or in a [namesrv] table.
`cluster_secret_file` and the TLS files also come from GATEWAY_CLUSTER_SECRET_FILE, GATEWAY_TLS_CERT,
GATEWAY_TLS_KEY and GATEWAY_TLS_CLIENT_CA (one variable for every process of a cluster) when the
GATEWAY_NAMESRV_* one is not set."""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime import EVENT_LOOPS, LOG_LEVELS, ConfigError

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
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"host must be a non-empty string, got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be an integer in [0, 65535], got {self.port!r}")
        for name in ("lease_period_s", "lease_expiry_s", "scan_interval_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 86400:
                raise ConfigError(f"{name} must be a number of seconds in (0, 86400], got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.lease_expiry_s < self.lease_period_s:
            raise ConfigError(
                f"lease_expiry_s ({self.lease_expiry_s:g}) must not be shorter than lease_period_s "
                f"({self.lease_period_s:g})"
            )
        for name in ("cluster_secret_file", "tls_cert", "tls_key", "tls_client_ca"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} must be a file path, got {value!r}")
        if not isinstance(self.tls_require_client_cert, bool):
            v = self.tls_require_client_cert
            raise ConfigError(f"tls_require_client_cert must be true or false, got {v!r}")
        for name in ("tls_key", "tls_client_ca", "tls_require_client_cert"):
            if getattr(self, name) not in (None, False) and self.tls_cert is None:
                raise ConfigError(f"{name} needs tls_cert")
        if self.tls_require_client_cert and self.tls_client_ca is None:
            raise ConfigError("tls_require_client_cert needs tls_client_ca")
        if self.event_loop not in EVENT_LOOPS:
            raise ConfigError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}, got {self.event_loop!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")


FIELDS = tuple(f.name for f in dataclasses.fields(NamesrvSettings))
_TYPES = {f.name: f.type for f in dataclasses.fields(NamesrvSettings)}


def _from_text(name: str, text: str, source: str) -> Any:
    kind = _TYPES[name]
    try:
        if kind == "int":
            return int(text.strip())
        if kind == "float":
            return float(text.strip())
        if kind == "bool":
            if text.strip().lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError
            return text.strip().lower() in ("1", "true", "yes", "on")
    except ValueError:
        what = "boolean" if kind == "bool" else "number"
        raise ConfigError(f"{source} must be a {what}, got {text!r}") from None
    return text


def load(
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    toml_path: str | Path | None = None,
) -> NamesrvSettings:
    values: dict[str, Any] = {}
    if toml_path is not None:
        try:
            with open(toml_path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as e:
            raise ConfigError(f"cannot read config file {toml_path}: {e.strerror or e}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"invalid TOML in {toml_path}: {e}") from e
        data = data.get("namesrv", data)
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise ConfigError(f"unknown key(s) in {toml_path}: {', '.join(unknown)}")
        values.update(data)
    for name in FIELDS:
        var = ENV_PREFIX + name.upper()
        if env and env.get(var):
            values[name] = _from_text(name, env[var], var)
    for name in ("cluster_secret_file", "tls_cert", "tls_key", "tls_client_ca"):
        shared = "GATEWAY_" + name.upper()
        if env and env.get(shared) and not env.get(ENV_PREFIX + name.upper()):
            values[name] = env[shared]
    for k, v in (overrides or {}).items():
        if k not in FIELDS:
            raise ConfigError(f"unknown setting {k!r}")
        if v is not None:
            values[k] = v
    return NamesrvSettings(**values)
