"""Knative Trigger filters over CloudEvent attributes (sans-IO).

- `filter` (Knative `spec.filter.attributes`): every listed attribute must be present and equal,
  case-sensitively; an empty value matches any value of a present attribute.
- `filters` (Knative `spec.filters`, ANDed): one dialect per entry, `exact`, `prefix`, `suffix`
  (attribute -> value; several pairs are ANDed; prefix/suffix values must be non-empty), `all`,
  `any` (lists of filters), `not` (one filter) and `cesql` (an expression, see cesql.py).

Attribute values are compared in their canonical string form (`true`, `42`). A missing attribute
never matches exact/prefix/suffix (so `not` of it does)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from . import cesql
from .event import AttrValue, canonical

Attrs = Mapping[str, AttrValue]
Predicate = Callable[[Attrs], bool]
DIALECTS = ("exact", "prefix", "suffix", "all", "any", "not", "cesql")


class FilterError(ValueError):
    """A filter specification that cannot be compiled."""


def _get(attrs: Attrs, name: str) -> str | None:
    v = attrs.get(name)
    return None if v is None else canonical(v)


def _pairs(dialect: str, spec: object, allow_empty: bool) -> list[tuple[str, str]]:
    if not isinstance(spec, Mapping) or not spec:
        raise FilterError(f"{dialect} needs at least one attribute: value pair")
    out = []
    for k, v in spec.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise FilterError(f"{dialect} values must be strings")
        if not v and not allow_empty:
            raise FilterError(f"{dialect} value for {k} must not be empty")
        out.append((k, v))
    return out


def compile_dialect(spec: Mapping[str, object]) -> Predicate:
    """One `filters` entry -> predicate; FilterError when malformed."""
    present = [k for k, v in spec.items() if v is not None]
    if len(present) != 1 or present[0] not in DIALECTS:
        raise FilterError(f"a filter must have exactly one of {', '.join(DIALECTS)}, got {present}")
    kind = present[0]
    arg = spec[kind]
    if kind == "exact":
        pairs = _pairs(kind, arg, allow_empty=True)
        return lambda a: all(_get(a, k) == v for k, v in pairs)
    if kind == "prefix":
        pairs = _pairs(kind, arg, allow_empty=False)
        return lambda a: all((x := _get(a, k)) is not None and x.startswith(v) for k, v in pairs)
    if kind == "suffix":
        pairs = _pairs(kind, arg, allow_empty=False)
        return lambda a: all((x := _get(a, k)) is not None and x.endswith(v) for k, v in pairs)
    if kind in ("all", "any"):
        if not isinstance(arg, Sequence) or isinstance(arg, str) or not arg:
            raise FilterError(f"{kind} needs a non-empty list of filters")
        subs = [compile_dialect(_mapping(s)) for s in arg]
        if kind == "all":
            return lambda a: all(p(a) for p in subs)
        return lambda a: any(p(a) for p in subs)
    if kind == "not":
        sub = compile_dialect(_mapping(arg))
        return lambda a: not sub(a)
    if not isinstance(arg, str) or not arg.strip():
        raise FilterError("cesql needs an expression")
    try:
        return cesql.predicate(arg)
    except cesql.CesqlSyntaxError as e:
        raise FilterError(f"cesql: {e}") from None


def _mapping(spec: object) -> Mapping[str, object]:
    if not isinstance(spec, Mapping):
        raise FilterError("a filter must be an object")
    return spec


def compile_filters(
    attributes: Mapping[str, str] | None = None, filters: Sequence[Mapping[str, object]] | None = None
) -> Predicate | None:
    """The subscription's predicate (None: everything matches)."""
    preds: list[Predicate] = []
    if attributes:
        legacy = _pairs("filter", attributes, allow_empty=True)
        preds.append(lambda a: all((x := _get(a, k)) is not None and (not v or x == v) for k, v in legacy))
    for spec in filters or ():
        preds.append(compile_dialect(_mapping(spec)))
    if not preds:
        return None
    if len(preds) == 1:
        return preds[0]
    return lambda a: all(p(a) for p in preds)
