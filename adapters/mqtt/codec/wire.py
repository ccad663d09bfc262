"""Wire primitives: variable byte integers, two-byte lengths, UTF-8 strings and binary data.

Decoders take `(buf, pos, end)` over an immutable `bytes` buffer and return `(value, new_pos)`;
they raise `MQTTCodecError(0x81 Malformed Packet)` when a field runs past `end` or is ill-formed.

UTF-8 policy (MQTT 3.1.1 1.5.3 and 5.0 1.5.4): a string must be well-formed UTF-8 (no overlong
forms, no encoded surrogates U+D800..U+DFFF, nothing above U+10FFFF: Python's strict decoder
enforces all three) and must not contain U+0000; those are MUSTs and break the packet (Malformed).
The spec's SHOULD NOT list (control characters U+0001..U+001F and U+007F..U+009F, and the Unicode
non-characters) is accepted by default, because real devices put such characters in client ids
and topics and the spec only says a receiver MAY reject them; pass `strict=True` (the Decoder's
`strict_utf8`) to reject them as Malformed too.
"""

from __future__ import annotations

import re
import struct

from .constants import MAX_VBI, VALID_REASON_CODES, PacketType, ReasonCode
from .errors import MQTTCodecError

MALFORMED = ReasonCode.MALFORMED_PACKET
PROTOCOL_ERROR = ReasonCode.PROTOCOL_ERROR

pack_H = struct.Struct(">H").pack
pack_I = struct.Struct(">I").pack
unpack_H = struct.Struct(">H").unpack_from
unpack_I = struct.Struct(">I").unpack_from

# Code points the spec says SHOULD NOT appear (rejected only in strict mode).
_DISCOURAGED = re.compile(
    "[\x01-\x1f\x7f-\x9f\ufdd0-\ufdef"
    + "".join(f"{chr(plane * 0x10000 + 0xFFFE)}{chr(plane * 0x10000 + 0xFFFF)}" for plane in range(17))
    + "]"
).search


def malformed(message: str) -> MQTTCodecError:
    return MQTTCodecError(MALFORMED, message)


def protocol_error(message: str) -> MQTTCodecError:
    return MQTTCodecError(PROTOCOL_ERROR, message)


def reason_code(t: int, code: int) -> int:
    """`code`, when it is a valid reason code of packet type `t`; else a Protocol Error."""
    if code not in VALID_REASON_CODES[t]:
        raise protocol_error(f"reason code 0x{code:02X} is not valid in {PacketType(t).name}")
    return code


def check_text(s: str, what: str, strict: bool) -> None:
    """Apply the UTF-8 content rules to an already decoded string."""
    if "\x00" in s:
        raise malformed(f"{what} contains U+0000")
    if strict and _DISCOURAGED(s):
        raise malformed(f"{what} contains a control character or non-character")


def validate_text(s: str, strict: bool = False) -> bool:
    """True if `s` may be sent as an MQTT UTF-8 string (lone surrogates and U+0000 excluded)."""
    if "\x00" in s:
        return False
    try:
        if len(s.encode("utf-8")) > 0xFFFF:
            return False
    except UnicodeEncodeError:
        return False
    return not (strict and _DISCOURAGED(s))


# --- Variable Byte Integer -------------------------------------------------------------------------

_VBI_SMALL = [bytes((n,)) for n in range(128)] + [bytes((n & 0x7F | 0x80, n >> 7)) for n in range(128, 16384)]


def encode_vbi(n: int) -> bytes:
    if n < 16384:
        return _VBI_SMALL[n]
    if n > MAX_VBI:
        raise ValueError(f"value {n} does not fit a variable byte integer")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def decode_vbi(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a complete variable byte integer inside [pos, end)."""
    value = 0
    shift = 0
    for i in range(4):  # at most 4 bytes: bounded, not a per-byte loop over data
        if pos >= end:
            raise malformed("truncated variable byte integer")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if b == 0 and i:
                raise malformed("variable byte integer not minimally encoded")
            return value, pos
        shift += 7
    raise malformed("variable byte integer longer than 4 bytes")


# --- strings and binary data -----------------------------------------------------------------------


def decode_u16(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos + 2 > end:
        raise malformed("truncated two-byte integer")
    return (buf[pos] << 8) | buf[pos + 1], pos + 2


def decode_str(buf: bytes, pos: int, end: int, what: str, strict: bool) -> tuple[str, int]:
    if pos + 2 > end:
        raise malformed(f"truncated length of {what}")
    q = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if q > end:
        raise malformed(f"{what} runs past the end of the packet")
    try:
        s = buf[pos + 2 : q].decode("utf-8")
    except UnicodeDecodeError:
        raise malformed(f"{what} is not well-formed UTF-8") from None
    if "\x00" in s or strict:
        check_text(s, what, strict)
    return s, q


def decode_bin(buf: bytes, pos: int, end: int, what: str) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise malformed(f"truncated length of {what}")
    q = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if q > end:
        raise malformed(f"{what} runs past the end of the packet")
    return buf[pos + 2 : q], q


def encode_str(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return pack_H(len(b)) + b


def encode_bin(b: bytes) -> bytes:
    if len(b) > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return pack_H(len(b)) + bytes(b)
