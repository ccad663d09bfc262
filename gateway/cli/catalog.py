"""`gateway topic|group|client ...`: topics, consumer groups and clients of a running gateway."""

from __future__ import annotations

import argparse
from typing import Any

from .admin import Stdin, admin_group_runner
from .command import CommandGroup, Parents, SubParsers


def add_parsers(sub: SubParsers, parents: Parents) -> None:
    common, creds = parents
    topic = sub.add_parser("topic", help="manage topics of a running gateway").add_subparsers(
        dest="action", required=True
    )
    p = topic.add_parser("create", parents=[common, creds], help="create (or update) a topic")
    p.add_argument("name")
    p.add_argument("--queues", type=int, metavar="N", help="number of queues (default: gateway default)")
    p.add_argument("--retention-ms", type=int, metavar="MS", help="keep messages this long")
    p.add_argument("--retention-bytes", type=int, metavar="BYTES", help="keep at most this much")
    p.add_argument(
        "--compacted",
        action="store_true",
        default=None,
        help="a compacted topic: the latest record per message key wins, an empty body deletes its key",
    )
    p = topic.add_parser(
        "update",
        parents=[common, creds],
        help="grow or shrink a topic's queues in place (no message moves; docs/store.md)",
    )
    p.add_argument("name")
    p.add_argument("--queues", type=int, metavar="N", required=True, help="queues per store from now on")
    topic.add_parser("list", parents=[common, creds], help="list topics")
    p = topic.add_parser("get", parents=[common, creds], help="a topic's queues, offsets and group backlogs")
    p.add_argument("name")
    p = topic.add_parser("delete", parents=[common, creds], help="delete a topic")
    p.add_argument("name")

    group = sub.add_parser("group", help="manage consumer groups of a running gateway").add_subparsers(
        dest="action", required=True
    )
    p = group.add_parser("create", parents=[common, creds], help="create (or update) a consumer group")
    p.add_argument("name")
    p.add_argument("--max-attempts", type=int, metavar="N", help="deliveries before the DLQ (default 16)")
    p.add_argument("--retry-initial-ms", type=int, metavar="MS", help="first retry back-off (default 1000)")
    p.add_argument("--retry-multiplier", type=float, metavar="X", help="back-off growth (default 2)")
    p.add_argument("--retry-max-ms", type=int, metavar="MS", help="back-off cap (default 60000)")
    group.add_parser("list", parents=[common, creds], help="list consumer groups with backlog")
    p = group.add_parser("get", parents=[common, creds], help="a group's settings and backlog per topic")
    p.add_argument("name")
    p = group.add_parser("delete", parents=[common, creds], help="delete a consumer group")
    p.add_argument("name")

    client = sub.add_parser("client", help="connected clients of a running gateway").add_subparsers(
        dest="action", required=True
    )
    client.add_parser("list", parents=[common, creds], help="list registered clients")


def run(args: argparse.Namespace, client: Any, stdin: Stdin) -> int:
    """One topic, group or client command; AdminError propagates."""
    from gateway import admin_client as ac

    cmd = (args.command, args.action)
    out: Any
    if cmd == ("topic", "create"):
        out = client.create_topic(
            args.name,
            queues=args.queues,
            retention_ms=args.retention_ms,
            retention_bytes=args.retention_bytes,
            compacted=args.compacted,
        )
        text = ac.render_topics([out])
    elif cmd == ("topic", "update"):
        out = client.update_topic(args.name, args.queues)
        text = ac.render_topics([out])
    elif cmd == ("topic", "list"):
        out = client.list_topics()
        text = ac.render_topics(out)
    elif cmd == ("topic", "get"):
        out = client.get_topic(args.name)
        text = ac.render_topic(out)
    elif cmd == ("topic", "delete"):
        client.delete_topic(args.name)
        out, text = {"deleted": args.name}, f"deleted topic {args.name}"
    elif cmd == ("group", "create"):
        out = client.create_group(
            args.name,
            max_attempts=args.max_attempts,
            retry_initial_ms=args.retry_initial_ms,
            retry_multiplier=args.retry_multiplier,
            retry_max_ms=args.retry_max_ms,
        )
        text = ac.render_groups([out])
    elif cmd == ("group", "list"):
        out = client.list_groups()
        text = ac.render_groups(out)
    elif cmd == ("group", "get"):
        out = client.get_group(args.name)
        text = ac.render_group(out)
    elif cmd == ("group", "delete"):
        client.delete_group(args.name)
        out, text = {"deleted": args.name}, f"deleted group {args.name}"
    elif cmd == ("client", "list"):
        out = client.list_clients()
        text = ac.render_clients(out)
    else:  # pragma: no cover - argparse only produces the commands above
        raise ac.AdminError(f"unknown command {' '.join(cmd)}")
    print(ac.dumps(out) if args.json else text)
    return 0


GROUP = CommandGroup(add_parsers, admin_group_runner(run))
