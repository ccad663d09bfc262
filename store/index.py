"""Index of message ids and keys to commit log offsets.

In memory two dicts; on disk an append-only file of entries (u8 kind, u16 length, key bytes,
i64 commit log offset) written with each flush and rebuilt past the recovery checkpoint, like
the consume queues. Retention rewrites the file without entries whose segment is gone.
"""

from __future__ import annotations

import os
import struct

_HEAD = struct.Struct("<BH")
_CLO = struct.Struct("<q")
ID32 = struct.Struct(
    "<BH32sq"
)  # the common entry: a 32-character message id, no keys (the append path packs it itself)
KIND_ID = 0
KIND_KEY = 1


class MessageIndex:
    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "index.dat")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.ids: dict[str, int | list[int]] = {}
        self.keys: dict[str, int | list[int]] = {}
        self.length = 0  # bytes of the file that are loaded and valid
        self.mem = bytearray()  # entries of durable records not yet in the file (see take_flush)

    def load(self, below: int) -> None:
        """Load entries for commit log offsets below `below`; cut the file there (the rest is rebuilt)."""
        self.ids.clear()
        self.keys.clear()
        size = os.fstat(self.fd).st_size
        data = os.pread(self.fd, size, 0)
        pos, end = 0, len(data)
        while pos + 3 <= end:
            kind, n = _HEAD.unpack_from(data, pos)
            if pos + 3 + n + 8 > end:
                break
            try:
                key = data[pos + 3 : pos + 3 + n].decode()
            except UnicodeDecodeError:
                break
            (clo,) = _CLO.unpack_from(data, pos + 3 + n)
            if clo >= below:
                break
            _put(self.ids if kind == KIND_ID else self.keys, key, clo)
            pos += 11 + n
        self.length = pos
        if size != pos:
            os.ftruncate(self.fd, pos)

    @staticmethod
    def encode(msg_id: str, keys: tuple[str, ...], clo: int) -> bytes:
        b = msg_id.encode()
        if not keys and len(b) == 32:
            return ID32.pack(KIND_ID, 32, b, clo)
        out = _HEAD.pack(KIND_ID, len(b)) + b + _CLO.pack(clo)
        for k in keys:
            kb = k.encode()
            out += _HEAD.pack(KIND_KEY, len(kb)) + kb + _CLO.pack(clo)
        return out

    def take_flush(self) -> bytes:
        """Loop: the in-memory entries, for a checkpoint to `append_file` and `sync`."""
        data = bytes(self.mem)
        self.mem = bytearray()
        return data

    def append_file(self, data: bytes) -> None:
        os.pwrite(self.fd, data, self.length)
        self.length += len(data)

    def add(self, msg_id: str, keys: tuple[str, ...], clo: int) -> None:
        _put(self.ids, msg_id, clo)
        for k in keys:
            _put(self.keys, k, clo)

    def by_id(self, msg_id: str) -> list[int]:
        v = self.ids.get(msg_id)
        return [] if v is None else [v] if isinstance(v, int) else list(v)

    def by_key(self, key: str) -> list[int]:
        v = self.keys.get(key)
        return [] if v is None else [v] if isinstance(v, int) else list(v)

    def drop_below(self, min_clo: int) -> None:
        """Forget entries below `min_clo` and rewrite the file without them (and without `mem`,
        whose entries the dicts hold too). Not while a checkpoint writes the file."""
        self.mem = bytearray()
        for d in (self.ids, self.keys):
            for k in list(d):
                v = d[k]
                if isinstance(v, int):
                    if v < min_clo:
                        del d[k]
                else:
                    kept = [c for c in v if c >= min_clo]
                    if not kept:
                        del d[k]
                    else:
                        d[k] = kept[0] if len(kept) == 1 else kept
        entries = []
        for kind, d in ((KIND_ID, self.ids), (KIND_KEY, self.keys)):
            for k, v in d.items():
                kb = k.encode()
                for c in [v] if isinstance(v, int) else v:
                    entries.append((c, kind, kb))
        entries.sort()  # the file is in commit log order: recovery cuts it by offset
        data = b"".join(_HEAD.pack(kind, len(kb)) + kb + _CLO.pack(c) for c, kind, kb in entries)
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.rename(tmp, self.path)
        os.close(self.fd)
        self.fd = fd
        self.length = len(data)

    def forget_from(self, clo: int) -> None:
        """Loop: forget the entries at or past commit log offset `clo` (the log was cut there;
        `mem` must be empty: a checkpoint wrote it). `cut_file` cuts the file."""
        assert not self.mem
        for d in (self.ids, self.keys):
            for k in list(d):
                v = d[k]
                if isinstance(v, int):
                    if v >= clo:
                        del d[k]
                else:
                    kept = [c for c in v if c < clo]
                    if not kept:
                        del d[k]
                    else:
                        d[k] = kept[0] if len(kept) == 1 else kept

    def cut_file(self, clo: int) -> None:
        """IO thread: cut the file before its first entry at or past `clo` (it is in commit log
        order) and sync it."""
        data = os.pread(self.fd, self.length, 0)
        pos = 0
        while pos < len(data):
            _kind, n = _HEAD.unpack_from(data, pos)
            if _CLO.unpack_from(data, pos + 3 + n)[0] >= clo:
                break
            pos += 11 + n
        if pos != self.length:
            os.ftruncate(self.fd, pos)
            self.length = pos
        os.fsync(self.fd)

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def _put(d: dict[str, int | list[int]], key: str, clo: int) -> None:
    v = d.get(key)
    if v is None:
        d[key] = clo
    elif isinstance(v, int):
        if v != clo:
            d[key] = [v, clo]
    elif v[-1] != clo:
        v.append(clo)
