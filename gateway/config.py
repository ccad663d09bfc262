"""Gateway settings, layered in rising precedence: defaults < TOML file < GATEWAY_* env < CLI flags."""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLUSH_POLICIES = ("sync", "async")
ENV_PREFIX = "GATEWAY_"


class ConfigError(ValueError):
    """Raised for an unreadable config file, an unknown key or an invalid value."""


@dataclass(frozen=True)
class Settings:
    data_dir: str = "./data"
    host: str = "127.0.0.1"
    flush: str = "sync"

    def __post_init__(self) -> None:
        if self.flush not in FLUSH_POLICIES:
            raise ConfigError(f"flush must be one of {', '.join(FLUSH_POLICIES)}, got {self.flush!r}")
        for name in ("data_dir", "host"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a non-empty string, got {value!r}")


FIELDS = tuple(f.name for f in dataclasses.fields(Settings))
# Environment variables read by load(): GATEWAY_DATA_DIR, GATEWAY_HOST, GATEWAY_FLUSH.
ENV_VARS = {ENV_PREFIX + name.upper(): name for name in FIELDS}


def _from_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML in {path}: {exc}") from exc
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown key(s) in {path}: {', '.join(unknown)}")
    return data


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    # An empty variable counts as unset, so `GATEWAY_HOST= gateway start` falls back to lower layers.
    return {field: env[var] for var, field in ENV_VARS.items() if env.get(var)}


def load(
    argv_overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    toml_path: str | Path | None = None,
) -> Settings:
    """Build Settings from defaults, then the TOML file, then env vars, then flag overrides.

    ``argv_overrides`` maps field names to values; ``None`` values mean "flag not given".
    ``env`` is usually ``os.environ``; only ``GATEWAY_*`` variables are read.
    """
    values: dict[str, Any] = {}
    if toml_path is not None:
        values.update(_from_toml(toml_path))
    if env is not None:
        values.update(_from_env(env))
    for key, value in (argv_overrides or {}).items():
        if key not in FIELDS:
            raise ConfigError(f"unknown setting {key!r}")
        if value is not None:
            values[key] = value
    return Settings(**values)
