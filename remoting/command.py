"""Remoting frames: `RemotingCommand`, its JSON and ROCKETMQ (binary) headers, and the incremental
`Decoder`.

Frame (big-endian)::

    int32 length                      = 4 + header length + body length (excludes itself)
    int32 (serialize type << 24) | header length
    header                            JSON (type 0) or ROCKETMQ binary (type 1)
    body

Decoding is lenient (extFields values of any JSON type become strings, unknown header keys are
ignored, a missing `extFields` is empty); encoding is strict (JSON, string extFields, keys sorted
like fastjson, `remark` omitted when None).

JSON headers go through orjson (every frame of the CLUSTER store protocol has one, both ways: the
stdlib's json took 11-12 µs per header, orjson 1-2). The stdlib stays the fallback for what orjson
refuses and the stdlib accepts (NaN, integers past 64 bits, lone surrogates), so what decoded
before still does, and the bytes written are the same (`tests/remoting/test_codec_frames.py`)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import orjson

from .codes import FLAG_ONEWAY, FLAG_RESPONSE, JSON, LANGUAGE_CODES, ROCKETMQ, SERVER_VERSION, language_name

MAX_FRAME_SIZE = 16 * 1024 * 1024  # Netty's LengthFieldBasedFrameDecoder(16777216, ...)
_II = struct.Struct(">II")
_I = struct.Struct(">I")
_BIN_HEAD = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_SERIALIZE_NAMES = {JSON: "JSON", ROCKETMQ: "ROCKETMQ"}


class RemotingCodecError(ValueError):
    """A frame that cannot be decoded: the connection must be closed."""


class FrameTooLarge(RemotingCodecError):
    pass


@dataclass(slots=True)
class RemotingCommand:
    """One request or response. `ext_fields` is the string map Java calls extFields."""

    code: int
    opaque: int = 0
    flag: int = 0
    language: str = "PYTHON"
    version: int = SERVER_VERSION
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: int = JSON  # as received; encode() always writes JSON unless told otherwise

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(
        self,
        code: int,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The response to this request: same opaque, response flag set."""
        return RemotingCommand(
            code, self.opaque, FLAG_RESPONSE, remark=remark, ext_fields=ext_fields or {}, body=body
        )

    def encode(self, serialize_type: int = JSON) -> bytes:
        return encode_command(self, serialize_type)


def _ext_value(v: object) -> str | None:
    """extFields values as Java would read them: strings; JSON true/false as Java's Boolean.toString."""
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, dict | list):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _int(v: object, name: str) -> int:
    if type(v) is int:  # the common case, fast
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    try:
        return int(str(v).strip()) if v is not None else 0
    except ValueError:
        raise RemotingCodecError(f"header field {name} is not an integer: {v!r}") from None


# ---------------------------------------------------------------------------------------- encode


def _json_head(cmd: RemotingCommand) -> dict[str, object]:
    """The header's fields, the top-level keys in sorted order (extFields as given)."""
    ext = cmd.ext_fields
    if not all(type(v) is str for v in ext.values()):
        ext = {k: (v if isinstance(v, str) else _ext_value(v) or "") for k, v in ext.items()}
    head: dict[str, object] = {
        "code": cmd.code,
        "extFields": ext,
        "flag": cmd.flag,
        "language": cmd.language,
        "opaque": cmd.opaque,
    }
    if cmd.remark is not None:
        head["remark"] = cmd.remark
    head["serializeTypeCurrentRPC"] = "JSON"
    head["version"] = cmd.version
    return head


def encode_json_header(cmd: RemotingCommand) -> bytes:
    """The JSON header, keys sorted like fastjson's output, every extFields value a string."""
    try:
        return orjson.dumps(_json_head(cmd), option=orjson.OPT_SORT_KEYS)  # (sorts extFields)
    except TypeError:  # (orjson.JSONEncodeError) e.g. a lone surrogate: the stdlib's error, as before
        return stdlib_json_header(cmd)


def stdlib_json_header(cmd: RemotingCommand) -> bytes:
    """`encode_json_header` by the stdlib's json: the fallback, and the reference the tests hold
    orjson's bytes to."""
    head = _json_head(cmd)
    head["extFields"] = dict(sorted(head["extFields"].items()))  # type: ignore[attr-defined]
    return json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode()


def encode_binary_header(cmd: RemotingCommand) -> bytes:
    """The ROCKETMQ binary header (RocketMQSerializable): code must fit int16."""
    if not -32768 <= cmd.code <= 32767:
        raise ValueError(f"code {cmd.code} does not fit the binary header (int16): use JSON")
    parts = [
        _BIN_HEAD.pack(
            cmd.code, LANGUAGE_CODES.get(cmd.language, 7), cmd.version & 0x7FFF, cmd.opaque, cmd.flag
        )
    ]
    remark = cmd.remark.encode() if cmd.remark else b""
    parts += (_I.pack(len(remark)), remark)
    ext = bytearray()
    for k, v in cmd.ext_fields.items():
        kb, vb = k.encode(), str(v).encode()
        ext += struct.pack(">h", len(kb)) + kb + _I.pack(len(vb)) + vb
    parts += (_I.pack(len(ext)), bytes(ext))
    return b"".join(parts)


def encode_command(cmd: RemotingCommand, serialize_type: int = JSON) -> bytes:
    """A whole frame. The gateway always answers in JSON (every client reads it)."""
    header = encode_binary_header(cmd) if serialize_type == ROCKETMQ else encode_json_header(cmd)
    hl = len(header)
    return _II.pack(4 + hl + len(cmd.body), (serialize_type << 24) | hl) + header + cmd.body


