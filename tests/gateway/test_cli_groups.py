"""The CLI's command groups (gateway/cli/__init__.py): a group added to GROUPS is parsed and run,
and a later group can add a subcommand to an earlier group's command (``gateway store drain``)
without changing how that command parses on its own."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

import gateway.cli as cli
from gateway.cli import CommandGroup, build_parser


def _add_hello(sub, parents):
    p = sub.add_parser("hello", parents=[parents.common], help="say hello")
    p.add_argument("name")


def _add_store_drain(sub, parents):
    store = sub.choices["store"]  # (its subcommands so far, gateway/cli/store_nodes.py's, or new ones)
    subs = next((a for a in store._actions if isinstance(a, argparse._SubParsersAction)), None)
    drain = (subs or store.add_subparsers(dest="action")).add_parser("drain-test", parents=[parents.common])
    drain.add_argument("--node", required=True)
    drain.set_defaults(cli_run=lambda args: 40 + len(args.node))


@pytest.fixture
def extra_groups(monkeypatch):
    hello = CommandGroup(_add_hello, lambda args: 7 if args.name == "you" else 8)
    monkeypatch.setattr(cli, "GROUPS", (*cli.GROUPS, hello, CommandGroup(_add_store_drain, lambda a: 99)))


def test_a_registered_group_parses_and_runs(extra_groups):
    assert cli.main(["hello", "you"]) == 7
    assert cli.main(["hello", "me", "--json"]) == 8


def test_a_later_group_adds_a_subcommand_to_an_earlier_command(extra_groups):
    assert cli.main(["store", "drain-test", "--node", "n1"]) == 42
    args = build_parser().parse_args(["store", "--port", "10911", "--name", "s1"])
    assert (args.command, args.store_port, args.store_name, args.action) == ("store", 10911, "s1", None)
    assert args.cli_run is cli.serve.store


def test_every_command_of_the_help_has_a_runner():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert list(sub.choices) == [
        "start", "store", "namesrv", "analytics", "bridge", "topic", "group", "client",
        "user", "token", "acl", "message", "dlq",
    ]  # fmt: skip
    assert all(callable(p.get_default("cli_run")) for p in sub.choices.values())


def test_python_m_gateway_cli_is_the_gateway_command():
    r = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "topic", "list", "--url", "http://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.startswith("gateway: cannot reach the gateway at http://127.0.0.1:1")
