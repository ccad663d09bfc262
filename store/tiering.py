"""Tiered storage: closed commit log segments move to S3-compatible object storage (S3, MinIO, Ceph)
and reads below the local range are served from there through a local block cache.

A tiering pass (`TieredLog.run`, every `tier_interval_ms` and `Store.tier_now`) uploads each closed
segment past `tier_after` (age of its newest record, or beyond the newest `tier_after_bytes` of local
segments) as `<prefix>commitlog/<base:020d>.seg`: a multipart upload whose state is written to
`tier/uploading/<base>.json` before the first part, so that after a crash it resumes (`list_parts`:
parts already there with the same size and MD5 are kept). Each part carries its Content-MD5, the
object our own sha256 of the whole segment; after completing, `head_object` must show both size and
sha256 before the segment goes into `tier/manifest.json` and, last, its local file is deleted.

Reads (`read`, on the event loop) come only from the cache (`tier/cache/`, 1 MiB blocks aligned
within a segment, LRU by bytes): a miss raises `TieredRangeNotCached`, and the async layers
`await fetch(exc)` (ranged GETs in a thread) and read again.

boto3 rather than obstore or aiobotocore: its explicit multipart calls (create / upload_part /
list_parts / complete) are what a resumable, per-part checksummed upload needs (obstore's put hides
the multipart state); its calls block, so they run in threads (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .errors import StoreError, TieredRangeNotCached, TieredStorageUnavailable
from .message import now_ms

if TYPE_CHECKING:
    from .commitlog import CommitLog
    from .config import StoreConfig
    from .retention import SegmentStats

log = logging.getLogger("store.tiering")

BLOCK = 1 << 20  # cache block (aligned within a segment)
HOT_BLOCKS = 8  # blocks also kept in memory (sequential reads of one block hit it many times)
READ_AHEAD = 3  # blocks fetched past a miss in its segment (reads of old data are mostly sequential)
MAX_BACKOFF_MS = 60_000


def manifest_path(data_dir: str) -> str:
    return os.path.join(data_dir, "tier", "manifest.json")


def has_tiered_segments(data_dir: str) -> bool:
    """Whether the data directory's commit log starts in object storage."""
    p = manifest_path(data_dir)
    if not os.path.exists(p):
        return False
    with open(p, "rb") as f:
        return bool(json.loads(f.read()).get("segments"))


def write_json_atomic(path: str, obj: object) -> None:
    """Replace `path` with `obj` as JSON durably: temp file, fsync, rename, directory fsync."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(json.dumps(obj, sort_keys=True).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TierVerifyError(StoreError):
    """An uploaded object does not match the segment (size or sha256)."""


class BlockCache:
    """Blocks of tiered segments in files `<base>-<index>` of one directory, least recently used
    evicted past `max_bytes`; the newest few also in memory. Used from the event loop (the files of
    fetched blocks are written in threads before `add`)."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        os.makedirs(directory, exist_ok=True)
        self.blocks: OrderedDict[tuple[int, int], int] = OrderedDict()  # (base, index) -> size
        self.bytes = 0
        self.hot: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        found = []
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            base, _, idx = name.partition("-")
            if not (base.isdigit() and idx.isdigit()):
                os.unlink(path)  # a temp file of a fetch cut short
                continue
            st = os.stat(path)
            found.append((st.st_mtime, (int(base), int(idx)), st.st_size))
        for _mtime, key, size in sorted(found):
            self.blocks[key] = size
            self.bytes += size
        self._evict()

    def path(self, key: tuple[int, int]) -> str:
        return os.path.join(self.dir, f"{key[0]:020d}-{key[1]}")

    def get(self, key: tuple[int, int]) -> bytes | None:
        data = self.hot.get(key)
        if data is not None:
            self.hot.move_to_end(key)
            self.blocks.move_to_end(key)
            return data
        if key not in self.blocks:
            return None
        try:
            with open(self.path(key), "rb") as f:
                data = f.read()
        except OSError:
            self._remove(key)
            return None
        self.blocks.move_to_end(key)
        self._hot(key, data)
        return data

    def write_file(self, key: tuple[int, int], data: bytes) -> None:
        """(In a thread) the block's file; `add` then makes it part of the cache."""
        tmp = self.path(key) + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path(key))

    def add(self, key: tuple[int, int], data: bytes) -> None:
        if key in self.blocks:
            self.bytes -= self.blocks[key]
        self.blocks[key] = len(data)
        self.bytes += len(data)
        self._hot(key, data)
        self._evict(keep=key)

    def clear(self) -> None:
        for key in list(self.blocks):
            self._remove(key)

    def drop_segment(self, base: int) -> None:
        for key in [k for k in self.blocks if k[0] == base]:
            self._remove(key)

    def _hot(self, key: tuple[int, int], data: bytes) -> None:
        self.hot[key] = data
        self.hot.move_to_end(key)
        while len(self.hot) > HOT_BLOCKS:
            self.hot.popitem(last=False)

    def _evict(self, keep: tuple[int, int] | None = None) -> None:
        while self.bytes > self.max_bytes and self.blocks:
            key = next(iter(self.blocks))
            if key == keep:
                break
            self._remove(key)

    def _remove(self, key: tuple[int, int]) -> None:
        self.bytes -= self.blocks.pop(key, 0)
        self.hot.pop(key, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(key))


