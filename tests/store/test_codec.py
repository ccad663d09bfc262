"""Record codec: properties encode to the documented layout whatever the encoder's caches hold."""

from __future__ import annotations

import struct

import pytest

from store import Message, codec


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder's caches are process-wide: start each test without what others left there."""
    monkeypatch.setattr(codec, "_pairs", {})
    monkeypatch.setattr(codec, "_pair_fills", {})
    monkeypatch.setattr(codec, "_props_cache", {})


def reference_properties(props: dict[str, str]) -> bytes:
    """The layout of docs/store.md, written plainly: (u16 len, name, u32 len, value) pairs."""
    out = b""
    for k, v in props.items():
        kb, vb = k.encode(), v.encode()
        out += struct.pack("<H", len(kb)) + kb + struct.pack("<I", len(vb)) + vb
    return out


def test_repeated_and_unique_values_encode_the_same_as_the_reference() -> None:
    # Repeating values (served from the pair cache), unique ones (their name stops being cached
    # after a few fills) and long ones (never cached), over more events than every cache bound.
    seen = set()
    for i in range(codec._PAIRS_MAX * (codec._PAIR_FILLS_MAX + 2)):
        props = {
            "ce.id": f"id-{i}",
            "ce.source": "/bench/http",
            "ce.type": "com.example." + "t" * (i % 3),
            "ce.time": f"2024-05-01T00:00:{i % 60:02d}.{i % 1000:03d}Z",
            "ce.long": "é" * 200 + str(i % 2),
        }
        raw = codec.encode_properties(props)
        assert raw == reference_properties(props), i
        assert codec.decode_properties(raw) == props
        seen.add(raw)
    assert len(seen) == codec._PAIRS_MAX * (codec._PAIR_FILLS_MAX + 2)
    assert codec._pairs["ce.id"] is codec._NOT_CACHED  # its values never repeat
    assert len(codec._pairs["ce.type"]) == 3 and len(codec._pairs["ce.source"]) == 1
    assert "ce.long" not in codec._pairs


def test_one_value_under_two_names_is_kept_apart() -> None:
    a = codec.encode_properties({"a1": "v", "b1": "w", "c1": "x", "d1": "y", "e1": "v"})
    b = codec.encode_properties({"e1": "v", "a1": "v", "b1": "w", "c1": "x", "d1": "y"})
    assert codec.decode_properties(a) == {"a1": "v", "b1": "w", "c1": "x", "d1": "y", "e1": "v"}
    assert codec.decode_properties(b) == codec.decode_properties(a)
    assert a != b  # order kept


def test_a_whole_record_round_trips_with_cached_properties() -> None:
    props = {f"k{i}": "same" for i in range(6)}
    msg = Message("t", b"body", tag="tg", keys=("x", "y"), properties=props)
    for qoff in range(3):
        rec = codec.encode(msg, 1, qoff, 1000, f"ID{qoff}", 999)
        assert codec.check(rec, 0, len(rec)) == (len(rec), codec.MAGIC_MESSAGE)
        out = codec.decode(rec)
        got = (out.properties, out.queue_offset, out.message_id, out.keys)
        assert got == (props, qoff, f"ID{qoff}", ("x", "y"))
