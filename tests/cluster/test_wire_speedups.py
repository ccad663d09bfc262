"""The compiled message lists of the store node protocol (cluster/_speedups.pyx) against their
pure-Python reference (cluster/store_wire.py): byte-identical bodies, equal decoded messages, the
same error on bad input; GATEWAY_PURE_PYTHON=1 selects the pure functions; and where a C compiler is
present the extension must have been built."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import store_wire as w
from store import Message, PoppedMessage
from tests.store.test_speedups import _compiler, _outcome, messages, run_probe

I32, I64 = (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1)


def test_extension_is_built_where_a_compiler_is() -> None:
    if _compiler() is None:
        pytest.skip("no C compiler: the message lists run pure Python")
    assert importlib.util.find_spec("cluster._speedups") is not None


@pytest.fixture(scope="module")
def sp():
    mod = pytest.importorskip("cluster._speedups")
    assert w.speedups is mod, "built but not chosen"
    return mod


def _stored(msg: Message, qoff: int, clo: int, reconsume: int) -> Message:
    msg.queue_id, msg.queue_offset, msg.store_timestamp = 3, qoff, 1_700_000_000_000
    msg.message_id, msg.born_timestamp = msg.message_id or "A" * 32, 1_700_000_000_001
    msg.commitlog_offset, msg.reconsume_times = clo, reconsume
    return msg


items = st.lists(
    st.tuples(
        messages,
        st.integers(0, 2**40),
        st.integers(*I64),
        st.integers(*I32),
        st.one_of(st.none(), st.text(max_size=30)),  # None: a plain message, else a popped one's handle
        st.integers(*I64),
    ),
    max_size=6,
)


@given(rows=items)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_bodies_and_messages_match_the_reference(sp, rows) -> None:
    listed = []
    for msg, qoff, clo, reconsume, handle, until in rows:
        m = _stored(msg, qoff, clo, reconsume)
        listed.append(m if handle is None else PoppedMessage(m, handle, until))
    body = w.py_encode_messages(listed)
    assert sp.encode_messages(iter(listed)) == body
    assert sp.decode_popped(body) == w.py_decode_popped(body)


@given(
    clo=st.integers(-(2**70), 2**70),
    reconsume=st.one_of(st.integers(-(2**40), 2**40), st.booleans()),
    until=st.one_of(st.integers(-(2**70), 2**70), st.just(1.5)),
    handle=st.one_of(st.text(max_size=5), st.just("h" * 70_000), st.just(b"bytes")),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_out_of_range_fields_fail_as_the_reference(sp, clo, reconsume, until, handle) -> None:
    m = _stored(Message("t", b"b"), 1, 0, 0)
    m.commitlog_offset, m.reconsume_times = clo, reconsume
    listed = [PoppedMessage(m, handle, until), m]
    assert _outcome(sp.encode_messages, listed) == _outcome(w.py_encode_messages, listed)


@given(cut=st.integers(0, 400), junk=st.binary(max_size=40), flip=st.integers(0, 400))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_malformed_bodies_fail_as_the_reference(sp, cut, junk, flip) -> None:
    m = _stored(Message("topic", b"body" * 20, tag="tag", properties={"k": "v"}), 7, 99, 2)
    body = bytearray(w.py_encode_messages([PoppedMessage(m, "handle-é", 5), m]))
    if flip < len(body):
        body[flip] ^= 0xFF
    for bad in (bytes(body[:cut]) + junk, bytes(body), b"\xff\xff" + junk):
        assert _outcome(sp.decode_popped, bad) == _outcome(w.py_decode_popped, bad)


@pytest.mark.parametrize("env", ["1", None])
def test_gateway_pure_python_selects_the_pure_functions(sp, env: str | None) -> None:
    probe = (
        "from cluster import store_wire as w\n"
        "print(w.speedups is None, w.encode_messages is w.py_encode_messages,"
        " w.decode_popped is w.py_decode_popped)"
    )
    assert run_probe(probe, env) == (["True"] * 3 if env == "1" else ["False"] * 3)
