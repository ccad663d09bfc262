"""A store node's TAIL reply carries the records as its commit log holds them (`encode_records`):
the same bytes `encode_messages` writes for the decoded messages, so a proxy reads them unchanged."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import store_wire as w
from store import Message
from store import codec as record
from tests.store.test_speedups import messages


@given(rows=st.lists(st.tuples(messages, st.integers(0, 2**40), st.integers(0, 2**50)), max_size=6))
@settings(max_examples=300, deadline=None)
def test_records_as_stored_are_the_bytes_of_their_decoded_messages(rows) -> None:
    pairs: list[tuple[int, bytes]] = []
    decoded: list[Message] = []
    for msg, qoff, clo in rows:
        mid = msg.message_id or "A" * 32
        rec = record.encode(msg, 3, qoff, 1_700_000_000_000, mid, 1_700_000_000_001)  # as appends do
        pairs.append((clo, rec))
        decoded.append(record.decode_checked(rec, clo))  # as `tail` reads it
    body = w.encode_records(pairs)
    assert body == w.py_encode_messages(decoded)
    assert [p.message for p in w.decode_popped(body)] == decoded
    assert all(p.receipt_handle == "" and p.invisible_until == 0 for p in w.decode_popped(body))
