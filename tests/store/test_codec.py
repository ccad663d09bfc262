"""Record codec: property blocks are JSON objects (flag 0x0001); records from before still decode."""

from __future__ import annotations

import json

import pytest

from store import Message, codec
from tests.store.support import legacy_record, read_all, write_legacy_records

AWKWARD = {
    "ce.id": "id-1",
    "quote": 'say "hi"\\now',
    "ctl": "a\x00b\x1fc\x7f",
    "empty": "",
    "ünï": "çödé ✓ 🚀",
    "num": "12345678901234567890123",  # a string, never a number
}


def record(props: dict[str, str], qoff: int = 0) -> bytes:
    msg = Message("t", b"body", tag="tg", keys=("x", "y"), properties=props)
    return codec.encode(msg, 1, qoff, 1000, f"ID{qoff}", 999)


def blocks(rec: bytes) -> tuple[int, bytes]:
    """(flags, property block) of a record."""
    head = codec.HEAD.unpack_from(rec, codec.PREFIX.size)
    lp, lb = head[14], head[15]
    return head[2], rec[len(rec) - lb - lp : len(rec) - lb]


def test_properties_are_one_json_object_in_order() -> None:
    rec = record(AWKWARD)
    flags, block = blocks(rec)
    assert flags & codec.FLAG_JSON_PROPERTIES
    assert list(json.loads(block).items()) == list(AWKWARD.items())
    assert codec.check(rec, 0, len(rec)) == (len(rec), codec.MAGIC_MESSAGE)
    out = codec.decode(rec)
    assert list(out.properties.items()) == list(AWKWARD.items())
    assert (out.body, out.tag, out.keys, out.message_id) == (b"body", "tg", ("x", "y"), "ID0")


def test_no_properties_no_block() -> None:
    rec = record({})
    flags, block = blocks(rec)
    assert block == b"" and not flags & codec.FLAG_JSON_PROPERTIES
    assert codec.decode(rec).properties == {}


def test_records_written_before_json_properties_still_decode() -> None:
    old = legacy_record(record(AWKWARD, 7))
    flags, block = blocks(old)
    assert not flags & codec.FLAG_JSON_PROPERTIES and block[:2] == b"\x05\x00"  # len("ce.id")
    assert codec.check(old, 0, len(old)) == (len(old), codec.MAGIC_MESSAGE)
    out = codec.decode(old)
    assert list(out.properties.items()) == list(AWKWARD.items())
    assert (out.queue_offset, out.message_id, out.body) == (7, "ID7", b"body")
    assert codec.decode_properties(block, 0) == AWKWARD


def test_properties_that_are_not_utf8_are_a_value_error() -> None:
    # A lone surrogate (as "surrogateescape" decoding leaves for invalid UTF-8) has no UTF-8 form:
    # ValueError, which the processor answers as a bad request (not an internal error).
    with pytest.raises(ValueError, match="properties cannot be stored"):
        record({"k": "bad \udcff"})


async def test_a_refused_message_leaves_the_store_usable(make_store) -> None:
    s = await make_store()
    s.create_topic("t", queues=1)
    with pytest.raises(ValueError):
        await s.append(Message("t", b"no", properties={"k": "\ud800"}))
    r = await s.append(Message("t", b"yes", properties={"k": "v"}))
    assert r.queue_offset == 0
    assert [(m.body, m.properties) for m in read_all(s, "t")] == [(b"yes", {"k": "v"})]


def test_decoded_properties_are_the_callers_own() -> None:
    rec = record({"a": "1"})
    first = codec.decode(rec)
    first.properties["a"] = "changed"
    assert codec.decode(rec).properties == {"a": "1"}


async def test_a_store_with_old_records_reopens_and_serves_both(make_store, monkeypatch) -> None:
    def props(i: int) -> dict[str, str]:
        return {"i": str(i), "é": "✓"}

    s = await make_store()
    s.create_topic("t", queues=1)
    with monkeypatch.context() as m:
        write_legacy_records(m)
        old = await s.append_many([Message("t", b"old-%d" % i, properties=props(i)) for i in range(5)])
    new = await s.append_many([Message("t", b"new-%d" % i, properties=props(i)) for i in range(5)])
    on_disk = [blocks(s.commitlog.read(r.commitlog_offset, r.size))[0] for r in old + new]
    assert [f & codec.FLAG_JSON_PROPERTIES for f in on_disk] == [0] * 5 + [codec.FLAG_JSON_PROPERTIES] * 5
    await s.close()
    s = await make_store()
    got = [(m.body, m.properties) for m in read_all(s, "t")]
    want = [(b"%s-%d" % (k, i), props(i)) for k in (b"old", b"new") for i in range(5)]
    assert got == want
