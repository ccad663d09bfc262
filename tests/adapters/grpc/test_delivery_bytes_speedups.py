"""The compiled gRPC delivery encoder (adapters/grpc/_speedups.pyx) against its pure-Python reference
(`delivery_bytes.py_delivery_response`): byte-identical responses and the same errors for every kind of
message, ordinary messages encoded without the pure function, and GATEWAY_PURE_PYTHON=1 selecting the
pure function. (What the bytes mean is test_delivery_bytes.py's: the same message as `fill_proto`.)"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.grpc import delivery_bytes
from adapters.grpc.convert import HIDDEN_PROPERTIES, PROP_CHECK_IMMUNITY, PROP_TRACE_CONTEXT
from adapters.grpc.generated import service_pb2 as s
from messaging_processor import Delivery
from messaging_processor.properties import P_USER_PROPERTIES
from store import Message, MessageType
from tests.adapters.grpc.test_delivery_bytes import BASE, VARIANTS
from tests.store.test_speedups import I32, I64, _compiler, _outcome, run_probe

py_response = delivery_bytes.py_delivery_response
HOSTS = ["", "gateway:8081", "hôte:1"]


def test_extension_is_built_where_a_compiler_is() -> None:
    if _compiler() is None:
        pytest.skip("no C compiler: the gRPC adapter runs pure Python")
    assert importlib.util.find_spec("adapters.grpc._speedups") is not None


@pytest.fixture(scope="module")
def sp():
    """The compiled module, bound to the pure function whichever one this process chose."""
    mod = pytest.importorskip("adapters.grpc._speedups")
    delivery_bytes.bind_speedups(mod)
    return mod


def _same(sp, dl: Delivery, host: str) -> None:
    """The compiled encoder gives the pure function's bytes, or its error."""
    assert _outcome(sp.delivery_response, dl, host) == _outcome(py_response, dl, host)


def _fast(sp, dl: Delivery, host: str) -> None:
    """An ordinary delivery: encoded without the pure function, to its very bytes."""
    want = py_response(dl, host)
    assert sp.fast_path(dl, host) == want
    assert sp.delivery_response(dl, host) == want


# ---------------------------------------------------------------------------- every kind of message
@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("attempt", [1, 2, 300, 2**40])
@pytest.mark.parametrize("host", HOSTS)
def test_variants_match_the_reference(sp, name: str, attempt: int, host: str) -> None:
    m = dataclasses.replace(BASE, **VARIANTS[name])
    dl = Delivery(m, f"handle-{name}-é", 1_763_000_100_000, attempt)
    for _ in range(2):  # the pure function the second time from its caches
        _fast(sp, dl, host)


