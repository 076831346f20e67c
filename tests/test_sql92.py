"""The SQL92 selector against truth tables worked out from RocketMQ's filter module (SelectorParser.jj,
ComparisonExpression, LogicExpression, UnaryExpression, ConstantExpression), and its parse-time refusals."""

from __future__ import annotations

import pytest

from broker.filter.sql92 import MAX_EXPRESSION_LENGTH, MAX_NESTING, SelectorError, compile_selector
from store.format import properties, records

pytestmark = pytest.mark.unit

PROPS = {"a": "10", "s": "abc", "f": "1.5", "big": "3000000000", "t": "true", "TAGS": "TagA", "neg": "-3"}

# (expression, result over PROPS). A missing property ("x") makes every comparison false, NOT included.
TRUTH = [
    ("a = 10", True), ("a = 11", False), ("a <> 10", False), ("a <> 11", True),
    ("a > 5", True), ("a > 10", False), ("a >= 10", True), ("a < 11", True), ("a <= 9", False),
    ("a > -5", True), ("neg < 0", True), ("neg = -3", True),
    ("a BETWEEN 1 AND 10", True), ("a BETWEEN 11 AND 20", False),
    ("a NOT BETWEEN 1 AND 10", False), ("a NOT BETWEEN 11 AND 20", True),
    ("s = 'abc'", True), ("s <> 'abc'", False), ("s = 'ABC'", False), ("'abc' = s", True),
    ("s IN ('x', 'abc')", True), ("s IN ('x')", False), ("s NOT IN ('x')", True), ("s NOT IN ('abc')", False),
    ("s CONTAINS 'b'", True), ("s CONTAINS 'z'", False), ("s NOT CONTAINS 'z'", True),
    ("s STARTSWITH 'ab'", True), ("s NOT STARTSWITH 'ab'", False), ("s ENDSWITH 'bc'", True),
    ("s CONTAINS ''", False),
    ("TAGS = 'TagA'", True), ("TAGS IN ('TagB', 'TagA')", True),
    # numbers: a string property converts to the literal's type (Integer.valueOf for an int literal ...)
    ("f > 1.2", True), ("f < 1.6", True), ("f > 1", False),  # Integer.valueOf("1.5") throws: no match
    ("big > 5", False), ("big > 2147483648", True),  # ... and Long.valueOf for a long one
    ("a > 5.5", True), ("a = 10.0", True),
    ("s > 1", False),  # not a number: no match
    ("t = TRUE", True), ("a = TRUE", False), ("s = FALSE", True),  # Boolean.valueOf("abc") is false
    ("TRUE", True), ("FALSE", False), ("NULL", False), ("t", False),  # a string is never TRUE
    # NULL: missing properties
    ("x = 1", False), ("x <> 1", False), ("NOT (x = 1)", False), ("x > 1", False), ("x < 1", False),
    ("x BETWEEN 1 AND 2", False), ("x NOT BETWEEN 1 AND 2", False), ("x IN ('a')", False),
    ("x NOT IN ('a')", False), ("x CONTAINS 'a'", False), ("x NOT CONTAINS 'a'", False),
    ("x IS NULL", True), ("x IS NOT NULL", False), ("a IS NULL", False), ("a IS NOT NULL", True),
    # three-valued AND / OR
    ("x = 1 OR a = 10", True), ("x = 1 OR a = 11", False), ("x = 1 AND a = 10", False),
    ("NOT (x = 1 OR a = 11)", False), ("NOT (x = 1 AND a = 11)", True),
    ("a = 10 AND s = 'abc' AND TAGS = 'TagA'", True), ("a = 11 OR s = 'x' OR TAGS = 'TagA'", True),
    # precedence: AND binds tighter than OR; keywords and names in any case
    ("a = 11 AND s = 'x' OR a = 10", True), ("a = 11 AND (s = 'x' OR a = 10)", False),
    ("A = 10", False), ("a between 1 and 10 and s in ('abc')", True),
    ("a = 10 -- a comment\n", True), ("/* c */ a = 10", True), ("s = 'it''s'", False),
]  # fmt: skip


@pytest.mark.parametrize(("expression", "expected"), TRUTH)
def test_truth_table(expression: str, expected: bool) -> None:
    assert compile_selector(expression).evaluate(PROPS) is expected


def test_quotes_in_strings_and_long_literals() -> None:
    assert compile_selector("s = 'it''s'").evaluate({"s": "it's"})
    assert compile_selector("n = 9223372036854775807").evaluate({"n": "9223372036854775807"})
    assert compile_selector("n > 5L").evaluate({"n": "6"})


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("a >", "end of input"),
        ("a ! 1", "Lexical error"),
        ("a > 'x'", "cannot be compared"),
        ("a > TRUE", "cannot be compared"),
        ("a = NULL", "cannot be compared"),
        ("TRUE = 1", "cannot be compared with"),
        ("5", "will not result in a boolean value"),
        ("'abc'", "will not result in a boolean value"),
        ("5 IN ('a')", "Expected a property for In expression"),
        ("a BETWEEN 3 AND 1", "must less than or equal to"),
        ("a > 0.0", "is less than 4.9E-324"),  # Java refuses a float literal below Double.MIN_VALUE
        ("a > 99999999999999999999", "99999999999999999999"),
        ("a IN ()", "Encountered"),
        ("", "empty"),
    ],
)
def test_bad_expressions_are_refused_with_the_parsers_message(expression: str, message: str) -> None:
    with pytest.raises(SelectorError, match="Invalid MessageSelector") as e:
        compile_selector(expression)
    assert message in str(e.value)


def test_oversized_and_deeply_nested_expressions_are_refused() -> None:
    long = "a = 1" + " OR a = 1" * (MAX_EXPRESSION_LENGTH // 9)
    with pytest.raises(SelectorError, match="exceeds"):
        compile_selector(long)
    deep = "(" * (MAX_NESTING + 5) + "a = 1" + ")" * (MAX_NESTING + 5)
    with pytest.raises(SelectorError, match="nests"):
        compile_selector(deep)
    nots = "NOT " * (MAX_NESTING + 5) + "a = 1"
    with pytest.raises(SelectorError, match="nests"):
        compile_selector(nots)
    # just inside both limits it compiles, and a long flat OR chain evaluates without deep recursion
    ok = "(" * (MAX_NESTING - 2) + "a = 1" + ")" * (MAX_NESTING - 2)
    assert compile_selector(ok).evaluate({"a": "1"})
    flat = " OR ".join(f"a = {i}" for i in range(700))
    assert len(flat) < MAX_EXPRESSION_LENGTH and compile_selector(flat).evaluate({"a": "699"})


def test_compiled_once_per_expression() -> None:
    assert compile_selector("a = 123456") is compile_selector("a = 123456")


def test_matches_record_reads_the_stored_properties() -> None:
    props = properties.encode_properties({"color": "red", "n": "7", "TAGS": "T"})
    raw = records.encode_record(records.MessageRecord(topic="t", queue_id=0, body=b"x" * 50, properties=props))
    assert compile_selector("color = 'red' AND n BETWEEN 1 AND 9 AND TAGS = 'T'").matches_record(raw)
    assert not compile_selector("color = 'blue'").matches_record(raw)
    long_topic = "t" * 200  # a V2 record: two-byte topic length
    raw2 = records.encode_record(records.MessageRecord(topic=long_topic, queue_id=0, body=b"", properties=props))
    assert compile_selector("n = 7").matches_record(raw2)
    assert not compile_selector("n = 7").matches_record(raw[:60])  # truncated: no match, no exception