# ---------------------------------------------------------------------------------------- decode


def _parse_json(data: bytes | memoryview) -> object:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass  # maybe what only the stdlib reads (NaN, integers past 64 bits, lone surrogates)
    try:
        return json.loads(bytes(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RemotingCodecError(f"header is not JSON: {e}") from None


def decode_json_header(data: bytes | memoryview) -> RemotingCommand:
    h = _parse_json(data)
    if not isinstance(h, dict):
        raise RemotingCodecError("header is not a JSON object")
    if "code" not in h:
        raise RemotingCodecError("header has no code")
    raw_ext = h.get("extFields")
    ext: dict[str, str] = {}
    if isinstance(raw_ext, dict):
        for k, v in raw_ext.items():
            if type(v) is str:  # the common case, fast
                ext[k] = v
            else:
                s = _ext_value(v)
                if s is not None:
                    ext[k] = s
    elif raw_ext is not None:
        raise RemotingCodecError("extFields is not a JSON object")
    lang = h.get("language")
    if isinstance(lang, int) and not isinstance(lang, bool):
        lang = language_name(lang)
    remark = h.get("remark")
    return RemotingCommand(
        code=_int(h["code"], "code"),
        opaque=_int(h.get("opaque", 0), "opaque"),
        flag=_int(h.get("flag", 0), "flag"),
        language=str(lang) if lang is not None else "OTHER",
        version=_int(h.get("version", 0), "version"),
        remark=None if remark is None else str(remark),
        ext_fields=ext,
        serialize_type=JSON,
    )


def decode_binary_header(data: bytes | memoryview) -> RemotingCommand:
    buf = bytes(data)
    try:
        code, lang, version, opaque, flag = _BIN_HEAD.unpack_from(buf, 0)
        pos = _BIN_HEAD.size
        (rl,) = _I.unpack_from(buf, pos)
        pos += 4
        if rl > len(buf) - pos:
            raise RemotingCodecError("binary header remark length exceeds the header")
        remark = buf[pos : pos + rl].decode() if rl else None
        pos += rl
        (el,) = _I.unpack_from(buf, pos)
        pos += 4
        end = pos + el
        if end > len(buf):
            raise RemotingCodecError("binary header extFields length exceeds the header")
        ext: dict[str, str] = {}
        while pos < end:
            (kl,) = struct.unpack_from(">h", buf, pos)
            pos += 2
            k = buf[pos : pos + kl].decode()
            pos += kl
            (vl,) = _I.unpack_from(buf, pos)
            pos += 4
            if pos + vl > end or kl < 0:
                raise RemotingCodecError("binary header extFields entry exceeds the header")
            ext[k] = buf[pos : pos + vl].decode()
            pos += vl
    except (struct.error, UnicodeDecodeError) as e:
        raise RemotingCodecError(f"malformed binary header: {e}") from None
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        language=language_name(lang),
        version=version,
        remark=remark,
        ext_fields=ext,
        serialize_type=ROCKETMQ,
    )


def decode_frame(frame: bytes | memoryview) -> RemotingCommand:
    """One frame without its leading length word (what the Decoder hands on)."""
    if len(frame) < 4:
        raise RemotingCodecError("frame shorter than its header-length word")
    (word,) = _I.unpack_from(frame, 0)
    stype, hl = word >> 24, word & 0xFFFFFF
    if 4 + hl > len(frame):
        raise RemotingCodecError(f"header length {hl} exceeds the frame ({len(frame)} bytes)")
    header = memoryview(frame)[4 : 4 + hl]
    if stype == JSON:
        cmd = decode_json_header(header)
    elif stype == ROCKETMQ:
        cmd = decode_binary_header(header)
    else:
        raise RemotingCodecError(f"unknown serialize type {stype}")
    cmd.body = bytes(frame[4 + hl :])
    return cmd


def decode_command(data: bytes) -> RemotingCommand:
    """A whole frame including its length word (for tests and simple clients)."""
    (length,) = _I.unpack_from(data, 0)
    if length + 4 != len(data):
        raise RemotingCodecError(f"frame says {length + 4} bytes, got {len(data)}")
    return decode_frame(memoryview(data)[4:])


class Decoder:
    """Incremental frame decoder: `feed(bytes)`, then iterate for complete `RemotingCommand`s.

    Raises `FrameTooLarge` as soon as a length word exceeds `max_frame_size` (before buffering the
    frame) and `RemotingCodecError` for a malformed frame; either way the connection is done."""

    __slots__ = ("_buf", "max_frame_size")

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self.max_frame_size = max_frame_size

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def __iter__(self) -> Decoder:
        return self

    def __next__(self) -> RemotingCommand:
        cmd = self.next_command()
        if cmd is None:
            raise StopIteration
        return cmd

    def next_command(self) -> RemotingCommand | None:
        buf = self._buf
        if len(buf) < 4:
            return None
        (length,) = _I.unpack_from(buf, 0)
        if length > self.max_frame_size:
            raise FrameTooLarge(f"frame of {length} bytes exceeds the limit of {self.max_frame_size}")
        if length < 4:
            raise RemotingCodecError(f"frame length {length} is shorter than its header-length word")
        if len(buf) < 4 + length:
            return None
        frame = bytes(buf[4 : 4 + length])
        del buf[: 4 + length]
        return decode_frame(frame)


def serialize_type_name(t: int) -> str:
    return _SERIALIZE_NAMES.get(t, str(t))
