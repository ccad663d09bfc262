"""The settings plumbing of every process (`gateway start`, `gateway store`, `gateway namesrv`).

Settings are a frozen dataclass, layered in rising precedence: defaults < a TOML file < environment
variables (``<PREFIX><NAME>``; an empty one counts as unset) < command-line flags (None: not
given). This module holds what those layers share: reading the TOML file, converting a variable's
text to a field's type, laying flags over the rest, the checks both kinds of settings make
(``check_*``, each a ConfigError naming the field), the flags of a table, and running a process
with its settings (a ConfigError is exit 2). Imports nothing from the project."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import tomllib
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from runtime import EVENT_LOOPS, LOG_LEVELS, ConfigError, loop_factory, setup_logging

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def field_types(cls: type) -> dict[str, str]:
    """{field: its annotation's text} of a settings dataclass (``from __future__ import annotations``)."""
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def load_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file's contents; ConfigError when it cannot be read or parsed."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML in {path}: {exc}") from exc


def read_toml(path: str | Path, known: Collection[str], table: str | None = None) -> dict[str, Any]:
    """The keys of a TOML file (those of its ``[table]`` when it has one); ConfigError when the file
    cannot be read or parsed or holds a key not in `known`."""
    data = load_toml(path)
    if table is not None:
        data = data.get(table, data)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"unknown key(s) in {path}: {', '.join(unknown)}")
    return data


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError(f"expected true/false/1/0, got {text!r}")


def from_text(kind: str, text: str, source: str) -> Any:
    """An environment variable's text as a field of type `kind` ("int", "float", "bool"; any other
    stays text); ConfigError naming `source` when it does not parse."""
    try:
        if kind == "int":
            return int(text.strip())
        if kind == "float":
            return float(text.strip())
        if kind == "bool":
            return parse_bool(text)
    except ValueError:
        want = {"int": "an integer", "float": "a number", "bool": "true/false/1/0"}[kind]
        raise ConfigError(f"{source} must be {want}, got {text!r}") from None
    return text


def from_env(
    env: Mapping[str, str], variables: Mapping[str, str], types: Mapping[str, str]
) -> dict[str, Any]:
    """{field: value} of the set variables of `variables` ({variable: field}); an empty one is unset."""
    return {field: from_text(types[field], env[var], var) for var, field in variables.items() if env.get(var)}


def overlay(values: dict[str, Any], overrides: Mapping[str, Any] | None, fields: Collection[str]) -> None:
    """Lay flag values over `values`: None means "flag not given"; a name not in `fields` is a ConfigError."""
    for key, value in (overrides or {}).items():
        if key not in fields:
            raise ConfigError(f"unknown setting {key!r}")
        if value is not None:
            values[key] = value


def check_choices(obj: object, choices: Iterable[tuple[str, Collection[str]]]) -> None:
    for name, allowed in choices:
        if getattr(obj, name) not in allowed:
            raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {getattr(obj, name)!r}")


def check_int(name: str, value: Any, lo: int, hi: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ConfigError(f"{name} must be {bound}, got {value}")


def check_bools(obj: object, names: Iterable[str]) -> None:
    for name in names:
        if not isinstance(getattr(obj, name), bool):
            raise ConfigError(f"{name} must be true or false, got {getattr(obj, name)!r}")


def check_strings(obj: object, names: Iterable[str], *, optional: bool = False) -> None:
    """Each field a non-empty string (or None, when `optional`)."""
    for name in names:
        value = getattr(obj, name)
        if (value is not None or not optional) and (not isinstance(value, str) or not value):
            raise ConfigError(f"{name} must be a non-empty string, got {value!r}")


def check_file_paths(obj: object, names: Iterable[str]) -> None:
    """Each field None or a file path (a non-empty string)."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{name} must be a file path, got {value!r}")


def check_needs(obj: object, names: Iterable[str], needed: str) -> None:
    """Each field unset (None or False) unless `needed` is set: "tls_key needs tls_cert"."""
    for name in names:
        if getattr(obj, name) not in (None, False) and getattr(obj, needed) is None:
            raise ConfigError(f"{name} needs {needed}")


def check_leases(obj: Any, names: Iterable[str]) -> None:
    """The lease periods (`lease_period_s`, `lease_expiry_s`, and `names`): numbers of seconds in
    (0, 86400], stored as floats; an expiry shorter than the period is a ConfigError."""
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 86400:
            raise ConfigError(f"{name} must be a number of seconds in (0, 86400], got {v!r}")
        object.__setattr__(obj, name, float(v))
    period, expiry = obj.lease_period_s, obj.lease_expiry_s
    if expiry < period:
        raise ConfigError(f"lease_expiry_s ({expiry:g}) must not be shorter than lease_period_s ({period:g})")


# The flags every process spells alike (`gateway start`, `gateway store`, `gateway namesrv`): the
# event loop, the log level, and a TLS listener's key and client CA.
SHARED_FLAGS: dict[str, dict[str, Any]] = {
    "event_loop": {"choices": EVENT_LOOPS, "help": "asyncio event loop (default uvloop)"},
    "log_level": {"choices": LOG_LEVELS, "help": "log level (default info)"},
    "tls_key": {"metavar": "PEM", "help": "private key of --tls-cert (default: inside the cert file)"},
    "tls_client_ca": {"metavar": "PEM", "help": "CA to ask for and verify client certificates with"},
}


def _arg_type(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a parser so that argparse reports its ConfigError/ValueError as a usage error."""

    def parse(text: str) -> Any:
        try:
            return fn(text)
        except (ConfigError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = getattr(fn, "__name__", "value")
    return parse


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[tuple[str, str, Mapping[str, Any]]]) -> None:
    """``--flag-name`` for each (flag, settings field, argparse options), default None ("not
    given", see `overlay`); a `type` other than int and float reports its errors as usage errors."""
    for flag, field, opts in flags:
        opts = dict(opts)
        if "type" in opts and opts["type"] is not int and opts["type"] is not float:
            opts["type"] = _arg_type(opts["type"])
        parser.add_argument("--" + flag.replace("_", "-"), dest=field, default=None, **opts)


class Process(NamedTuple):
    """What `serve` runs: the log level and event loop of its settings, the coroutine function that
    serves until the process should exit (its exit code), and the tag of its log lines (see
    `setup_logging`)."""

    log_level: str
    event_loop: str
    main: Callable[[], Coroutine[Any, Any, int]]
    log_tag: str | None = None


def serve(prepare: Callable[[], Process], log: logging.Logger) -> int:
    """Run a process: `prepare` reads and checks its settings (a ConfigError is printed: exit 2),
    then the log setup, then its `main` on the settings' event loop until it returns the exit code."""
    try:
        process = prepare()
    except ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    setup_logging(process.log_level, process.log_tag)
    with asyncio.Runner(loop_factory=loop_factory(process.event_loop, log)) as runner:
        return runner.run(process.main())
