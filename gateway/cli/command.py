"""What a command group of the CLI is: how it adds its parsers and how it runs (gateway/cli/__init__.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

SubParsers = Any  # argparse._SubParsersAction[argparse.ArgumentParser], private to argparse


class Parents(NamedTuple):
    """Parent parsers the admin commands share: `--url`/`--json` and `--user`/`--password-stdin`."""

    common: argparse.ArgumentParser
    creds: argparse.ArgumentParser


@dataclass(frozen=True)
class CommandGroup:
    """One or more top-level commands: `add` puts their parsers on `gateway`'s subparsers, `run`
    runs the parsed command and returns the exit code. A subcommand's parser may set its own
    runner with ``set_defaults(cli_run=...)``, which wins over the group's."""

    add: Callable[[SubParsers, Parents], object]
    run: Callable[[argparse.Namespace], int]
