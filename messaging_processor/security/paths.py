"""MQTT topic-filter algebra over ACL patterns: does a path match a pattern, does a pattern cover a
subscription filter (every path of the filter matches), may the two overlap (some path matches both).

Patterns and filters use MQTT syntax: levels split by `/`, `+` one level, `#` the rest (including
the parent: `a/#` matches `a`). Written here because the decisions are on filters as well as paths,
which no topic-matching library offers."""

from __future__ import annotations


def split(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.split("/"))


def matches(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether the concrete `path` matches `pattern`."""
    n = len(pattern)
    for i, level in enumerate(pattern):
        if level == "#":
            return True
        if i >= len(path):
            return False
        if level != "+" and level != path[i]:
            return False
        if i == n - 1:
            return len(path) == n
    return len(path) == n


def covers(pattern: tuple[str, ...], flt: tuple[str, ...]) -> bool:
    """Whether every path `flt` matches also matches `pattern`."""
    for i, level in enumerate(pattern):
        if level == "#":
            return True
        if i >= len(flt):
            return False
        f = flt[i]
        if f == "#":
            return False  # the filter reaches levels the pattern does not
        if level != "+" and (f == "+" or f != level):
            return False
    return len(flt) == len(pattern)


def overlaps(pattern: tuple[str, ...], flt: tuple[str, ...]) -> bool:
    """Whether some path matches both `pattern` and `flt`."""
    for i in range(max(len(pattern), len(flt))):
        p = pattern[i] if i < len(pattern) else None
        f = flt[i] if i < len(flt) else None
        if p == "#" or f == "#":
            return True
        if p is None or f is None:
            # one ended: only a `#` at the next level of the other would match the shorter one
            rest = flt if p is None else pattern
            return i < len(rest) and rest[i] == "#"
        if p != "+" and f != "+" and p != f:
            return False
    return True
