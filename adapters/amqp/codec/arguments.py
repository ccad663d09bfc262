"""The generic, table-driven codec of AMQP method arguments (methods.py's SPEC of each class).

`decode_arguments(cls, buf, p, end)` and `encode_arguments(method)` serve every method but the hot
ones (see decoder.py / encoder.py for those). A method payload must be used exactly (no missing or
trailing bytes), as RabbitMQ requires.
"""

from __future__ import annotations

import struct
from typing import Any

from .methods import AMQPMethod
from .wire import (
    _unpack_I,
    _unpack_Q,
    decode_table,
    encode_table,
    pack_H,
    pack_I,
    pack_Q,
)


def decode_arguments(cls: type[AMQPMethod], buf: bytes, p: int, end: int) -> AMQPMethod:
    """Decode the arguments of `cls` from buf[p:end] (which they must fill exactly).

    Raises ValueError, UnicodeDecodeError, IndexError or struct.error when malformed.
    """
    values: list[Any] = []
    append = values.append
    octet = 0
    bit = 0x100  # 0x100: the next bit starts a new octet
    for code, name in cls.SPEC:
        if code == "b":
            if bit == 0x100:
                octet = buf[p]
                p += 1
                bit = 1
            value: Any = (octet & bit) != 0
            bit <<= 1
        else:
            bit = 0x100
            if code == "s" or code == "z":
                q = p + 1 + buf[p]
                if q > end:
                    raise ValueError("short string runs past the end of the arguments")
                value = buf[p + 1 : q].decode("utf-8", "strict" if code == "s" else "surrogateescape")
                p = q
            elif code == "h":
                value = (buf[p] << 8) | buf[p + 1]
                p += 2
            elif code == "l":
                value = _unpack_I(buf, p)[0]
                p += 4
            elif code == "q":
                value = _unpack_Q(buf, p)[0]
                p += 8
            elif code == "o":
                value = buf[p]
                p += 1
            elif code == "S":
                q = p + 4 + _unpack_I(buf, p)[0]
                if q > end:
                    raise ValueError("long string runs past the end of the arguments")
                value = buf[p + 4 : q]
                p = q
            else:  # "F"
                value, p = decode_table(buf, p, end)
        if name is not None:
            append(value)
    if p != end:
        raise ValueError(
            "arguments run past the end of the frame" if p > end else f"{end - p} bytes after the arguments"
        )
    return cls(*values)


def encode_arguments(method: AMQPMethod) -> bytes:
    """The argument bytes of `method` (without class and method ids)."""
    out: list[bytes] = []
    octet = 0
    bit = 0  # 0: no octet of bits pending
    for code, name in method.SPEC:
        value = getattr(method, name) if name is not None else None
        if code == "b":
            if bit == 0x100:
                out.append(bytes((octet,)))
                bit = 0
            if bit == 0:
                octet = 0
                bit = 1
            if value:
                octet |= bit
            bit <<= 1
            continue
        if bit:
            out.append(bytes((octet,)))
            bit = 0
        if code == "s" or code == "z":
            raw = (
                b""
                if value is None
                else value.encode("utf-8", "surrogateescape")
                if type(value) is str
                else bytes(value)
            )
            if len(raw) > 255:
                raise ValueError(f"{method.NAME} {name}: short string of {len(raw)} bytes (more than 255)")
            out.append(bytes((len(raw),)))
            out.append(raw)
        elif code == "h":
            out.append(pack_H(value or 0))
        elif code == "l":
            out.append(pack_I(value or 0))
        elif code == "q":
            out.append(pack_Q(value or 0))
        elif code == "o":
            out.append(struct.pack(">B", value or 0))
        elif code == "S":
            raw = b"" if value is None else value.encode() if type(value) is str else bytes(value)
            out.append(pack_I(len(raw)))
            out.append(raw)
        else:  # "F"
            out.append(encode_table(value))
    if bit:
        out.append(bytes((octet,)))
    return b"".join(out)
