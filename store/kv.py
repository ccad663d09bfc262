"""A small durable key-value table for protocol metadata (MQTT sessions and retained messages,
AMQP declarations, webhook subscriptions): SQLite in WAL mode with full sync, driven from its own
thread so that a commit's fsync never blocks the event loop. Namespaced keys, byte values."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

Change = Callable[[str, dict[str, bytes | None]], None]


class KeyValueStore:
    """`await kv.put(ns, key, value)` returns once the value is durable. `on_change(ns, items)`,
    when set, hears every committed change (`None` values: deleted keys), in commit order."""

    def __init__(self, data_dir: str) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="store-kv")
        self._db: sqlite3.Connection | None = None
        self._path = os.path.join(data_dir, "kv.db")
        self.on_change: Change | None = None
        self._pool.submit(self._open).result()

    def _open(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS kv (ns TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,"
            " PRIMARY KEY (ns, key)) WITHOUT ROWID"
        )
        self._db = db

    def _run(self, fn, *args):
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # --- thread side
    def _put_many(self, ns: str, items: list[tuple[str, bytes | None]]) -> None:
        db = self._db
        db.execute("BEGIN")
        try:
            for k, v in items:
                if v is None:
                    db.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (ns, k))
                else:
                    db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (ns, k, v))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _put_if_absent(self, ns: str, key: str, value: bytes) -> bytes | None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT value FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()
            if row is None:
                db.execute("INSERT INTO kv VALUES (?, ?, ?)", (ns, key, value))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return None if row is None else bytes(row[0])

    def _get(self, ns: str, key: str) -> bytes | None:
        row = self._db.execute("SELECT value FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()
        return None if row is None else bytes(row[0])

    def _delete(self, ns: str, key: str) -> bool:
        return self._db.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (ns, key)).rowcount > 0

    def _dump(self) -> list[tuple[str, str, bytes]]:
        return [(n, k, bytes(v)) for n, k, v in self._db.execute("SELECT ns, key, value FROM kv")]

    def _replace_all(self, rows: list[tuple[str, str, bytes]]) -> None:
        db = self._db
        db.execute("BEGIN")
        try:
            db.execute("DELETE FROM kv")
            db.executemany("INSERT INTO kv VALUES (?, ?, ?)", rows)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _scan(self, ns: str, prefix: str) -> list[tuple[str, bytes]]:
        if not prefix:
            rows = self._db.execute("SELECT key, value FROM kv WHERE ns = ? ORDER BY key", (ns,))
        else:
            # key >= prefix AND key < prefix + U+10FFFF: an index range, no LIKE escaping issues
            rows = self._db.execute(
                "SELECT key, value FROM kv WHERE ns = ? AND key >= ? AND key < ? ORDER BY key",
                (ns, prefix, prefix + "\U0010ffff"),
            )
        return [(k, bytes(v)) for k, v in rows]

    # --- loop side
    def _write(self, fn, args: tuple, ns: str, items: dict[str, bytes | None], applies=None):
        """Run a change on the thread; `on_change` hears it once committed (in commit order, even
        when the caller is cancelled meanwhile) if `applies(result)` (default: always)."""
        fut = self._run(fn, *args)

        def done(f: asyncio.Future) -> None:
            ok = self.on_change is not None and not f.cancelled() and f.exception() is None
            if ok and (applies is None or applies(f.result())):
                self.on_change(ns, items)

        fut.add_done_callback(done)
        return asyncio.shield(fut)

    async def put(self, ns: str, key: str, value: bytes) -> None:
        value = bytes(value)
        await self._write(self._put_many, (ns, [(key, value)]), ns, {key: value})

    async def put_many(self, ns: str, items: dict[str, bytes | None]) -> None:
        """Set (or, for None values, delete) several keys in one transaction."""
        items = {k: None if v is None else bytes(v) for k, v in items.items()}
        await self._write(self._put_many, (ns, list(items.items())), ns, items)

    async def put_if_absent(self, ns: str, key: str, value: bytes) -> bytes | None:
        """Store `value` unless the key exists, atomically: None when stored, else the value
        already there (unchanged)."""
        value = bytes(value)
        return await self._write(
            self._put_if_absent, (ns, key, value), ns, {key: value}, lambda old: old is None
        )

    async def get(self, ns: str, key: str) -> bytes | None:
        return await self._run(self._get, ns, key)

    async def delete(self, ns: str, key: str) -> bool:
        return await self._write(self._delete, (ns, key), ns, {key: None}, bool)

    async def dump(self) -> list[tuple[str, str, bytes]]:
        """Every (namespace, key, value) (a replica's full copy)."""
        return await self._run(self._dump)

    async def replace_all(self, rows: list[tuple[str, str, bytes]]) -> None:
        """Replace the whole table with `rows`, in one transaction (a replica taking a primary's
        copy); `on_change` does not hear it."""
        await self._run(self._replace_all, rows)

    async def scan(self, ns: str, prefix: str = "") -> list[tuple[str, bytes]]:
        """All (key, value) pairs of a namespace whose key starts with `prefix`, in key order."""
        return await self._run(self._scan, ns, prefix)

    def close(self) -> None:
        def _close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        self._pool.submit(_close).result()
        self._pool.shutdown(wait=True)
