"""The compiled hot path of the store (store/_codec_speedups.pyx, the record codec, and
store/_append_speedups.pyx, the append loop) against its pure-Python reference (docs/store.md,
"Compiled hot path"): byte-identical records, equal decoded messages, the same CorruptRecord (or
other error) on bad input, the same commit log from a store's append path; GATEWAY_PURE_PYTHON=1
selects the pure path; and where a C compiler is present both extensions must have been built, and
chosen."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import Message, MessageType, appending, codec
from store.message import path_hash
from tests.store.support import ROOT, install_clock, open_store

I32, I64 = (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1)


def _compiler() -> str | None:
    """The C compiler extensions are built with, when it is installed."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    return shutil.which(cc[0]) if cc else None


EXTENSIONS = ("store._codec_speedups", "store._append_speedups")


@pytest.mark.parametrize("name", EXTENSIONS)
def test_extension_is_built_where_a_compiler_is(name: str) -> None:
    """`uv sync` (hatch_build.py) builds both extensions wherever a C compiler is present."""
    if _compiler() is None:
        pytest.skip("no C compiler: the store runs pure Python")
    assert importlib.util.find_spec(name) is not None, "a C compiler is present but not built"


def test_the_built_extensions_are_chosen() -> None:
    """Built, they are what codec.py and appending.py run (unless GATEWAY_PURE_PYTHON=1)."""
    if os.environ.get(codec.PURE_PYTHON_ENV, "") not in ("", "0"):
        pytest.skip("this process runs pure Python (GATEWAY_PURE_PYTHON=1)")
    codec_sp = pytest.importorskip("store._codec_speedups")
    append_sp = pytest.importorskip("store._append_speedups")
    assert codec.speedups is codec_sp and codec.encode is codec_sp.encode, "built but not chosen"
    assert appending._compiled is append_sp and appending.Appender.place is append_sp.place


@pytest.fixture(scope="module")
def sp():
    """The compiled codec, bound to the pure functions whichever path this process chose."""
    mod = pytest.importorskip("store._codec_speedups")
    codec.bind_speedups(mod)
    return mod


@pytest.fixture(scope="module")
def append_sp(sp):
    """The compiled append loop (it encodes with the compiled codec), bound likewise."""
    mod = pytest.importorskip("store._append_speedups")
    appending.bind_speedups(mod)
    return mod


def _outcome(fn, *args):
    """What a call gives: ("ok", value) or ("error", type, message)."""
    try:
        return ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 - the comparison is the point
        return ("error", type(e), str(e))


texts = st.text(max_size=40)
messages = st.builds(
    Message,
    topic=st.text(min_size=1, max_size=40),
    body=st.binary(max_size=300),
    tag=texts,
    keys=st.lists(st.text(min_size=1, max_size=10), max_size=3).map(tuple),
    properties=st.dictionaries(texts, texts, max_size=4),
    message_group=texts,
    deliver_at=st.integers(*I64),
    born_host=texts,
    msg_type=st.sampled_from(MessageType),
)
where = st.tuples(st.integers(*I32), st.integers(*I64), st.integers(*I64), texts, st.integers(*I64))


@given(msg=messages, at=where)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_encode_and_decode_match_the_reference(sp, msg: Message, at: tuple) -> None:
    qid, qoff, store_ts, mid, born = at
    rec = codec.py_encode(msg, qid, qoff, store_ts, mid, born)
    assert sp.encode(msg, qid, qoff, store_ts, mid, born) == rec
    assert sp.check(rec, 0, len(rec)) == codec.py_check(rec, 0, len(rec))
    assert sp.decode(rec, 0, 77) == codec.py_decode(rec, 0, 77)
    assert sp.decode_checked(rec, 5) == codec.py_decode_checked(rec, 5)
    framed = memoryview(b"\0" * 13 + rec + b"\1" * 5)
    assert sp.decode(framed, 13, 9) == codec.py_decode(framed, 13, 9)
    assert sp.check(framed, 13, len(framed)) == codec.py_check(framed, 13, len(framed))


