"""What every admin command shares: the `--url`/`--json` and credential parent parsers, how the
credentials are found (CREDENTIALS_HELP), secrets read from stdin, and the run of one command
against the gateway's HTTP admin API (an AdminError is exit 1)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .command import Parents

CREDENTIALS_HELP = (
    "Admin commands authenticate with --user NAME and --password-stdin (the password as the first "
    "line of stdin), else $GATEWAY_USER and $GATEWAY_PASSWORD, else $GATEWAY_TOKEN (an API token). "
    "Where a command has its own --user or --password-stdin (user add, user passwd, token create, "
    "acl add), give the credentials before the command (gateway --user admin --password-stdin user "
    "add ...) or in the environment."
)


def add_global_credentials(parser: argparse.ArgumentParser) -> None:
    """`gateway --user NAME --password-stdin <command>`: credentials given before the command."""
    parser.add_argument("--user", dest="g_user", metavar="NAME", help="admin commands: log in as this user")
    parser.add_argument(
        "--password-stdin",
        dest="g_password_stdin",
        action="store_true",
        help="admin commands: read --user's password from the first line of stdin",
    )


def parents() -> Parents:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=None,
        help="the gateway's HTTP address (default $GATEWAY_URL, else http://127.0.0.1:8082)",
    )
    common.add_argument("--json", action="store_true", help="print the API's JSON answer")
    creds = argparse.ArgumentParser(add_help=False)
    creds.add_argument("--user", dest="auth_user", metavar="NAME", help="log in as this admin user")
    creds.add_argument(
        "--password-stdin",
        dest="auth_password_stdin",
        action="store_true",
        help="read the admin user's password from the first line of stdin",
    )
    return Parents(common, creds)


class Stdin:
    """Secrets read from stdin, one per line, in the order asked (a prompt without echo on a tty)."""

    def __init__(self) -> None:
        self.read = 0

    def line(self, what: str) -> str:
        from gateway.admin_client import AdminError

        if sys.stdin is None:
            raise AdminError(f"no stdin to read {what} from")
        if sys.stdin.isatty():
            import getpass

            text = getpass.getpass(f"{what}: ")
        else:
            text = sys.stdin.readline()
            if not text:
                raise AdminError(f"stdin ended before {what} (line {self.read + 1})")
            text = text.rstrip("\r\n")
        self.read += 1
        if not text:
            raise AdminError(f"{what} is empty")
        return text


def credentials(args: argparse.Namespace, stdin: Stdin, env: Mapping[str, str]) -> tuple[str, ...] | None:
    """How admin commands authenticate (see CREDENTIALS_HELP); None: no credentials."""
    from gateway.admin_client import AdminError

    user = getattr(args, "auth_user", None) or getattr(args, "g_user", None)
    from_stdin = getattr(args, "auth_password_stdin", False) or getattr(args, "g_password_stdin", False)
    user = user or env.get("GATEWAY_USER")
    if not user and not from_stdin and env.get("GATEWAY_TOKEN"):
        return ("bearer", env["GATEWAY_TOKEN"])
    if not user:
        if from_stdin:
            raise AdminError("--password-stdin needs --user (or GATEWAY_USER)")
        return None
    password = stdin.line(f"password of {user}") if from_stdin else env.get("GATEWAY_PASSWORD")
    if not password:
        raise AdminError(f"no password for {user}: use --password-stdin or set GATEWAY_PASSWORD")
    return ("basic", user, password)


Command = Callable[[argparse.Namespace, Any, Stdin], int]


def run_admin(args: argparse.Namespace, command: Command) -> int:
    """Run `command(args, client, stdin)` with a client of `--url` (default $GATEWAY_URL, else
    the admin client's default); an AdminError, the credentials' included, is printed: exit 1."""
    from gateway import admin_client as ac

    url = args.url or os.environ.get("GATEWAY_URL") or ac.DEFAULT_URL
    stdin = Stdin()
    try:
        client = ac.AdminClient(url, auth=credentials(args, stdin, os.environ))
        return command(args, client, stdin)
    except ac.AdminError as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 1


def admin_group_runner(command: Command) -> Callable[[argparse.Namespace], int]:
    """The CommandGroup `run` of admin commands handled by `command`."""
    return lambda args: run_admin(args, command)
