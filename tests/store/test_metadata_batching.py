"""Topic and group settings (meta.db) are written in one transaction per event-loop turn: a storm of
new persistent sessions (a queue topic and a consumer group each) costs one fsync per turn, not two
per device. What LocalStoreClient answers is on disk first (`Metadata.durable`)."""

from __future__ import annotations

import asyncio
import os
import sqlite3

from messaging_processor import LocalStoreClient


def rows(data_dir: str, table: str) -> set[str]:
    """The names committed in meta.db, read through a connection of its own."""
    db = sqlite3.connect(os.path.join(data_dir, "meta.db"))
    try:
        return {n for (n,) in db.execute(f"SELECT name FROM {table}")}  # noqa: S608
    finally:
        db.close()


async def test_writes_of_one_turn_share_one_commit_and_are_answered_once_committed(make_store, tmp_path):
    s = await make_store()
    d = s.config.data_dir
    commits: list[str] = []
    s.meta.db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    for i in range(100):  # one turn: as many sessions' topics and groups as a storm brings at once
        s.create_topic(f"%SQ%s{i}", 1)
        s.create_group(f"g{i}")
    assert commits == []
    assert not {"%SQ%s0"} <= rows(d, "topics")  # not committed yet: still the same turn
    await s.meta.durable()
    assert commits == ["COMMIT"]
    assert {f"%SQ%s{i}" for i in range(100)} <= rows(d, "topics")
    assert {f"g{i}" for i in range(100)} <= rows(d, "groups_")

    client = LocalStoreClient(s)  # the async API answers once on disk, each call on its own
    await client.create_topic("answered", 2)
    assert "answered" in rows(d, "topics")
    await client.delete_topic("answered")
    assert "answered" not in rows(d, "topics")
    await client.create_group("ga", 3, None)
    assert "ga" in rows(d, "groups_")
    assert len(commits) == 4


async def test_a_close_commits_what_is_pending_and_a_reopen_has_it(make_store, tmp_path):
    s = await make_store()
    s.create_topic("kept", 3)
    await s.close()  # in the same turn as the write: the close commits it
    assert "kept" in rows(s.config.data_dir, "topics")
    s2 = await make_store()
    assert s2.topic("kept", create=False).queues == 3


async def test_without_a_running_loop_a_write_commits_at_once(tmp_path):
    from store.config import Metadata, TopicConfig

    def offline() -> None:
        m = Metadata(str(tmp_path))
        m.save_topic(TopicConfig("t", 1))
        assert "t" in rows(str(tmp_path), "topics")
        m.close()

    await asyncio.to_thread(offline)