@given(
    msg=messages,
    qid=st.integers(-(2**40), 2**40),
    ints=st.tuples(*[st.integers(-(2**70), 2**70)] * 3),
    flags=st.integers(-5, 2**17),
    mtype=st.integers(-3, 300),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_out_of_range_fields_fail_as_the_reference(sp, msg, qid, ints, flags, mtype) -> None:
    msg.msg_type = mtype
    args = (msg, qid, ints[0], ints[1], "id", ints[2], flags)
    assert _outcome(sp.encode, *args) == _outcome(codec.py_encode, *args)


@pytest.mark.parametrize(
    "change",
    [
        {"topic": "t\ud800"},  # a lone surrogate: not UTF-8
        {"tag": "\udfff"},
        {"properties": {"k": "\ud800"}},
        {"properties": {"k": 1}},
        {"body": bytearray(b"abc")},  # bytes-like bodies go the pure way
        {"body": memoryview(b"abc")},
        {"topic": "x" * 70_000},  # longer than its u16 length field
        {"keys": ("a", "b\x1fc")},
    ],
)
def test_awkward_messages_match_the_reference(sp, change) -> None:
    msg = Message("t", b"body")
    for k, v in change.items():
        setattr(msg, k, v)
    args = (msg, 1, 2, 3, "mid", 4)
    assert _outcome(sp.encode, *args) == _outcome(codec.py_encode, *args)


@given(msg=messages, cuts=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=3))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_corrupt_records_fail_as_the_reference(sp, msg, cuts) -> None:
    """Flipped bytes, cut records, bad bounds: the same (size, magic) or the same CorruptRecord."""
    data = bytearray(codec.py_encode(msg, 1, 2, 3, "mid", 4) + codec.encode_blank(12))
    for pos, value in cuts:
        if pos < len(data):
            data[pos] = value
    buf = bytes(data)
    for b in (buf, buf[: len(buf) // 2], buf[:9]):
        for pos, limit in ((0, len(b)), (0, len(b) + 3), (3, len(b)), (-2, len(b)), (0, 5)):
            assert _outcome(sp.check, b, pos, limit) == _outcome(codec.py_check, b, pos, limit)
        assert _outcome(sp.decode_checked, b, 1) == _outcome(codec.py_decode_checked, b, 1)


@given(data=st.binary(max_size=9000))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_crc32_and_path_hash_match_zlib(sp, append_sp, data: bytes) -> None:
    assert sp.crc32(data) == zlib.crc32(data)
    text = data.decode("latin-1")
    assert append_sp.path_hash(text) == path_hash(text)


def test_large_records_check_as_the_reference(sp) -> None:
    """Records past the slicing-by-8 loop (zlib's own CRC) and a legacy property block."""
    big = codec.py_encode(Message("t", os.urandom(100_000)), 0, 0, 1, "id", 1)
    assert sp.check(big, 0, len(big)) == codec.py_check(big, 0, len(big)) == (len(big), codec.MAGIC_MESSAGE)
    bad = big[:-1] + bytes([big[-1] ^ 1])
    assert _outcome(sp.check, bad, 0, len(bad)) == ("error", codec.CorruptRecord, "crc mismatch")


MESSAGES = [
    Message("plain", b"x" * 100),
    Message("plain", b"y" * 3000, tag="t1"),
    Message("keyed", b"k", keys=("a", "b"), born_host="h:1", born_timestamp=123),
    Message("paths", b"p", properties={"mqtt.topic": "paths/dev1/temp", "x": "ü"}),
    Message("fifo", b"f", message_group="g1", msg_type=MessageType.FIFO),
    Message("plain", b"q", queue_id=2, message_id="C0FFEE" * 6),  # another id length: general index entry
]


async def _commit_log(tmp: Path, pure: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, list]:
    """Append MESSAGES (repeated past a segment end) at a fixed clock; the commit log, the results
    and the derived files (consume queues, index)."""
    with monkeypatch.context() as mp:
        install_clock(lambda: 1_700_000_000_000, mp.setattr)
        if pure:
            for name in ("append", "place", "on_readable", "on_durable"):
                mp.setattr(appending.Appender, name, getattr(appending.Appender, "py_" + name))
            mp.setattr(codec, "encode", codec.py_encode)
        store = await open_store(data_dir=str(tmp), segment_size=64 * 1024)
        try:
            results = []
            for round_ in range(40):
                msgs = [
                    Message(m.topic, m.body, m.tag, m.keys, m.properties, m.message_group) for m in MESSAGES
                ]
                for m, src in zip(msgs, MESSAGES, strict=True):
                    m.message_id = src.message_id or f"{round_:04d}" + "A" * 28
                    m.born_timestamp, m.queue_id, m.msg_type = src.born_timestamp, src.queue_id, src.msg_type
                results += await asyncio.gather(*(store.append(m) for m in msgs))
            results += await store.append_many([Message("plain", b"b")] * 3)
            got = [store.get_by_id(r.message_id)[-1] for r in results]
        finally:
            await store.close()
    log = b"".join(p.read_bytes() for p in sorted((tmp / "commitlog").iterdir()))
    # consume queue entries (tag and path hashes) and index entries, as the close wrote them
    derived = {
        str(p.relative_to(tmp)): p.read_bytes()
        for d in ("consumequeue", "index")
        for p in sorted((tmp / d).rglob("*"))
        if p.is_file()
    }
    return log, [results, got, derived]


async def test_the_append_path_writes_the_same_commit_log(append_sp, tmp_path, monkeypatch) -> None:
    if codec.speedups is None:
        pytest.skip("this process runs pure Python (GATEWAY_PURE_PYTHON=1): nothing to compare")
    compiled = await _commit_log(tmp_path / "compiled", False, monkeypatch)
    pure = await _commit_log(tmp_path / "pure", True, monkeypatch)
    assert len(compiled[0]) > 64 * 1024  # it crossed a segment end (a padding record)
    assert compiled[1][2]["index/index.dat"] and sum(map(len, compiled[1][2].values())) > 240 * 28
    assert compiled == pure


@pytest.mark.parametrize("env", ["1", None])
def test_gateway_pure_python_selects_the_pure_path(sp, env: str | None) -> None:
    probe = (
        "from store import appending, codec\n"
        "print(codec.speedups is None, codec.encode is codec.py_encode, "
        "appending.Appender.place is appending.Appender.py_place)"
    )
    assert run_probe(probe, env) == (["True"] * 3 if env == "1" else ["False"] * 3)


def run_probe(probe: str, pure_env: str | None) -> list[str]:
    """What the Python snippet `probe` prints (split) in a fresh interpreter whose
    GATEWAY_PURE_PYTHON is `pure_env` (None: unset)."""
    environ = {k: v for k, v in os.environ.items() if k != "GATEWAY_PURE_PYTHON"}
    if pure_env is not None:
        environ["GATEWAY_PURE_PYTHON"] = pure_env
    return subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=environ, capture_output=True, text=True, check=True
    ).stdout.split()
