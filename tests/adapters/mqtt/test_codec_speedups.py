"""The compiled MQTT PUBLISH encoder (adapters/mqtt/codec/_speedups.pyx) against its pure-Python
reference: byte-identical packets and the same errors; GATEWAY_PURE_PYTHON=1 selects the pure one.
(Here beside the store's compiled path, docs/store.md "Compiled hot path", which it is built with.)"""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.mqtt.codec import encoder
from tests.store.test_speedups import _compiler, _outcome, run_probe


def test_extension_is_built_where_a_compiler_is() -> None:
    if _compiler() is None:
        pytest.skip("no C compiler: the codec runs pure Python")
    assert importlib.util.find_spec("adapters.mqtt.codec._speedups") is not None


@pytest.fixture(scope="module")
def sp():
    mod = pytest.importorskip("adapters.mqtt.codec._speedups")
    mod.bind(encoder.py_encode_publish)
    return mod


@given(
    topic=st.one_of(st.text(max_size=60), st.binary(max_size=60), st.just("t\ud800"), st.just("x" * 70_000)),
    payload=st.one_of(st.binary(max_size=20_000), st.binary(max_size=10).map(bytearray)),
    qos=st.one_of(st.integers(-1, 3), st.booleans()),
    packet_id=st.one_of(st.none(), st.integers(-2, 70_000)),
    retain=st.booleans(),
    dup=st.booleans(),
    version=st.sampled_from([3, 4, 5]),
    properties=st.one_of(st.none(), st.just({}), st.just({"bogus": 1})),
)
@settings(max_examples=500, deadline=None)
def test_encode_publish_matches_the_reference(
    topic, payload, qos, packet_id, retain, dup, version, properties
):
    args = (topic, payload, qos, packet_id, retain, dup, version, properties)
    mod = pytest.importorskip("adapters.mqtt.codec._speedups")
    mod.bind(encoder.py_encode_publish)
    assert _outcome(mod.encode_publish, *args) == _outcome(encoder.py_encode_publish, *args)


def test_long_packets_use_a_longer_length(sp) -> None:
    """Remaining lengths of 1 to 4 bytes (127, 128, 16383, 16384, 2097152 bytes)."""
    for n in (0, 120, 121, 16_370, 16_380, 2_097_150, 2_097_160):
        for args in (
            ("a/b", b"x" * n, 0, None, False, False, 4, None),
            ("a/b", b"y" * n, 2, 9, 1, 1, 5, None),
        ):
            assert sp.encode_publish(*args) == encoder.py_encode_publish(*args)


@pytest.mark.parametrize("env", ["1", None])
def test_gateway_pure_python_selects_the_pure_encoder(sp, env: str | None) -> None:
    probe = (
        "from adapters.mqtt.codec import encoder\n"
        "print(encoder.speedups is None, encoder.encode_publish is encoder.py_encode_publish)"
    )
    assert run_probe(probe, env) == (["True"] * 2 if env == "1" else ["False"] * 2)
