"""`gateway user|token|acl ...`: users, API tokens and ACL rules through the admin API (docs/security.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .admin import CREDENTIALS_HELP, Stdin, admin_group_runner
from .command import CommandGroup, Parents, SubParsers


def add_parsers(sub: SubParsers, parents: Parents) -> None:
    """`gateway user|token|acl ...`: identities and ACL rules through the admin API."""
    common, creds = parents
    user = sub.add_parser("user", help="users of a running gateway (auth on)", epilog=CREDENTIALS_HELP)
    users = user.add_subparsers(dest="action", required=True)
    p = users.add_parser(
        "add",
        parents=[common],
        help="create a user",
        epilog="With both --password-stdin and --secret-key-stdin, stdin holds two lines: the password, "
        "then the secret key (after the admin's password when that comes from stdin too). "
        + CREDENTIALS_HELP,
    )
    p.add_argument("name")
    p.add_argument("--password-stdin", action="store_true", help="read the new user's password from stdin")
    p.add_argument("--role", choices=("admin", "user"), default="user", help="default user")
    p.add_argument("--access-key", metavar="AK", help="RocketMQ AccessKey (needs --secret-key-stdin)")
    p.add_argument("--secret-key-stdin", action="store_true", help="read the SecretKey from stdin")
    p.add_argument("--vhosts", metavar="LIST", help="AMQP virtual hosts the user may open (default /)")
    users.add_parser("list", parents=[common, creds], help="list users (never passwords or secrets)")
    p = users.add_parser(
        "passwd",
        parents=[common],
        help="set a user's password",
        epilog="The new password is the last line read from stdin. " + CREDENTIALS_HELP,
    )
    p.add_argument("name")
    p.add_argument("--password-stdin", action="store_true", required=True, help="read it from stdin")
    p = users.add_parser("delete", parents=[common, creds], help="delete a user and its tokens")
    p.add_argument("name")

    token = sub.add_parser("token", help="API tokens (HTTP Bearer)", epilog=CREDENTIALS_HELP)
    tokens = token.add_subparsers(dest="action", required=True)
    p = tokens.add_parser(
        "create",
        parents=[common],
        help="create a token; its text is printed this once",
        epilog=CREDENTIALS_HELP,
    )
    p.add_argument("name", help="what the token is for")
    p.add_argument("--user", help="whose token (default: the user running the command)")
    tokens.add_parser("list", parents=[common, creds], help="list tokens (never their text)")
    p = tokens.add_parser("revoke", parents=[common, creds], help="revoke a token")
    p.add_argument("id")

    acl = sub.add_parser("acl", help="ACL rules (docs/security.md)", epilog=CREDENTIALS_HELP)
    rules = acl.add_subparsers(dest="action", required=True)
    p = rules.add_parser(
        "add",
        parents=[common],
        help="add a rule: a deny that matches wins over an allow",
        epilog="Patterns use MQTT syntax (+, #) with %%u (user name) and %%c (client id). "
        + CREDENTIALS_HELP,
    )
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", metavar="NAME", help="the rule is for this user")
    who.add_argument("--role", choices=("admin", "user"), help="the rule is for every user of this role")
    who.add_argument("--anyone", action="store_true", help="the rule is for every authenticated user")
    who.add_argument(
        "--anonymous",
        action="store_true",
        help="the rule is for clients without credentials (--allow-anonymous)",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--topic", metavar="PATTERN", help="topic paths (devices/%%u/#)")
    what.add_argument("--group", metavar="PATTERN", help="consumer group names")
    p.add_argument("--actions", required=True, metavar="LIST", help="comma list of publish,subscribe,admin")
    p.add_argument("--deny", action="store_true", help="deny instead of allow")
    rules.add_parser("list", parents=[common, creds], help="list rules")
    p = rules.add_parser("delete", parents=[common, creds], help="delete a rule")
    p.add_argument("id")
    rules.add_parser("export", parents=[common, creds], help="print the policy (users, rules) as TOML")
    p = rules.add_parser("import", parents=[common, creds], help="apply a policy file (TOML)")
    p.add_argument("file", help="the policy file ('-': stdin)")
    p.add_argument(
        "--merge", action="store_true", help="keep stored rules the file lacks (default: remove them)"
    )


def run(args: argparse.Namespace, client: Any, stdin: Stdin) -> int:
    """`gateway user|token|acl ...`; AdminError propagates."""
    from gateway import admin_client as ac

    cmd = (args.command, args.action)
    out: Any
    if cmd == ("user", "add"):
        if (args.access_key is None) != (not args.secret_key_stdin):
            raise ac.AdminError("--access-key and --secret-key-stdin go together")
        password = stdin.line(f"password of {args.name}") if args.password_stdin else None
        secret = stdin.line(f"secret key of {args.name}") if args.secret_key_stdin else None
        vhosts = [v.strip() for v in args.vhosts.split(",") if v.strip()] if args.vhosts else None
        out = client.add_user(
            args.name,
            password=password,
            role=args.role,
            access_key=args.access_key,
            secret_key=secret,
            vhosts=vhosts,
        )
        text = ac.render_users([out])
    elif cmd == ("user", "list"):
        out = client.list_users()
        text = ac.render_users(out)
    elif cmd == ("user", "passwd"):
        client.set_password(args.name, stdin.line(f"new password of {args.name}"))
        out, text = {"user": args.name, "password": True}, f"password of {args.name} set"
    elif cmd == ("user", "delete"):
        client.delete_user(args.name)
        out, text = {"deleted": args.name}, f"deleted user {args.name}"
    elif cmd == ("token", "create"):
        out = client.create_token(args.name, args.user)
        if not args.json:
            print(
                f"token {out['id']} ({out['name']}) for user {out['user']}: shown only now, keep it safe",
                file=sys.stderr,
            )
        text = out["token"]
    elif cmd == ("token", "list"):
        out = client.list_tokens()
        text = ac.render_tokens(out)
    elif cmd == ("token", "revoke"):
        client.revoke_token(args.id)
        out, text = {"revoked": args.id}, f"revoked token {args.id}"
    elif cmd == ("acl", "add"):
        who = "anonymous" if args.anonymous else "anyone"
        subject = f"user:{args.user}" if args.user else f"role:{args.role}" if args.role else who
        kind, pattern = ("topic", args.topic) if args.topic is not None else ("group", args.group)
        actions = [a.strip().lower() for a in args.actions.split(",") if a.strip()]
        out = client.add_rule(subject, kind, pattern, actions, "deny" if args.deny else "allow")
        text = ac.render_rules([out])
    elif cmd == ("acl", "list"):
        out = client.list_rules()
        text = ac.render_rules(out)
    elif cmd == ("acl", "delete"):
        client.delete_rule(args.id)
        out, text = {"deleted": args.id}, f"deleted rule {args.id}"
    elif cmd == ("acl", "export"):
        sys.stdout.write(client.export_policy())
        return 0
    elif cmd == ("acl", "import"):
        try:
            if args.file == "-":
                policy = sys.stdin.read()
            else:
                with open(args.file, encoding="utf-8") as fh:
                    policy = fh.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ac.AdminError(f"cannot read {args.file}: {e}") from e
        out = client.import_policy(policy, replace=not args.merge)
        text = f"imported {out['users']} user(s) and {out['rules']} rule(s); removed {out['removed']} rule(s)"
    else:  # pragma: no cover - argparse only produces the commands above
        raise ac.AdminError(f"unknown command {' '.join(cmd)}")
    print(ac.dumps(out) if getattr(args, "json", False) else text)
    return 0


GROUP = CommandGroup(add_parsers, admin_group_runner(run))
