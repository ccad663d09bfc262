"""A small durable key-value table for protocol metadata (MQTT sessions and retained messages,
AMQP declarations, webhook subscriptions): SQLite in WAL mode with full sync, driven from its own
thread so that a commit's fsync never blocks the event loop. Namespaced keys, byte values."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor


class KeyValueStore:
    """`await kv.put(ns, key, value)` returns once the value is durable."""

    def __init__(self, data_dir: str) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="store-kv")
        self._db: sqlite3.Connection | None = None
        self._path = os.path.join(data_dir, "kv.db")
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
    async def put(self, ns: str, key: str, value: bytes) -> None:
        await self._run(self._put_many, ns, [(key, bytes(value))])

    async def put_many(self, ns: str, items: dict[str, bytes | None]) -> None:
        """Set (or, for None values, delete) several keys in one transaction."""
        await self._run(self._put_many, ns, list(items.items()))

    async def put_if_absent(self, ns: str, key: str, value: bytes) -> bytes | None:
        """Store `value` unless the key exists, atomically: None when stored, else the value
        already there (unchanged)."""
        return await self._run(self._put_if_absent, ns, key, bytes(value))

    async def get(self, ns: str, key: str) -> bytes | None:
        return await self._run(self._get, ns, key)

    async def delete(self, ns: str, key: str) -> bool:
        return await self._run(self._delete, ns, key)

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
