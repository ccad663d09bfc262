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
