"""Commands whose parser and runner live in another package's `cli` module: `gateway namesrv`
(namesrv/cli.py), `gateway analytics` (analytics/cli.py), `gateway bridge` (bridge/cli.py).
Each is imported when the parser is built or the command runs, not with gateway.cli."""

from __future__ import annotations

import argparse

from .command import CommandGroup, Parents, SubParsers


def _add_namesrv(sub: SubParsers, _parents: Parents) -> None:
    from namesrv.cli import add_parser

    add_parser(sub)


def _namesrv(args: argparse.Namespace) -> int:
    from namesrv.cli import run

    return run(args)


def _add_analytics(sub: SubParsers, _parents: Parents) -> None:
    from analytics.cli import add_parser

    add_parser(sub)


def _analytics(args: argparse.Namespace) -> int:
    from analytics.cli import run

    return run(args)


def _add_bridge(sub: SubParsers, _parents: Parents) -> None:
    from bridge.cli import add_parser

    add_parser(sub)


def _bridge(args: argparse.Namespace) -> int:
    from bridge.cli import run

    return run(args)


NAMESRV = CommandGroup(_add_namesrv, _namesrv)
ANALYTICS = CommandGroup(_add_analytics, _analytics)
BRIDGE = CommandGroup(_add_bridge, _bridge)
