"""CloudEvents SQL (CESQL 1.0) filter expressions: a tokenizer, a recursive-descent parser following
the precedence of the spec's ANTLR grammar, and evaluation by compiled closures.

Covered: integer, string (`'...'`, `"..."`) and boolean literals; attribute references (always
strings, cast implicitly); `NOT`, unary `-`; `* / %`, `+ -` (32-bit, truncated division);
`= != <> < <= > >=`; `AND OR XOR` (short-circuit, right-associative, one precedence level);
`[NOT] LIKE` with `%`, `_` and `\\` escapes; `EXISTS`; `[NOT] IN (...)`; the built-in functions
LENGTH, CONCAT, CONCAT_WS, LOWER, UPPER, TRIM, LEFT, RIGHT, SUBSTRING, ABS, INT, BOOL, STRING,
IS_INT, IS_BOOL. Casts follow the spec: `=` casts its left operand to the right one's type, `IN` casts
the set to the left operand's type; implicit integer <-> boolean casts are errors (INT() and BOOL()
allow them). Evaluation is fail-fast: a missing attribute, a failed cast or a division by zero is an
error, and a filter with an error (or a non-boolean result) does not match, as the spec requires."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .event import AttrValue, canonical

Value = bool | int | str
Env = Mapping[str, AttrValue]
Node = Callable[[Env], Value]

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
KEYWORDS = frozenset({"AND", "OR", "XOR", "NOT", "LIKE", "IN", "EXISTS", "TRUE", "FALSE"})
_INT_TEXT = re.compile(r"^[+-]?[0-9]+$", re.ASCII)
_TOKEN = re.compile(
    r"\s*(?:(?P<num>[0-9]+(?![A-Za-z_]))|(?P<word>[A-Za-z0-9_]+)|(?P<str>'(?:\\'|[^'])*'|\"(?:\\\"|[^\"])*\")"
    r"|(?P<op>!=|<>|<=|>=|[=<>+\-*/%(),]))",
    re.ASCII,
)


class CesqlSyntaxError(ValueError):
    """The expression does not parse (or calls an unknown function)."""


class EvalError(Exception):
    """Evaluation failed: missing attribute, cast, math."""


@dataclass(slots=True)
class _Tok:
    kind: str  # num, word, str, op, eof
    text: str
    pos: int


def tokenize(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            out.append(_Tok("eof", "", pos))
            return out
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise CesqlSyntaxError(f"unexpected character {text[pos]!r} at {pos}")
        kind = m.lastgroup or "op"
        out.append(_Tok(kind, m.group(kind), m.start(kind)))
        pos = m.end()


# ----------------------------------------------------------------------------- casts
def to_int(v: Value, explicit: bool = False) -> int:
    if type(v) is int:
        return v
    if type(v) is bool:
        if explicit:
            return 1 if v else 0
        raise EvalError("cannot cast a boolean to an integer")
    if isinstance(v, str) and _INT_TEXT.match(v):
        i = int(v)
        if INT_MIN <= i <= INT_MAX:
            return i
    raise EvalError(f"cannot cast {v!r} to an integer")


def to_bool(v: Value, explicit: bool = False) -> bool:
    if type(v) is bool:
        return v
    if type(v) is int:
        if explicit:
            return v != 0
        raise EvalError("cannot cast an integer to a boolean")
    if isinstance(v, str):
        low = v.lower()
        if low == "true":
            return True
        if low == "false":
            return False
    raise EvalError(f"cannot cast {v!r} to a boolean")


def to_str(v: Value) -> str:
    if type(v) is bool:
        return "true" if v else "false"
    return v if isinstance(v, str) else str(v)


def cast_like(v: Value, target: Value) -> Value:
    """`v` cast to the type of `target`."""
    if type(target) is bool:
        return to_bool(v)
    if type(target) is int:
        return to_int(v)
    return to_str(v)


def _int32(i: int) -> int:
    if not INT_MIN <= i <= INT_MAX:
        raise EvalError("integer overflow")
    return i


def _div(a: int, b: int) -> int:
    if b == 0:
        raise EvalError("division by zero")
    q = abs(a) // abs(b)
    return _int32(q if (a >= 0) == (b >= 0) else -q)


def _mod(a: int, b: int) -> int:
    if b == 0:
        raise EvalError("division by zero")
    return a - b * _div(a, b)


def like_regex(pattern: str) -> re.Pattern[str]:
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n and pattern[i + 1] in "%_":
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


# ----------------------------------------------------------------------------- functions
def _substring(x: Value, pos: Value, length: Value | None = None) -> str:
    s, p = to_str(x), to_int(pos)
    n = len(s)
    if p > n or p < -n:
        raise EvalError("SUBSTRING position out of range")
    if p == 0:
        return ""
    start = p - 1 if p > 0 else n + p
    if length is None:
        return s[start:]
    ln = to_int(length)
    if ln < 0:
        raise EvalError("SUBSTRING length is negative")
    return s[start : start + ln]


def _left(x: Value, y: Value) -> str:
    s, k = to_str(x), to_int(y)
    if k < 0:
        raise EvalError("LEFT length is negative")
    return s[:k]


def _right(x: Value, y: Value) -> str:
    s, k = to_str(x), to_int(y)
    if k < 0:
        raise EvalError("RIGHT length is negative")
    return s[len(s) - k :] if k < len(s) else s


def _abs(x: Value) -> int:
    i = to_int(x)
    if i == INT_MIN:
        raise EvalError("ABS overflow")
    return abs(i)


def _is(cast: Callable[[Value], Value]) -> Callable[[Value], bool]:
    def check(x: Value) -> bool:
        try:
            cast(x)
        except EvalError:
            return False
        return True

    return check


# name -> (min args, max args or None, function)
FUNCTIONS: dict[str, tuple[int, int | None, Callable[..., Value]]] = {
    "LENGTH": (1, 1, lambda x: len(to_str(x))),
    "CONCAT": (0, None, lambda *xs: "".join(to_str(x) for x in xs)),
    "CONCAT_WS": (1, None, lambda d, *xs: to_str(d).join(to_str(x) for x in xs)),
    "LOWER": (1, 1, lambda x: to_str(x).lower()),
    "UPPER": (1, 1, lambda x: to_str(x).upper()),
    "TRIM": (1, 1, lambda x: to_str(x).strip()),
    "LEFT": (2, 2, _left),
    "RIGHT": (2, 2, _right),
    "SUBSTRING": (2, 3, _substring),
    "ABS": (1, 1, _abs),
    "INT": (1, 1, lambda x: to_int(x, explicit=True)),
    "BOOL": (1, 1, lambda x: to_bool(x, explicit=True)),
    "STRING": (1, 1, to_str),
    "IS_INT": (1, 1, _is(to_int)),
    "IS_BOOL": (1, 1, _is(to_bool)),
}


# ----------------------------------------------------------------------------- parser
class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = tokenize(text)
        self.i = 0

    def peek(self, ahead: int = 0) -> _Tok:
        return self.toks[min(self.i + ahead, len(self.toks) - 1)]

    def kw(self, tok: _Tok) -> str:
        return tok.text.upper() if tok.kind == "word" else ""

    def next(self) -> _Tok:
        t = self.toks[self.i]
        self.i = min(self.i + 1, len(self.toks) - 1)
        return t

    def expect_op(self, op: str) -> None:
        t = self.next()
        if t.kind != "op" or t.text != op:
            raise CesqlSyntaxError(f"expected {op!r} at {t.pos}, got {t.text or 'end of input'!r}")

    def parse(self) -> Node:
        node = self.logic()
        t = self.peek()
        if t.kind != "eof":
            raise CesqlSyntaxError(f"unexpected {t.text!r} at {t.pos}")
        return node

    def logic(self) -> Node:
        left = self.comparison()
        op = self.kw(self.peek())
        if op not in ("AND", "OR", "XOR"):
            return left
        self.next()
        right = self.logic()  # right-associative, as the grammar's <assoc=right>
        if op == "AND":
            return lambda e: to_bool(left(e)) and to_bool(right(e))
        if op == "OR":
            return lambda e: to_bool(left(e)) or to_bool(right(e))
        return lambda e: to_bool(left(e)) != to_bool(right(e))

    def comparison(self) -> Node:
        left = self.additive()
        while (t := self.peek()).kind == "op" and t.text in ("=", "!=", "<>", "<", "<=", ">", ">="):
            self.next()
            left = _comparison(t.text, left, self.additive())
        return left

    def additive(self) -> Node:
        left = self.multiplicative()
        while (t := self.peek()).kind == "op" and t.text in ("+", "-"):
            self.next()
            right = self.multiplicative()
            if t.text == "+":
                left = (lambda a, b: lambda e: _int32(to_int(a(e)) + to_int(b(e))))(left, right)
            else:
                left = (lambda a, b: lambda e: _int32(to_int(a(e)) - to_int(b(e))))(left, right)
        return left

    def multiplicative(self) -> Node:
        left = self.postfix()
        while (t := self.peek()).kind == "op" and t.text in ("*", "/", "%"):
            self.next()
            right = self.postfix()
            if t.text == "*":
                left = (lambda a, b: lambda e: _int32(to_int(a(e)) * to_int(b(e))))(left, right)
            elif t.text == "/":
                left = (lambda a, b: lambda e: _div(to_int(a(e)), to_int(b(e))))(left, right)
            else:
                left = (lambda a, b: lambda e: _mod(to_int(a(e)), to_int(b(e))))(left, right)
        return left

    def postfix(self) -> Node:
        node = self.unary()
        while True:
            negate = False
            k = self.kw(self.peek())
            if k == "NOT" and self.kw(self.peek(1)) in ("LIKE", "IN"):
                self.next()
                negate, k = True, self.kw(self.peek())
            if k == "LIKE":
                self.next()
                t = self.next()
                if t.kind != "str":
                    raise CesqlSyntaxError(f"LIKE needs a string literal pattern at {t.pos}")
                rx = like_regex(_unquote(t.text))
                node = (lambda n, r, neg: lambda e: (r.fullmatch(to_str(n(e))) is not None) != neg)(
                    node, rx, negate
                )
            elif k == "IN":
                self.next()
                items = self.arguments(require_one=True)
                node = _in(node, items, negate)
            else:
                return node

    def unary(self) -> Node:
        t = self.peek()
        k = self.kw(t)
        if k == "NOT":
            self.next()
            operand = self.unary()
            return lambda e: not to_bool(operand(e))
        if k == "EXISTS":
            self.next()
            name = self.next()
            if name.kind != "word" or name.text.upper() in KEYWORDS:
                raise CesqlSyntaxError(f"EXISTS needs an attribute name at {name.pos}")
            attr = name.text
            return lambda e: attr in e
        if t.kind == "op" and t.text == "-":
            self.next()
            if self.peek().kind == "num":
                return _literal(-int(self.next().text), t.pos)
            operand = self.unary()
            return lambda e: _int32(-to_int(operand(e)))
        return self.primary()

    def primary(self) -> Node:
        t = self.next()
        if t.kind == "num":
            return _literal(int(t.text), t.pos)
        if t.kind == "str":
            s = _unquote(t.text)
            return lambda e: s
        if t.kind == "op" and t.text == "(":
            node = self.logic()
            self.expect_op(")")
            return node
        if t.kind == "word":
            k = t.text.upper()
            if k in ("TRUE", "FALSE"):
                b = k == "TRUE"
                return lambda e: b
            if k in KEYWORDS:
                raise CesqlSyntaxError(f"unexpected {t.text!r} at {t.pos}")
            nxt = self.peek()
            if nxt.kind == "op" and nxt.text == "(":
                return self.call(k, t.pos)
            return _attribute(t.text)
        raise CesqlSyntaxError(f"unexpected {t.text or 'end of input'!r} at {t.pos}")

    def arguments(self, require_one: bool = False) -> list[Node]:
        self.expect_op("(")
        args: list[Node] = []
        if self.peek().kind == "op" and self.peek().text == ")" and not require_one:
            self.next()
            return args
        while True:
            args.append(self.logic())
            t = self.next()
            if t.kind == "op" and t.text == ")":
                return args
            if not (t.kind == "op" and t.text == ","):
                raise CesqlSyntaxError(f"expected ',' or ')' at {t.pos}")

    def call(self, name: str, pos: int) -> Node:
        spec = FUNCTIONS.get(name)
        if spec is None:
            raise CesqlSyntaxError(f"unknown function {name} at {pos}")
        args = self.arguments()
        lo, hi, fn = spec
        if len(args) < lo or (hi is not None and len(args) > hi):
            want = f"{lo}+" if hi is None else str(lo) if hi == lo else f"{lo}-{hi}"
            raise CesqlSyntaxError(f"{name} takes {want} arguments, got {len(args)}")
        return lambda e: fn(*(a(e) for a in args))


def _unquote(lit: str) -> str:
    q = lit[0]
    return lit[1:-1].replace("\\" + q, q)


def _literal(i: int, pos: int) -> Node:
    if not INT_MIN <= i <= INT_MAX:
        raise CesqlSyntaxError(f"integer literal at {pos} is outside the 32-bit range")
    return lambda e: i


def _attribute(name: str) -> Node:
    def get(e: Env) -> Value:
        v = e.get(name)
        if v is None:
            raise EvalError(f"missing attribute {name}")
        return canonical(v)

    return get


def _comparison(op: str, left: Node, right: Node) -> Node:
    if op in ("=", "!=", "<>"):
        neg = op != "="

        def equal(e: Env) -> bool:
            a, b = left(e), right(e)
            return (cast_like(a, b) == b) != neg

        return equal
    cmp = {
        "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b,
    }[op]
    return lambda e: cmp(to_int(left(e)), to_int(right(e)))


def _in(left: Node, items: list[Node], negate: bool) -> Node:
    def member(e: Env) -> bool:
        x = left(e)
        found = any(cast_like(item(e), x) == x for item in items)
        return found != negate

    return member


def compile_expression(text: str) -> Node:
    """Parse `text`; raises CesqlSyntaxError. The result evaluates over an attribute mapping and
    raises EvalError."""
    return _Parser(text).parse()


def evaluate(text: str, attributes: Env) -> Value:
    """Evaluate an expression once (raises CesqlSyntaxError / EvalError)."""
    return compile_expression(text)(attributes)


def predicate(text: str) -> Callable[[Env], bool]:
    """A filter: True only when the expression evaluates to boolean true without error."""
    node = compile_expression(text)

    def matches(attributes: Env) -> bool:
        try:
            return node(attributes) is True
        except EvalError:
            return False

    return matches
