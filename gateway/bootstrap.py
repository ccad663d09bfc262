"""First-admin bootstrap: with `auth` on and no admin user yet, create `admin` with the password of
`GATEWAY_ADMIN_PASSWORD`, else a random one written once to `DATA_DIR/initial-admin-password`
(mode 0600, never overwritten) and only hinted at in the log.

Proxies of a cluster share the directory, so one of them claims the bootstrap first (an atomic
put-if-absent in the store's key-value data); the others find the admin on their next look. A claim
older than a minute with still no admin is taken over (the proxy holding it died midway)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

from messaging_processor import MessagingProcessor
from messaging_processor.security.directory import NS_META

log = logging.getLogger("gateway")

ADMIN = "admin"
PASSWORD_FILE = "initial-admin-password"
PASSWORD_ENV = "GATEWAY_ADMIN_PASSWORD"
CLAIM_KEY = "bootstrap-admin"
CLAIM_STALE_S = 60.0


class BootstrapError(Exception):
    """The first admin could not be created; one-line reason."""


async def ensure_admin(
    processor: MessagingProcessor,
    data_dir: str,
    *,
    cluster: bool = False,
    env: Mapping[str, str] | None = None,
) -> str | None:
    """Create the first admin user when there is none; returns how its password was set
    ("env" or the file path), None when nothing was done."""
    sec = processor.security
    if sec is None or sec.has_admin():
        return None
    env = os.environ if env is None else env
    now = time.time()
    prev = await processor.kv_put_if_absent(NS_META, CLAIM_KEY, json.dumps({"at": now}).encode())
    await sec.directory.refresh(force=True)
    if sec.has_admin():
        return None
    if prev is not None:
        try:
            at = float(json.loads(prev)["at"])
        except (ValueError, KeyError, TypeError):
            at = 0.0
        if now - at < CLAIM_STALE_S:
            log.info("another proxy is creating the first admin user")
            return None
        await processor.kv_put(NS_META, CLAIM_KEY, json.dumps({"at": now}).encode())
    if ADMIN in sec.directory.users:
        raise BootstrapError(
            f"no user has the admin role and a user named {ADMIN!r} exists: give it the admin role"
        )
    password = env.get(PASSWORD_ENV) or ""
    if password:
        await sec.add_user(ADMIN, password=password, role="admin")
        log.info("created the first admin user %r with the password of %s", ADMIN, PASSWORD_ENV)
        return "env"
    path = Path(data_dir) / PASSWORD_FILE
    password = secrets.token_urlsafe(24)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        await processor.kv_delete(NS_META, CLAIM_KEY)
        raise BootstrapError(
            f"no admin user exists and {path} is already there (from an earlier bootstrap): remove it, "
            f"or set {PASSWORD_ENV}"
        ) from None
    except OSError as e:
        await processor.kv_delete(NS_META, CLAIM_KEY)
        raise BootstrapError(f"cannot write {path}: {e.strerror or e}") from e
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(password + "\n")
        await sec.add_user(ADMIN, password=password, role="admin")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    where = " on this proxy's host" if cluster else ""
    log.warning(
        "created the first admin user %r; its password is in %s%s (read it, change it with "
        "`gateway user passwd admin --password-stdin`, then delete the file)",
        ADMIN,
        path,
        where,
    )
    return str(path)
