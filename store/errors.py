"""The store's own exceptions (a full disk raises `StoreFullError`, an OSError, from commitlog.py)."""

from __future__ import annotations


class StoreError(Exception):
    """Base of the store's own errors."""


class TopicNotFound(StoreError):
    pass


class GroupNotFound(StoreError):
    pass


class InvalidReceiptHandle(StoreError):
    """The handle is malformed, already acked, or superseded by a later pop/change."""


class MessageTooLarge(StoreError):
    pass


class TransactionNotFound(StoreError):
    pass


class NotReplicated(StoreError):
    """A write the primary of a replica group made but its in-sync replicas did not acknowledge
    within the replication timeout: stored on the primary, not yet safe (a retry may store a
    message twice)."""


class TieredRangeNotCached(StoreError):
    """A read below the local commit log range whose bytes are in object storage but not in the
    local cache: `await Store.fetch_tiered(exc)` and read again. Not a KeyError on purpose: the
    record exists, and a reader that took it for "no longer stored" would skip (lose) it."""

    def __init__(self, offset: int, size: int) -> None:
        super().__init__(f"commit log range {offset}+{size} is tiered and not cached")
        self.offset = offset
        self.size = size


class TieredStorageUnavailable(StoreError):
    """The object store holding tiered segments did not answer (or failed) in time."""