# Property names with a meaning (hidden, the trace context, recovery, MQTT 5 pairs) among ordinary ones.
NAMES = st.one_of(
    st.text(max_size=12),
    st.sampled_from([*sorted(HIDDEN_PROPERTIES), "k"]),
)
IMMUNITY = st.one_of(st.integers(0, 2**64).map(str), st.sampled_from(["", "soon", "²", "-1", " 7"]))
PAIRS = st.lists(st.tuples(NAMES, st.text(max_size=8)), max_size=4).map(lambda p: json.dumps(p))
PROPERTIES = st.dictionaries(NAMES, st.text(max_size=30), max_size=6).flatmap(
    lambda props: st.fixed_dictionaries(
        {},
        optional={
            P_USER_PROPERTIES: st.one_of(PAIRS, st.just("not json")),
            PROP_CHECK_IMMUNITY: IMMUNITY,
            PROP_TRACE_CONTEXT: st.text(max_size=60),
        },
    ).map(lambda extra: {**props, **extra})
)
HEX = "0123456789abcdefABCDEF"
MESSAGE_IDS = st.one_of(
    st.just(""),
    st.text(alphabet=HEX, min_size=30, max_size=34),
    st.text(alphabet=HEX, min_size=16, max_size=16).map(lambda h: h + "0" * 16),  # not derivable
    st.tuples(st.text(max_size=4), st.text(alphabet=HEX, min_size=32, max_size=32)).map("".join),
    st.text(max_size=40),
)
TIMES = st.one_of(st.just(0), st.integers(0, 2**42), st.integers(*I64))
BODIES = st.one_of(
    st.binary(max_size=300), st.integers(0, 70_000).map(lambda n: (bytes(range(251)) * (n // 251 + 1))[:n])
)

messages = st.builds(
    Message,
    topic=st.text(max_size=140),
    body=BODIES,
    tag=st.text(max_size=140),
    keys=st.lists(st.text(max_size=20), max_size=3).map(tuple),
    properties=PROPERTIES,
    message_group=st.text(max_size=20),
    deliver_at=TIMES,
    message_id=MESSAGE_IDS,
    born_timestamp=TIMES,
    born_host=st.text(max_size=20),
    queue_id=st.one_of(st.integers(*I32), st.integers(*I64)),
    msg_type=st.sampled_from(MessageType),
    store_timestamp=TIMES,
    store_host=st.text(max_size=20),
    queue_offset=st.integers(*I64),
)
deliveries = st.builds(
    Delivery,
    message=messages,
    receipt_handle=st.text(max_size=80),
    invisible_until=st.integers(0, 2**42),
    delivery_attempt=st.one_of(st.integers(1, 20), st.integers(*I64)),
)


@given(dl=deliveries, host=st.sampled_from(HOSTS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_encodes_as_the_reference(sp, dl: Delivery, host: str) -> None:
    _fast(sp, dl, host)


# ---------------------------------------------------------------------------- off the fast path
def _odd_values():
    """Values the store does not give: the pure function's result or error, whatever it is."""
    big, small = 2**64 + 5, -(2**64) - 1
    for name, values in {
        "topic": ["t\ud800", None, b"t", 5],
        "tag": ["\udfff", None, b"x", 0],
        "keys": [("a", "\ud800"), ["a", "b"], ("a", None), None, ("a", b"b"), "ab", ()],
        "properties": [
            {"k": "\ud800"},
            {"\ud800": "v"},
            {"k": 1},
            {1: "v"},
            {PROP_TRACE_CONTEXT: None},
            {PROP_TRACE_CONTEXT: "\ud800"},
            {PROP_TRACE_CONTEXT: 7},
            {PROP_CHECK_IMMUNITY: "5", "k": "\ud800"},
            {PROP_CHECK_IMMUNITY: "5", PROP_TRACE_CONTEXT: 7},
            {P_USER_PROPERTIES: '[["a", "\\ud800"]]'},
            {P_USER_PROPERTIES: '[["a", 1]]'},
            None,
            [],
            (),
        ],
        "message_group": ["g\ud800", None, 3],
        "message_id": ["\ud800" + "a" * 32, None, 17, b"0" * 32],
        "born_host": ["h\ud800", None],
        "store_host": ["h\ud800", None, 8081],
        "body": [bytearray(b"abc"), memoryview(b"abc"), None, "text", bytearray()],
        "born_timestamp": [1.5, None, big, small, -(2**63) - 1, 2**63, True, "1"],
        "store_timestamp": [1.5, None, big, small, True, -1],
        "deliver_at": [2.5, None, big, small, False, True],
        "queue_id": [big, small, None, 1.0, True],
        "queue_offset": [big, small, None, 2**63, -(2**63)],
        "msg_type": [7, None, -1, 1, "FIFO", MessageType.DELAY],
    }.items():
        for v in values:
            shown = f"memoryview({bytes(v)!r})" if isinstance(v, memoryview) else repr(v)  # (no address)
            yield pytest.param(name, v, id=f"{name}={shown}")


@pytest.mark.parametrize("name, value", list(_odd_values()))
def test_odd_values_give_the_reference_result_or_error(sp, name: str, value) -> None:
    m = dataclasses.replace(BASE, **{name: value})
    for host in ("", "gw:1", None, 5):
        _same(sp, Delivery(m, "h", 0, 1), host)


@pytest.mark.parametrize("handle", ["h\ud800", None, b"h", ""])
@pytest.mark.parametrize("attempt", [0, -1, 2**63, 2**64 + 1, None, 1.0, True])
def test_odd_deliveries_give_the_reference_result_or_error(sp, handle, attempt) -> None:
    _same(sp, Delivery(BASE, handle, 0, attempt), "")
    _same(sp, Delivery(dataclasses.replace(BASE, store_host=""), handle, 0, attempt), None)


def test_not_a_delivery_gives_the_reference_error(sp) -> None:
    for dl in (None, object(), BASE, Delivery(None, "h", 0, 1)):  # type: ignore[arg-type]
        _same(sp, dl, "")


# ---------------------------------------------------------------------------- digest, trace context
def test_body_digests_at_block_boundaries(sp) -> None:
    """Bodies around MD5's block sizes (55/56 bytes and multiples of 64), and large ones."""
    sizes = [0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 16_383, 16_384, 1 << 20]
    for n in sizes:
        _fast(sp, Delivery(dataclasses.replace(BASE, body=os.urandom(n)), "h", 0, 1), "")


def test_large_bodies_from_threads(sp) -> None:
    """Large bodies (hashlib digests them without the GIL) from several threads at once."""
    bodies = [os.urandom(200_000 + i) for i in range(8)]
    dls = [Delivery(dataclasses.replace(BASE, body=b), "h", 0, 1) for b in bodies]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda dl: sp.delivery_response(dl, ""), dls * 3))
    assert got == [py_response(dl, "") for dl in dls * 3]


@pytest.mark.parametrize(
    "message_id",
    [
        "",
        "0A0B0C0D00002A9F0000000000000001",
        "0a0b0c0d00002a9f0000000000000001",
        "0A0B0C0D00002A9F0000000000000000",  # the last 16 digits zero: not derivable
        "F" * 32,
        "F" * 31,
        "x" + "f" * 32,
        "é" + "AB" * 16,
        "AB" * 15 + "Aé",
        "AB" * 15 + "AG",
        "ü" * 40,
        "7" * 64,
        "0" * 16 + "1" + "0" * 15,
    ],
)
@pytest.mark.parametrize(
    "props", [{}, {"a": "b"}, {PROP_TRACE_CONTEXT: "00-given-01"}, {PROP_CHECK_IMMUNITY: "3"}]
)
def test_no_trace_context_is_derived_from_ids(sp, message_id: str, props: dict) -> None:
    """Only a client's trace context is delivered, whatever the id (issue 47)."""
    dl = Delivery(dataclasses.replace(BASE, message_id=message_id, properties=props), "h", 0, 1)
    _fast(sp, dl, "")
    got = s.ReceiveMessageResponse.FromString(sp.delivery_response(dl, "")).message.system_properties
    assert got.trace_context == props.get(PROP_TRACE_CONTEXT, "")


# ---------------------------------------------------------------------------- the choice
@pytest.mark.parametrize("env", ["1", "0", None])
def test_gateway_pure_python_selects_the_pure_function(sp, env: str | None) -> None:
    probe = (
        "from adapters.grpc import delivery_bytes, service\n"
        "print(delivery_bytes.speedups is None,"
        " delivery_bytes.delivery_response is delivery_bytes.py_delivery_response,"
        " service.delivery_response is delivery_bytes.py_delivery_response)"
    )
    assert run_probe(probe, env) == (["True"] * 3 if env == "1" else ["False"] * 3)
