"""`gateway topic extend` and `gateway store drain|list|forget|auto-extend` (docs/cluster.md, "Logic queues
across nodes" and "Draining a store node"): the CLUSTER mode operator commands. They speak to the
store nodes the name server lists (as a proxy does: `--namesrv`, `--cluster-name`,
`--cluster-secret-file`, or the same GATEWAY_* variables), not to a proxy's HTTP port; the work is
cluster/logic_admin.py's."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from .command import CommandGroup, Parents, SubParsers


def _connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--namesrv",
        dest="admin_namesrv",
        metavar="HOST:PORT",
        default=os.environ.get("GATEWAY_NAMESRV"),
        help="name server address(es), host:port;host:port (default $GATEWAY_NAMESRV)",
    )
    p.add_argument(
        "--cluster-name",
        dest="admin_cluster",
        metavar="NAME",
        default=os.environ.get("GATEWAY_CLUSTER_NAME", "DefaultCluster"),
        help="the cluster's name (default $GATEWAY_CLUSTER_NAME or DefaultCluster)",
    )
    p.add_argument(
        "--cluster-secret-file",
        dest="admin_secret",
        metavar="FILE",
        default=os.environ.get("GATEWAY_CLUSTER_SECRET_FILE"),
        help="the cluster secret of a closed cluster (default $GATEWAY_CLUSTER_SECRET_FILE)",
    )
    p.add_argument("--json", dest="admin_json", action="store_true", help="print JSON")


def _subparsers(parser: argparse.ArgumentParser, dest: str) -> Any:
    for action in parser._actions:  # noqa: SLF001 - argparse keeps a parser's subcommands there
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action
    return parser.add_subparsers(dest=dest, metavar="{drain,list,forget}")


def add_parsers(sub: SubParsers, _parents: Parents) -> None:
    topic = _subparsers(sub.choices["topic"], "topic_command")
    p = topic.add_parser(
        "extend", help="CLUSTER mode: a topic's logical queues continue on another store node"
    )
    p.add_argument("name")
    p.add_argument("--to", required=True, metavar="STORE", help="the store node the queues continue on")
    p.add_argument(
        "--queue",
        type=int,
        action="append",
        dest="lqs",
        metavar="N",
        help="a logical queue to move (repeat; default: the node's fair share of the topic's queues)",
    )
    p.add_argument("--all", action="store_true", help="every user topic, by its fair share (NAME ignored)")
    _connection_flags(p)
    p.set_defaults(cli_run=run_extend)

    store = _subparsers(sub.choices["store"], "action")
    p = store.add_parser("drain", help="a store node takes no new writes; its consumers finish what it holds")
    p.add_argument("name")
    p.add_argument(
        "--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds until it is safe to stop"
    )
    _connection_flags(p)
    p.set_defaults(cli_run=run_drain)
    p = store.add_parser("list", help="the store nodes: role, draining, open segments, backlog, safe to stop")
    _connection_flags(p)
    p.set_defaults(cli_run=run_list)
    p = store.add_parser(
        "auto-extend", help="on: a store node that joins takes its fair share of every topic's open queues"
    )
    p.add_argument("state", choices=("on", "off"))
    _connection_flags(p)
    p.set_defaults(cli_run=run_auto_extend)
    p = store.add_parser("forget", help="drop a drained (and stopped) store node from the logic queue tables")
    p.add_argument("name")
    _connection_flags(p)
    p.set_defaults(cli_run=run_forget)


async def _with_cluster(args: argparse.Namespace, fn: Any) -> Any:
    from cluster.remote_store import ClusterStoreClient
    from remoting.cluster_auth import ClusterAuth

    if not args.admin_namesrv:
        raise SystemExit("gateway: --namesrv (or $GATEWAY_NAMESRV) is needed")
    auth = None if not args.admin_secret else ClusterAuth.from_file(args.admin_secret)
    client = ClusterStoreClient(args.admin_namesrv, args.admin_cluster, refresh_s=3600, auth=auth)
    try:
        await client.start(wait_s=5.0)
        return await fn(client)
    finally:
        await client.close()


def _call(args: argparse.Namespace, fn: Any) -> int:
    from cluster.logic_admin import AdminError

    try:
        out = asyncio.run(_with_cluster(args, fn))
    except (AdminError, ValueError, OSError) as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 1
    text = out.pop("text", None) if isinstance(out, dict) else None
    if args.admin_json or text is None:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(text)
    return 0


def run_extend(args: argparse.Namespace) -> int:
    from cluster import logic_admin as la

    async def go(c: Any) -> dict[str, Any]:
        if args.all:
            moved = await la.rebalance(c, args.to)
            return {"to": args.to, "moved": moved, "text": f"moved to {args.to}: {moved}"}
        chain = await la.extend(c, args.name, args.to, args.lqs)
        on = chain.heads_on(args.to)
        return {
            "topic": chain.topic,
            "epoch": chain.epoch,
            "queues": len(chain),
            "on": {args.to: on},
            "text": f"topic {chain.topic}: {len(chain)} queues, open on {args.to}: {on}, epoch {chain.epoch}",
        }

    return _call(args, go)


def _render(rows: list[dict[str, Any]]) -> str:
    head = f"{'NAME':<20} {'ROLE':<10} {'DRAINING':<8} {'OPEN':>5} {'BACKLOG':>8}  STATE"
    lines = [head]
    for r in rows:
        state = "safe to stop" if r["safe_to_stop"] else ("draining" if r["draining"] else "serving")
        backlog = "?" if r["backlog"] is None else str(r["backlog"])
        draining = "yes" if r["draining"] else "no"
        lines.append(
            f"{r['name']:<20} {r['role']:<10} {draining:<8} {r['open_segments']:>5} {backlog:>8}  {state}"
        )
    return "\n".join(lines)


def run_list(args: argparse.Namespace) -> int:
    from cluster import logic_admin as la

    async def go(c: Any) -> Any:
        rows = await la.nodes(c)
        return rows if args.admin_json else {"text": _render(rows)}

    return _call(args, go)


def run_drain(args: argparse.Namespace) -> int:
    from cluster import logic_admin as la

    async def go(c: Any) -> dict[str, Any]:
        t0 = time.monotonic()
        out = await la.drain(c, args.name)
        out["safe_to_stop"] = False
        text = f"store node {args.name} drains (open segments moved: {out['moved']})"
        deadline = t0 + args.wait
        while args.wait:
            row = next((r for r in await la.nodes(c) if r["name"] == args.name), None)
            if row is not None and row["safe_to_stop"]:
                out["safe_to_stop"] = True
                out["safe_after_s"] = round(time.monotonic() - t0, 3)
                text += f"\nsafe to stop after {out['safe_after_s']} s"
                break
            if time.monotonic() >= deadline:
                text += f"\nnot safe to stop yet: backlog {row and row['backlog']}"
                break
            await asyncio.sleep(0.2)
        out["text"] = text
        return out

    return _call(args, go)


def run_auto_extend(args: argparse.Namespace) -> int:
    from cluster import logic_admin as la

    async def go(c: Any) -> dict[str, Any]:
        told = await la.set_auto_extend(c, args.state == "on")
        return {
            "auto_extend": args.state == "on",
            "nodes": told,
            "text": f"auto-extend {args.state} ({len(told)} nodes)",
        }

    return _call(args, go)


def run_forget(args: argparse.Namespace) -> int:
    from cluster import logic_admin as la

    async def go(c: Any) -> dict[str, Any]:
        out = await la.forget(c, args.name)
        out["text"] = f"store node {args.name} forgotten (topics {', '.join(out['topics']) or 'none'})"
        return out

    return _call(args, go)


def _run(args: argparse.Namespace) -> int:  # every parser here sets its own cli_run
    raise SystemExit(2)


GROUP = CommandGroup(add_parsers, _run)
