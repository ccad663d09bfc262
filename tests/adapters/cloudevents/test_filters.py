"""CESQL evaluation (cases in the style of the spec's TCK) and Knative filter dialects."""

from __future__ import annotations

import pytest

from adapters.cloudevents import cesql
from adapters.cloudevents.filters import FilterError, compile_filters

EVENT = {
    "specversion": "1.0",
    "id": "1",
    "source": "/shop/commerce/eu",
    "type": "com.acme.order.created",
    "subject": "order-17",
    "sequence": 10,
    "vip": True,
    "myext": "abc123123%456_dzf",
}

VALUES = [
    ("TRUE = FALSE", False),
    ("'TRUE' = true", True),  # = casts its left operand to the right one's type
    ("true = 'TRUE'", False),
    ("1 <> 2", True),
    ("2 <= 2 AND 3 > 2", True),
    ("false and (1 != 1 / 0)", False),  # short-circuit
    ("true or (1 != 1 / 0)", True),
    ("TRUE XOR TRUE", False),
    ("NOT 'FALSE'", True),
    ("'abc' LIKE 'a%b%c'", True),
    ("'a_b_c' LIKE 'a\\_b\\_c'", True),
    ("'azbzc' LIKE 'a\\_b\\_c'", False),
    ("'.ab.cde.' LIKE '.%.%.'", True),
    ("myext LIKE 'abc%123\\%456\\_d_f'", True),
    ("myext NOT LIKE 'abc%'", False),
    ("234 LIKE '23_'", True),
    ("EXISTS subject", True),
    ("EXISTS dataschema", False),
    ("type IN ('a', 'com.acme.order.created')", True),
    ("sequence NOT IN (1, 2)", True),
    ("sequence = 10 AND sequence + 5 = 15", True),
    ("sequence * 2 - 1", 19),
    ("-7 / 2", -3),
    ("-7 % 2", -1),
    ("vip = TRUE", True),
    ("INT('-1')", -1),
    ("INT(TRUE)", 1),
    ("BOOL(100)", True),
    ("STRING(FALSE)", "false"),
    ("IS_INT('12') AND NOT IS_BOOL('x')", True),
    ("LENGTH(subject)", 8),
    ("CONCAT('a', 1, TRUE)", "a1true"),
    ("CONCAT_WS('-', 'a', 'b')", "a-b"),
    ("UPPER(LOWER('AbC'))", "ABC"),
    ("TRIM('  x ')", "x"),
    ("LEFT('abc', 2) = 'ab' AND RIGHT('abc', 5) = 'abc'", True),
    ("SUBSTRING('abcdef', 2, 3)", "bcd"),
    ("SUBSTRING('abcdef', -2)", "ef"),
    ("ABS(-5)", 5),
    ("source LIKE '%commerce%' AND type IN ('com.acme.order.created', 'b')", True),
    ("(subject = 'x' OR subject = 'order-17') AND NOT (sequence > 10)", True),
]


@pytest.mark.parametrize(("expr", "value"), VALUES, ids=[v[0] for v in VALUES])
def test_cesql_values(expr, value):
    got = cesql.evaluate(expr, EVENT)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    "expr",
    [
        "missing = 2",
        "NOT missing",
        "NOT 10",
        "1 / 0 = 0",
        "INT('ABC') = 0",
        "ABS(-2147483648) > 0",
        "2147483647 + 1 > 0",
    ],
)
def test_cesql_errors_never_match(expr):
    with pytest.raises(cesql.EvalError):
        cesql.evaluate(expr, EVENT)
    assert cesql.predicate(expr)(EVENT) is False


def test_non_boolean_results_do_not_match():
    assert cesql.predicate("sequence")(EVENT) is False
    assert cesql.predicate("'true'")(EVENT) is False
    assert cesql.predicate("vip")(EVENT) is False  # a string attribute, not a boolean value


@pytest.mark.parametrize(
    "expr", ["", "1 +", "FOO(1)", "LENGTH()", "a LIKE b", "(1", "2147483648", "x IN ()", "'open"]
)
def test_cesql_syntax_errors(expr):
    with pytest.raises(cesql.CesqlSyntaxError):
        cesql.compile_expression(expr)


def test_filter_dialects():
    def match(filters=None, attributes=None):
        pred = compile_filters(attributes, filters)
        return pred is None or pred(EVENT)

    assert match()
    assert match([{"exact": {"type": "com.acme.order.created"}}])
    assert not match([{"exact": {"type": "com.acme.order"}}])
    assert match([{"prefix": {"type": "com.acme."}}, {"suffix": {"source": "/eu"}}])
    assert not match([{"prefix": {"type": "com.acme."}}, {"suffix": {"source": "/us"}}])
    assert match([{"any": [{"exact": {"subject": "nope"}}, {"exact": {"sequence": "10"}}]}])
    assert not match([{"all": [{"exact": {"subject": "order-17"}}, {"exact": {"vip": "false"}}]}])
    assert match([{"not": {"exact": {"absent": "x"}}}])
    assert match([{"cesql": "sequence > 5 AND vip"}])
    assert not match([{"exact": {"absent": "x"}}])
    # legacy filter.attributes: present and equal; an empty value matches any value
    assert match(attributes={"type": "com.acme.order.created", "subject": ""})
    assert not match(attributes={"dataschema": ""})


@pytest.mark.parametrize(
    "bad",
    [
        {"prefix": {"type": ""}},
        {"exact": {}},
        {"cesql": "1 +"},
        {"exact": {"a": "b"}, "prefix": {"a": "b"}},
        {"all": []},
        {"foo": 1},
    ],
)
def test_malformed_filters_are_rejected(bad):
    with pytest.raises(FilterError):
        compile_filters(None, [bad])
