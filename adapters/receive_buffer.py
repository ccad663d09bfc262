"""The bytes a sans-IO decoder has received and not yet decoded: the one rule of feeding them.

Both frame decoders (`adapters/mqtt/codec/decoder.py`, `adapters/amqp/codec/decoder.py`) are
subclasses of `ReceiveBuffer`, which keeps their input the same way (like h11's receive buffer):

- bytes fed while no partial frame is pending are parsed in place from the `bytes` object the
  socket returned (`_buf` from `_pos` on; a bytearray or memoryview is copied once);
- a partial frame's later reads are kept as a list of chunks (`_more`, `_more_len` bytes) and
  joined once, when the `_need` bytes the frame wants (counted from `_pos`) have all arrived, so a
  large frame arriving in many reads costs one join, not a quadratic re-concatenation.

A decoder's step reads `_buf` and `_pos` itself, and only when `_more` is non-empty (a frame that
spanned reads) calls `_join`: no extra call per frame. `_error` is the decoder's stored error:
`feed` raises it unless it has a false `fatal` attribute (AMQP's errors that leave the stream in
sync); after a fatal one the decoder calls `_drop`.
"""

from __future__ import annotations


class ReceiveBuffer:
    """Received bytes, parsed in place, a partial frame's later reads joined once."""

    __slots__ = ("_buf", "_pos", "_more", "_more_len", "_need", "_error")

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0
        self._more: list[bytes] | tuple[()] = ()  # later reads of a partial frame (no list until one)
        self._more_len = 0
        self._need = 0  # bytes from _pos the pending frame needs before it is worth joining
        self._error: Exception | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes (a copy is kept only for bytearray/memoryview or a partial frame)."""
        e = self._error
        if e is not None and getattr(e, "fatal", True):
            raise e
        if not data:
            return
        if self._pos >= len(self._buf) and not self._more:
            self._buf = data if type(data) is bytes else bytes(data)
            self._pos = 0
            self._need = 0
        else:
            data = bytes(data)
            if self._more:
                self._more.append(data)  # type: ignore[union-attr]
            else:
                self._more = [data]
            self._more_len += len(data)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded (a partial frame)."""
        return len(self._buf) - self._pos + self._more_len

    def _join(self) -> bool:
        """With chunks pending: join them after `_buf[_pos:]` once the `_need` bytes are there
        (`_buf` is then the joined bytes from 0, True), else False (more bytes are needed)."""
        if len(self._buf) - self._pos + self._more_len < self._need:
            return False
        self._buf = b"".join([self._buf[self._pos :], *self._more])
        self._pos = 0
        self._more = ()
        self._more_len = 0
        self._need = 0
        return True

    def _drop(self) -> None:
        """Forget everything buffered (after a fatal error: the stream is out of sync)."""
        self._buf = b""
        self._pos = self._more_len = 0
        self._more = ()