class TieredLog:
    """The tiered part of one commit log: its manifest, uploads, cache and fetches.

    `floor()` (set by the store) is the lowest commit log offset that must stay local (held
    delayed and half messages, a compacted topic's records not yet compacted): nothing from its
    segment on is tiered, so those readers never meet a tiered range."""

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        segments: SegmentStats,
        run_io: Callable[..., asyncio.Future] | None = None,
    ) -> None:
        self.config = config
        self.commitlog = commitlog
        self.stats = segments
        self.run_io = run_io
        self.seg_size = config.segment_size
        self.dir = os.path.join(config.data_dir, "tier")
        self.uploading_dir = os.path.join(self.dir, "uploading")
        os.makedirs(self.uploading_dir, exist_ok=True)
        self.cache = BlockCache(os.path.join(self.dir, "cache"), config.tier_cache_bytes)
        self.segments: dict[int, dict[str, Any]] = {}  # base -> {"key", "size", "sha256"}
        self.deleting: list[str] = []  # object keys retention removed, still to delete
        p = manifest_path(config.data_dir)
        if os.path.exists(p):
            with open(p, "rb") as f:
                saved = json.loads(f.read())
            self.segments = {int(b): v for b, v in saved.get("segments", {}).items()}
            self.deleting = list(saved.get("deleting", []))
        self.floor: Callable[[], int | None] = lambda: None
        self.lock = asyncio.Lock()  # one segment's upload-record-drop, or retention's forgetting
        self.after_part: Callable[[int, int], None] | None = None  # test hook: (base, part number)
        self._client_obj: Any = None
        self._fetching: dict[tuple[int, int], asyncio.Future[bytes]] = {}
        self._gets: ThreadPoolExecutor | None = None
        self._failures = 0
        self._next_try = 0.0
        self._reachable = True
        self.uploaded = 0  # segments uploaded by this process
        commitlog.attach_tier(self, sorted(self.segments))

    # ----- object store ------------------------------------------------------------------------
    def key(self, base: int) -> str:
        return f"{self.config.tier_prefix}commitlog/{base:020d}.seg"

    def _client(self) -> Any:
        if self._client_obj is None:
            import boto3
            from botocore.config import Config

            timeout = self.config.tier_timeout_ms / 1000
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            self._client_obj = boto3.session.Session().client(
                "s3",
                endpoint_url=self.config.tier_endpoint,
                region_name=region,
                config=Config(
                    connect_timeout=min(2.0, timeout),
                    read_timeout=timeout,
                    retries={"total_max_attempts": 3, "mode": "standard"},
                    s3={"addressing_style": "path"},
                ),
            )
        return self._client_obj

    # ----- reading -----------------------------------------------------------------------------
    def has(self, offset: int) -> bool:
        return offset - offset % self.seg_size in self.segments

    def read(self, offset: int, size: int) -> bytes:
        """`size` bytes at `offset` of a tiered segment, from the cache; KeyError when no tiered
        segment holds them, TieredRangeNotCached when a block is not cached."""
        base = offset - offset % self.seg_size
        if base not in self.segments or offset + size > base + self.seg_size:
            raise KeyError(f"commit log offset {offset} is not stored")
        pos = offset - base
        first, last = pos // BLOCK, (pos + max(size, 1) - 1) // BLOCK
        get = self.cache.get
        if first == last:
            data = get((base, first))
            if data is None:
                raise TieredRangeNotCached(offset, size)
            at = pos - first * BLOCK
            return data[at : at + size]
        parts = []
        for i in range(first, last + 1):
            data = get((base, i))
            if data is None:
                raise TieredRangeNotCached(offset, size)
            parts.append(data)
        at = pos - first * BLOCK
        return b"".join(parts)[at : at + size]

    async def fetch(self, miss: TieredRangeNotCached) -> None:
        """Bring the blocks of a missed range into the cache (ranged GETs in threads);
        TieredStorageUnavailable when the object store fails or does not answer in time."""
        base = miss.offset - miss.offset % self.seg_size
        if base not in self.segments:
            return  # retention removed it meanwhile: the next read says "not stored"
        pos = miss.offset - base
        first, last = pos // BLOCK, (pos + max(miss.size, 1) - 1) // BLOCK
        last = min(last + READ_AHEAD, (self.segments[base]["size"] - 1) // BLOCK)
        waits: list[asyncio.Future] = []
        run: list[int] = []  # blocks neither cached nor being fetched, in a row: one GET for them
        for i in range(first, last + 2):
            key = (base, i)
            if i <= last and key not in self.cache.blocks and key not in self._fetching:
                run.append(i)
                continue
            if run:
                waits.append(self._start_fetch(base, run))
                run = []
            if i <= last and key in self._fetching:
                waits.append(self._fetching[key])
        if waits:  # (the GETs run side by side)
            await asyncio.shield(asyncio.gather(*waits))

    def _start_fetch(self, base: int, blocks: list[int]) -> asyncio.Future:
        """One ranged GET of consecutive blocks (fewer requests: each costs the threads' Python
        work, which the event loop waits for the GIL behind); every block's fetch is that one."""
        fut = asyncio.ensure_future(self._fetch_blocks(base, blocks[0], blocks[-1]))
        for i in blocks:
            self._fetching[(base, i)] = fut
            fut.add_done_callback(lambda _f, key=(base, i): self._fetching.pop(key, None))
        return fut

    async def _fetch_blocks(self, base: int, first: int, last: int) -> None:
        lo = first * BLOCK
        hi = min((last + 1) * BLOCK, self.segments[base]["size"]) - 1
        try:
            get = asyncio.get_running_loop().run_in_executor(self._get_pool(), self._get_range, base, lo, hi)
            data = await asyncio.wait_for(get, 4 * self.config.tier_timeout_ms / 1000)
        except Exception as e:  # noqa: BLE001 - any failure of the object store is "unavailable"
            raise TieredStorageUnavailable(f"tiered storage unreachable: {_describe(e)}") from None
        if len(data) != hi - lo + 1:
            raise TieredStorageUnavailable(f"tiered storage returned {len(data)} bytes of {hi - lo + 1}")
        if base in self.segments:
            for i in range(first, last + 1):
                self.cache.add((base, i), data[(i - first) * BLOCK : (i - first + 1) * BLOCK])

    def _get_pool(self) -> ThreadPoolExecutor:
        """The GETs' own threads (cold_reads.py): reads back never queue behind other threads' work."""
        if self._gets is None:
            n = self.config.tier_fetch_threads
            self._gets = ThreadPoolExecutor(n, thread_name_prefix="store-tier-get")
        return self._gets

    def close(self) -> None:
        if self._gets is not None:
            self._gets.shutdown(wait=False, cancel_futures=True)

    def _get_range(self, base: int, lo: int, hi: int) -> bytes:
        """(Thread) bytes [lo, hi] of a tiered segment (whole blocks), each block's cache file written."""
        r = self._client().get_object(
            Bucket=self.config.tier_bucket, Key=self.key(base), Range=f"bytes={lo}-{hi}"
        )
        data = r["Body"].read()
        for at in range(0, len(data), BLOCK):
            self.cache.write_file((base, (lo + at) // BLOCK), data[at : at + BLOCK])
        return data

    # ----- uploading ---------------------------------------------------------------------------
    def candidates(self, now: int) -> list[int]:
        """Bases of the local segments to upload now: closed, below the floor, past tier_after."""
        cl, seg = self.commitlog, self.seg_size
        limit = cl.write_pos - cl.write_pos % seg  # the active segment's base
        floor = self.floor()
        if floor is not None:
            limit = min(limit, floor - floor % seg)
        local = [s.base for s in cl.segments()]
        if self.config.tier_after_bytes is not None:
            keep, kept = set(), 0
            for b in sorted((b for b in local if b <= cl.write_pos), reverse=True):  # newest first
                if kept + seg > self.config.tier_after_bytes:
                    break
                keep.add(b)
                kept += seg
            return [b for b in local if b + seg <= limit and b not in keep]
        out = []
        for b in local:
            if b + seg > limit:
                break
            if b in self.segments:
                out.append(b)  # uploaded, its local file not yet deleted (a crash)
                continue
            per_topic = self.stats.by_base.get(b)
            if per_topic:
                newest = max(ts for _n, ts in per_topic.values())
            else:
                try:
                    newest = int(os.stat(cl._path(b)).st_mtime * 1000)
                except FileNotFoundError:
                    continue
            if now - newest < self.config.tier_after_ms:
                break  # later segments are newer
            out.append(b)
        return out

    async def run(self, now: int | None = None, force: bool = False) -> int:
        """One tiering pass: upload what is due, delete what retention removed; returns how many
        segments were tiered. While the object store fails, passes back off (one warning) unless
        `force`."""
        if not force and time.monotonic() < self._next_try:
            return 0
        now = now_ms() if now is None else now
        done = 0
        try:
            if self.deleting:
                async with self.lock:
                    await asyncio.to_thread(self._delete_objects)
            for base in self.candidates(now):
                async with self.lock:
                    if await self._tier_segment(base):
                        done += 1
        except Exception as e:  # noqa: BLE001 - any failure is retried with back-off
            self._failed(e)
            return done
        if not self._reachable:
            log.warning("tiered storage reachable again: uploads resume")
        self._reachable, self._failures, self._next_try = True, 0, 0.0
        return done

    def _failed(self, e: BaseException) -> None:
        self._failures += 1
        delay = min(self.config.tier_interval_ms * 2 ** min(self._failures, 16), MAX_BACKOFF_MS)
        self._next_try = time.monotonic() + delay / 1000
        if self._reachable:
            log.warning("tiered storage: upload failed, retrying with back-off: %s", _describe(e))
        self._reachable = False

    async def _tier_segment(self, base: int) -> bool:
        """Upload (or resume), verify, record, then delete the local file. False: not local now."""
        cl = self.commitlog
        seg = next((s for s in cl.segments() if s.base == base), None)
        if seg is None:
            return False  # retention deleted it meanwhile
        if base not in self.segments:
            meta = await asyncio.to_thread(self._upload, base, seg.path)
            state = os.path.join(self.uploading_dir, f"{base:020d}.json")
            if cl.segment_for(base) is not seg:  # retention took it meanwhile
                await asyncio.to_thread(self._delete_key, meta["key"])
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(state)
                return False
            self.segments[base] = meta
            await asyncio.to_thread(self._save_manifest, self._manifest())
            with contextlib.suppress(FileNotFoundError):
                os.unlink(state)
            cl.set_tiered(sorted(self.segments))
            self.uploaded += 1
        drop = cl.drop_local
        await (self.run_io(drop, base) if self.run_io else asyncio.to_thread(drop, base))
        return True

    def _upload(self, base: int, path: str) -> dict[str, Any]:
        """(Thread) upload one segment file, resuming a multipart upload a crash interrupted."""
        c, bucket, key = self._client(), self.config.tier_bucket, self.key(base)
        state_path = os.path.join(self.uploading_dir, f"{base:020d}.json")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            sha = hashlib.sha256()
            while chunk := f.read(1 << 20):
                sha.update(chunk)
        digest = sha.hexdigest()
        meta = {"key": key, "size": size, "sha256": digest}
        state = None
        if os.path.exists(state_path):
            with open(state_path, "rb") as f:
                state = json.loads(f.read())
            if state.get("sha256") != digest or state.get("size") != size:
                state = None
        existing: dict[int, dict] = {}
        if state is not None:
            if self._matches(c, key, size, digest):
                return meta  # completed before a crash
            try:
                existing = self._list_parts(c, key, state["upload_id"])
            except c.exceptions.ClientError as e:
                if _code(e) not in ("NoSuchUpload", "404"):
                    raise
                state = None
        if state is None:
            r = c.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"sha256": digest})
            state = {"upload_id": r["UploadId"], "sha256": digest, "size": size, "key": key}
            write_json_atomic(state_path, state)
        uid, part_size, parts = state["upload_id"], self.config.tier_part_size, []
        with open(path, "rb") as f:
            for n, start in enumerate(range(0, size, part_size), 1):
                body = os.pread(f.fileno(), min(part_size, size - start), start)
                md5 = hashlib.md5(body)
                etag = f'"{md5.hexdigest()}"'
                have = existing.get(n)
                if have is not None and have["Size"] == len(body) and have["ETag"] == etag:
                    parts.append({"PartNumber": n, "ETag": have["ETag"]})
                    continue
                r = c.upload_part(
                    Bucket=bucket,
                    Key=key,
                    UploadId=uid,
                    PartNumber=n,
                    Body=body,
                    ContentMD5=base64.b64encode(md5.digest()).decode(),
                )
                parts.append({"PartNumber": n, "ETag": r["ETag"]})
                if self.after_part is not None:
                    self.after_part(base, n)
        c.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
        if not self._matches(c, key, size, digest):
            c.delete_object(Bucket=bucket, Key=key)
            os.unlink(state_path)  # the next pass starts over
            raise TierVerifyError(f"uploaded object {key} does not match segment {base}")
        return meta

    def _matches(self, c: Any, key: str, size: int, digest: str) -> bool:
        try:
            h = c.head_object(Bucket=self.config.tier_bucket, Key=key)
        except c.exceptions.ClientError as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return h["ContentLength"] == size and h.get("Metadata", {}).get("sha256") == digest

    def _list_parts(self, c: Any, key: str, uid: str) -> dict[int, dict]:
        out: dict[int, dict] = {}
        marker = 0
        while True:
            r = c.list_parts(Bucket=self.config.tier_bucket, Key=key, UploadId=uid, PartNumberMarker=marker)
            for p in r.get("Parts", []):
                out[p["PartNumber"]] = p
            if not r.get("IsTruncated"):
                return out
            marker = r["NextPartNumberMarker"]

    # ----- manifest and retention --------------------------------------------------------------
    def _manifest(self) -> dict:
        return {"segments": {str(b): m for b, m in self.segments.items()}, "deleting": list(self.deleting)}

    def _save_manifest(self, manifest: dict) -> None:
        write_json_atomic(manifest_path(self.config.data_dir), manifest)

    async def forget_before(self, offset: int) -> int:
        """Retention: drop the tiered segments that end at or before `offset` from the manifest
        (their objects are deleted by the next passes); returns how many."""
        async with self.lock:
            gone = [b for b in self.segments if b + self.seg_size <= offset]
            if not gone:
                return 0
            for b in gone:
                self.deleting.append(self.segments.pop(b)["key"])
                self.cache.drop_segment(b)
            self.commitlog.set_tiered(sorted(self.segments))
            await asyncio.to_thread(self._save_manifest, self._manifest())
            return len(gone)

    def _delete_objects(self) -> None:
        """(Thread) delete the objects retention removed from the manifest."""
        while self.deleting:
            self._delete_key(self.deleting[0])
            self.deleting.pop(0)
            self._save_manifest(self._manifest())

    def _delete_key(self, key: str) -> None:
        self._client().delete_object(Bucket=self.config.tier_bucket, Key=key)

    def tiered_bytes(self) -> int:
        return sum(m["size"] for m in self.segments.values())

    def describe(self) -> dict[str, int]:
        """Figures for stats: tiered segments and bytes, cached bytes, whether reachable."""
        return {
            "tiered_segments": len(self.segments),
            "tiered_bytes": self.tiered_bytes(),
            "tier_cache_bytes": self.cache.bytes,
            "tier_reachable": int(self._reachable),
        }


def _code(e: Exception) -> str:
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))


def _describe(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "timed out"
    return f"{type(e).__name__}: {e}"
