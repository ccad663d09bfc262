"""`gateway message get|find|trace` and `gateway dlq list|redrive`: the message browser API."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .admin import Stdin, admin_group_runner
from .command import CommandGroup, Parents, SubParsers


def add_parsers(sub: SubParsers, parents: Parents) -> None:
    """`gateway message get|find|trace` and `gateway dlq list|redrive` (the message browser API)."""
    common, creds = parents
    message = sub.add_parser("message", help="read, find and trace messages of a running gateway")
    messages = message.add_subparsers(dest="action", required=True)
    p = messages.add_parser("get", parents=[common, creds], help="messages of a topic by queue and offset")
    p.add_argument("topic")
    p.add_argument("--offset", type=int, metavar="N", help="first queue offset (default: each queue's min)")
    p.add_argument("--queue", type=int, metavar="Q", help="one queue (default: every queue)")
    p.add_argument("--count", type=int, metavar="C", help="at most this many messages (default 20)")
    p.add_argument("--format", choices=("text", "json", "hex"), default="text", help="how to print bodies")
    p = messages.add_parser("find", parents=[common, creds], help="messages by key (or by --id)")
    p.add_argument("--key", metavar="K", help="a message key")
    p.add_argument("--id", metavar="ID", help="a message id")
    p.add_argument("--format", choices=("text", "json", "hex"), default="text", help="how to print bodies")
    p = messages.add_parser("trace", parents=[common, creds], help="a message's lifecycle as a timeline")
    p.add_argument("id")
    dlq = sub.add_parser("dlq", help="dead letters of a consumer group").add_subparsers(
        dest="action", required=True
    )
    p = dlq.add_parser("list", parents=[common, creds], help="a group's dead letters, oldest first")
    p.add_argument("group")
    p.add_argument("--count", type=int, metavar="C", help="at most this many (default 100)")
    p.add_argument("--pending", action="store_true", help="only those not redriven yet")
    p = dlq.add_parser(
        "redrive", parents=[common, creds], help="send dead letters back to their topic (each at most once)"
    )
    p.add_argument("group")
    p.add_argument("--ids", nargs="+", metavar="ID", help="these dead letters (default: every pending one)")


def run(args: argparse.Namespace, client: Any, stdin: Stdin) -> int:
    """`gateway message|dlq ...`; AdminError propagates. A redrive draws its progress on stderr."""
    from gateway import admin_client as ac

    cmd = (args.command, args.action)
    out: Any
    if cmd == ("message", "get"):
        out = client.browse(args.topic, args.offset, args.queue, args.count)
        text = ac.render_messages(out, args.format)
    elif cmd == ("message", "find"):
        if (args.key is None) == (args.id is None):
            raise ac.AdminError("give one of --key K or --id ID")
        out = client.find_messages(args.key) if args.key is not None else client.get_message(args.id)
        text = ac.render_messages(out, args.format)
    elif cmd == ("message", "trace"):
        out = client.trace(args.id)
        text = ac.render_trace(out)
    elif cmd == ("dlq", "list"):
        out = client.dead_letters(args.group, args.count, pending=args.pending)
        text = ac.render_dead_letters(out)
    elif cmd == ("dlq", "redrive"):
        drawn = False

        def progress(done: int, total: int) -> None:  # a bar for redrives of more than one request
            nonlocal drawn
            if total > ac.REDRIVE_CHUNK:
                print("\r" + ac.progress_bar(done, total), end="", file=sys.stderr, flush=True)
                drawn = True

        out = client.redrive_in_chunks(args.group, args.ids, progress)
        if drawn:
            print(file=sys.stderr)
        text = f"redrove {out['redriven']} dead letter(s) of {args.group}"
    else:  # pragma: no cover - argparse only produces the commands above
        raise ac.AdminError(f"unknown command {' '.join(cmd)}")
    print(ac.dumps(out) if args.json else text)
    return 0


GROUP = CommandGroup(add_parsers, admin_group_runner(run))
