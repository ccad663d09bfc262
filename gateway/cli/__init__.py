"""Command line entry point (`gateway ...`, `python -m gateway.cli ...`).

``gateway start [--config FILE] [--data-dir DIR] [--host ADDR] [--grpc-port N] ... [--flush P]``
serves until SIGTERM/SIGINT (``--mode cluster --namesrv H:P``: as a stateless proxy over store
nodes). ``gateway store --name NAME --data-dir DIR --port N --namesrv H:P`` runs a CLUSTER mode
store node (docs/cluster.md). ``gateway topic|group|client|user|token|acl ...`` talk to a
running gateway's HTTP admin API (``--url``, default ``$GATEWAY_URL`` or http://127.0.0.1:8082;
credentials as CREDENTIALS_HELP says).

One module per command group, each ending in a ``CommandGroup`` (gateway/cli/command.py): its
``add(sub, parents)`` puts the group's parsers on ``gateway``'s subparsers (``parents`` are the
admin commands' ``--url``/``--json`` and ``--user``/``--password-stdin`` parent parsers), its
``run(args)`` runs one parsed command of the group and returns the exit code. **Adding a command
group is one line**: write ``gateway/<yours>.py`` (or ``gateway/cli/<yours>.py``) ending in
``GROUP = CommandGroup(add_parsers, run)`` and append ``yours.GROUP`` to ``GROUPS`` below; the
commands are listed in ``gateway --help`` in that order. An admin command's ``run`` is usually
``admin.admin_group_runner(fn)``, where ``fn(args, client, stdin)`` gets an ``AdminClient`` of
``--url`` with the credentials, and any ``AdminError`` it raises is printed as exit 1. To add
subcommands to a command another group made (``gateway store drain``), a later group's ``add``
takes that command's parser from ``sub.choices["store"]`` and gives each subcommand parser it adds
its own runner with ``set_defaults(cli_run=fn)``, which wins over the group's."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import admin, catalog, elsewhere, messages, security, serve, store_nodes
from .admin import CREDENTIALS_HELP
from .command import CommandGroup
from .serve import settings_from_args

# The command groups, in `gateway --help` order: one line each.
GROUPS: tuple[CommandGroup, ...] = (
    serve.START,
    serve.STORE,
    elsewhere.NAMESRV,
    elsewhere.ANALYTICS,
    elsewhere.BRIDGE,
    catalog.GROUP,
    security.GROUP,
    messages.GROUP,
    store_nodes.GROUP,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway", description="Multi-protocol messaging gateway.", epilog=CREDENTIALS_HELP
    )
    admin.add_global_credentials(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    parents = admin.parents()
    for group in GROUPS:
        known = set(sub.choices)
        group.add(sub, parents)
        for name in sub.choices.keys() - known:
            sub.choices[name].set_defaults(cli_run=group.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `--workers`: what each worker is given
    return args.cli_run(args)


__all__ = ["GROUPS", "CommandGroup", "build_parser", "main", "settings_from_args"]
