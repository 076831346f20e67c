"""RocketMQ's SQL92 message selector: parse with lark (grammar in ``sql92.lark``), compile to closures, evaluate
over a message's properties with the semantics of RocketMQ's ``filter`` module (``ComparisonExpression``,
``LogicExpression``, ``UnaryExpression``, ``ConstantExpression``).

What a user sees of Java's semantics:
- Three-valued logic: a missing property makes a comparison NULL, NOT NULL is NULL, and only TRUE matches,
  so every comparison with a missing property (``=``, ``<>``, ``>``, ``BETWEEN``, ``IN``, ``NOT IN``) is false.
- Property values are strings; a comparison with a number converts the string (``Integer.valueOf`` for an int
  literal, ``Long.valueOf`` for a long one, ``Double.valueOf`` for a decimal) and ``>``/``<`` between two
  strings compares them as doubles. A conversion that fails makes the whole expression false for that message
  (Java throws and ``ExpressionMessageFilter`` answers false), as does any other evaluation error.
- Operands Java refuses at parse time are refused here with the same rule: ``>`` on a string, boolean or
  NULL literal, ``= NULL``, ``IN`` on something other than a property, BETWEEN with the bounds reversed,
  a literal where a boolean is needed, a float literal below ``Double.MIN_VALUE`` (so ``0.0``), an integer
  beyond a Java long.
- ``CONTAINS``/``STARTSWITH``/``ENDSWITH`` (5.x) and their NOT forms are false for a missing property and for
  an empty search string.

Parsing is bounded: an expression longer than ``MAX_EXPRESSION_LENGTH`` characters or nested deeper than
``MAX_NESTING`` levels is refused before it is compiled, so no input can exhaust the interpreter's stack.
Compiled selectors are cached by expression text (successes and failures alike, as Java's ``PARSE_CACHE``).
"""

from __future__ import annotations

import functools
import math
import re
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import lark

from store.errors import MQLakeError
from store.format import properties, records

MAX_EXPRESSION_LENGTH = 8192
MAX_NESTING = 64  # parentheses, NOTs and signs stacked inside one another

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DOUBLE_MIN_VALUE = 5e-324  # Java's Double.MIN_VALUE: the smallest positive double


class SelectorError(MQLakeError, ValueError):
    """An expression that does not compile; the message is what the broker answers (SUBSCRIPTION_PARSE_FAILED)."""


class _EvalError(Exception):
    """What Java throws while evaluating (a failed number conversion, a ClassCastException): no match."""


class _Long(int):
    """A Java ``Long`` constant (a literal outside the int range or with an ``L`` suffix); plain ``int`` is
    ``Integer``. The two differ in how a string property is converted for a comparison."""


Value = Any  # str | bool | int | _Long | float | None: the Java values an expression yields
Eval = Callable[[Mapping[str, str]], Value]


# --- Java conversions --------------------------------------------------------------------------------------
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)")


def _java_integer(s: str, lo: int, hi: int) -> int:
    digits = s[1:] if s[:1] in ("+", "-") else s
    if not (digits.isascii() and digits.isdigit()):  # Integer.valueOf: an optional sign and ASCII digits only
        raise _EvalError(f"for input string: {s!r}")
    v = int(s)
    if not lo <= v <= hi:
        raise _EvalError(f"for input string: {s!r} (out of range)")
    return v


def _java_double(s: str) -> float:
    t = s.strip(" \t\n\r\f\v\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18"
                "\x19\x1a\x1b\x1c\x1d\x1e\x1f")  # String.trim: every char <= ' '  # fmt: skip
    if not _JAVA_DOUBLE.fullmatch(t):
        raise _EvalError(f"for input string: {s!r}")
    return float(t.rstrip("fFdD").replace("Infinity", "inf"))


def _kind(v: Value) -> str:
    if isinstance(v, bool):
        return "Boolean"
    if isinstance(v, _Long):
        return "Long"
    if isinstance(v, int):
        return "Integer"
    if isinstance(v, float):
        return "Double"
    return "String"


def _compare_to(a: Value, b: Value) -> int:
    """``Comparable.compareTo`` of two values of one kind (Double's total order: NaN above all, -0.0 < 0.0)."""
    if isinstance(a, float) and isinstance(b, float) and (math.isnan(a) or math.isnan(b) or a == b == 0):
        ka = (math.isnan(a), 0 if math.isnan(a) else math.copysign(1, a))
        kb = (math.isnan(b), 0 if math.isnan(b) else math.copysign(1, b))
        return (ka > kb) - (ka < kb)
    return (a > b) - (a < b)


def _compare(lv: Value, rv: Value) -> int:
    """``ComparisonExpression.__compare`` with string conversion on (as ``SelectorParser.parse`` always sets):
    values of different kinds are converted up to a common one, or compare as -1 when Java has no rule."""
    lk, rk = _kind(lv), _kind(rv)
    if lk != rk:
        if lk == "Boolean":
            if rk == "String":
                raise _EvalError("a Boolean cannot be cast to a String")  # Java casts the wrong operand
            return -1
        if lk == "Integer":
            if rk in ("Long", "Double"):
                lv = float(lv) if rk == "Double" else lv
            elif rk == "String":
                rv = _java_integer(rv, _INT_MIN, _INT_MAX)
            else:
                return -1
        elif lk == "Long":
            if rk == "Integer":
                pass
            elif rk == "Double":
                lv = float(lv)
            elif rk == "String":
                rv = _java_integer(rv, _LONG_MIN, _LONG_MAX)
            else:
                return -1
        elif lk == "Double":
            if rk in ("Integer", "Long"):
                rv = float(rv)
            elif rk == "String":
                rv = _java_double(rv)
            else:
                return -1
        else:  # a String against a constant
            if rk == "Boolean":
                lv = lv.lower() == "true"
            elif rk == "Integer":
                lv = _java_integer(lv, _INT_MIN, _INT_MAX)
            elif rk == "Long":
                lv = _java_integer(lv, _LONG_MIN, _LONG_MAX)
            elif rk == "Double":
                lv = _java_double(lv)
            else:
                return -1
    return _compare_to(lv, rv)


# --- expression nodes ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Node:
    """A compiled sub-expression and what Java's parser knows of it (for its parse-time checks)."""

    fn: Eval
    text: str
    constant: bool = False  # a ConstantExpression (literal)
    value: Value = None  # its value when constant
    boolean: bool = False  # a BooleanExpression
    prop: str | None = None  # a PropertyExpression's name


def _const(value: Value, text: str, boolean: bool = False) -> _Node:
    return _Node(lambda _p: value, text, constant=True, value=value, boolean=boolean)


def _bool_node(fn: Eval, text: str) -> _Node:
    return _Node(fn, text, boolean=True)


def _as_boolean(n: _Node) -> _Node:
    """``asBooleanExpression``: a boolean stays, a property is cast (a string is never TRUE), else refused."""
    if n.boolean:
        return n
    if n.prop is not None:
        fn = n.fn

        def cast(p: Mapping[str, str]) -> Value:
            v = fn(p)
            return None if v is None else (v if isinstance(v, bool) else False)

        return _bool_node(cast, n.text)
    raise SelectorError(f"Expression will not result in a boolean value: {n.text}")


def _check_less_than_operand(n: _Node) -> None:
    if n.constant:
        if isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
            return
        raise SelectorError(f"Value '{n.text}' cannot be compared.")
    if n.boolean:
        raise SelectorError(f"Value '{n.text}' cannot be compared.")


def _from_string(constant: Value) -> Callable[[str], Value]:
    """How Java converts a string compared with ``constant`` (``__compare``'s String row)."""
    if isinstance(constant, bool):
        return lambda s: s.lower() == "true"
    if isinstance(constant, _Long):
        return lambda s: _java_integer(s, _LONG_MIN, _LONG_MAX)
    if isinstance(constant, int):
        return lambda s: _java_integer(s, _INT_MIN, _INT_MAX)
    if isinstance(constant, float):
        return _java_double
    return lambda s: s


def _property_vs_constant(left: _Node, right: _Node, accept: Callable[[int], bool]) -> Eval | None:
    """The common ``property <op> literal`` with the literal's conversion chosen once (same results as the general
    path: a property value is always a string)."""
    if left.prop is None or not right.constant or right.value is None:
        return None
    name, rv, convert = left.prop, right.value, _from_string(right.value)

    def ev(p: Mapping[str, str]) -> Value:
        lv = p.get(name)
        if lv is None:
            return None
        return accept(_compare_to(convert(lv), rv))

    return ev


def _ordering(left: _Node, right: _Node, op: str, accept: Callable[[int], bool]) -> _Node:
    _check_less_than_operand(left)
    _check_less_than_operand(right)
    fast = _property_vs_constant(left, right, accept)
    if fast is not None:
        return _bool_node(fast, f"{left.text} {op} {right.text}")
    lf, rf = left.fn, right.fn

    def ev(p: Mapping[str, str]) -> Value:
        lv = lf(p)
        if lv is None:
            return None
        rv = rf(p)
        if rv is None:
            return None
        if isinstance(lv, str) and isinstance(rv, str):  # strings order only as numbers
            return accept(_compare_to(_java_double(lv), _java_double(rv)))
        return accept(_compare(lv, rv))

    return _bool_node(ev, f"{left.text} {op} {right.text}")


def _equal(left: _Node, right: _Node, text: str) -> _Node:
    if isinstance(right.value, str) and left.prop is not None and right.constant:
        name, rv = left.prop, right.value
        return _bool_node(lambda p: None if (lv := p.get(name)) is None else lv == rv, text)
    fast = _property_vs_constant(left, right, lambda c: c == 0)
    if fast is not None:
        return _bool_node(fast, text)
    lf, rf = left.fn, right.fn

    def ev(p: Mapping[str, str]) -> Value:
        lv, rv = lf(p), rf(p)
        if (lv is None) != (rv is None):
            return None if lv is None else False
        if lv is None or (type(lv) is type(rv) and lv == rv):
            return True
        return _compare(lv, rv) == 0

    return _bool_node(ev, text)


def _checked_equal(left: _Node, right: _Node) -> _Node:
    for n in (left, right):
        if n.constant and n.value is None:
            raise SelectorError(f"'{n.text}' cannot be compared.")
    if left.constant and right.constant and left.boolean and not right.boolean:
        raise SelectorError(f"'{left.text}' cannot be compared with '{right.text}'")
    return _equal(left, right, f"{left.text} == {right.text}")


def _not(n: _Node) -> _Node:
    fn = _as_boolean(n).fn

    def ev(p: Mapping[str, str]) -> Value:
        v = fn(p)
        return None if v is None else not v

    return _bool_node(ev, f"NOT {n.text}")


def _logic(parts: list[_Node], is_and: bool) -> _Node:
    if len(parts) == 1:
        return parts[0]
    fns = [_as_boolean(n).fn for n in parts]
    stop = not is_and  # AND stops at the first FALSE, OR at the first TRUE

    def ev(p: Mapping[str, str]) -> Value:
        unknown = False
        for f in fns:
            v = f(p)
            if v is None:
                unknown = True
            elif bool(v) is stop:
                return stop
        return None if unknown else not stop

    return _bool_node(ev, (" AND " if is_and else " OR ").join(n.text for n in parts))


def _string_test(n: _Node, search: str, test: Callable[[str, str], bool], negate: bool, op: str) -> _Node:
    fn = n.fn

    def ev(p: Mapping[str, str]) -> Value:
        if not search:
            return False
        v = fn(p)
        if not isinstance(v, str):  # missing or not a string: FALSE even for the NOT forms
            return False
        return test(v, search) is not negate

    return _bool_node(ev, f"{n.text} {op} '{search}'")


def _in(n: _Node, items: list[str], negate: bool) -> _Node:
    if n.prop is None:
        raise SelectorError(f"Expected a property for In expression, got: {n.text}")
    fn, members = n.fn, frozenset(items)

    def ev(p: Mapping[str, str]) -> Value:
        v = fn(p)
        if not isinstance(v, str):
            return None
        return (v in members) is not negate

    return _bool_node(ev, f"{n.text} {'NOT IN' if negate else 'IN'} ({', '.join(items)})")


def _between(value: _Node, low: _Node, high: _Node, negate: bool) -> _Node:
    if not negate and low.constant and high.constant:
        if low.value is None or high.value is None:
            raise SelectorError("Illegal values of between, values can not be null!")
        try:
            reversed_ = _compare(high.value, low.value) < 0
        except _EvalError as e:
            raise SelectorError(str(e)) from None
        if reversed_:
            raise SelectorError(
                f"Illegal values of between, left value({low.text}) must less than or equal to right value({high.text})"
            )
    if negate:
        return _logic([_ordering(value, low, "<", lambda c: c < 0), _ordering(value, high, ">", lambda c: c > 0)],
                      is_and=False)  # fmt: skip
    return _logic([_ordering(value, low, ">=", lambda c: c >= 0), _ordering(value, high, "<=", lambda c: c <= 0)],
                  is_and=True)  # fmt: skip


def _negate(n: _Node) -> _Node:
    fn = n.fn

    def ev(p: Mapping[str, str]) -> Value:
        v = fn(p)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        return _Long(-v) if isinstance(v, _Long) else -v

    return _Node(ev, f"-{n.text}")


def _decimal(text: str) -> _Node:
    digits = text[:-1] if text[-1] in "lL" else text
    v = int(digits)
    if v > _LONG_MAX:
        raise SelectorError(f'For input string: "{digits}"')
    return _const(v if v <= _INT_MAX else _Long(v), text)


def _float(text: str) -> _Node:
    v = float(text)
    if v > 1.7976931348623157e308:
        raise SelectorError(f"{text} is greater than 1.7976931348623157E308")
    if v < _DOUBLE_MIN_VALUE:
        raise SelectorError(f"{text} is less than 4.9E-324")
    return _const(v, text)


def _string(token: str) -> str:
    return token[1:-1].replace("''", "'")


# --- compile ----------------------------------------------------------------------------------------------------
_CMP_OPS: dict[str, tuple[str, Callable[[int], bool]]] = {
    "gt": (">", lambda c: c > 0),
    "ge": (">=", lambda c: c >= 0),
    "lt": ("<", lambda c: c < 0),
    "le": ("<=", lambda c: c <= 0),
}
_STRING_OPS: dict[str, tuple[Callable[[str, str], bool], bool, str]] = {
    "contains": (lambda v, s: s in v, False, "CONTAINS"),
    "not_contains": (lambda v, s: s in v, True, "NOT CONTAINS"),
    "startswith": (str.startswith, False, "STARTSWITH"),
    "not_startswith": (str.startswith, True, "NOT STARTSWITH"),
    "endswith": (str.endswith, False, "ENDSWITH"),
    "not_endswith": (str.endswith, True, "NOT ENDSWITH"),
}


def _build(t: lark.Tree | lark.Token) -> _Node:
    """The node for a parse tree; recursion depth is bounded by the nesting check made before."""
    if isinstance(t, lark.Token):  # pragma: no cover - every token sits under a named rule
        raise SelectorError(f"unexpected token {t!r}")
    kind, ch = t.data, t.children
    if kind == "or_expr":
        return _logic([_build(c) for c in ch], is_and=False)
    if kind == "and_expr":
        return _logic([_build(c) for c in ch], is_and=True)
    if kind in ("eq_expr", "cmp_expr"):
        left = _build(ch[0])
        for tail in ch[1:]:
            left = _apply_tail(left, tail)
        return left
    if kind == "not_":
        return _not(_build(ch[0]))
    if kind == "neg":
        return _negate(_build(ch[0]))
    if kind == "unary":  # unary plus: the operand itself
        return _build(ch[0])
    if kind == "string":
        s = _string(str(ch[0]))
        return _const(s, f"'{s}'")
    if kind == "decimal":
        return _decimal(str(ch[0]))
    if kind == "float":
        return _float(str(ch[0]))
    if kind in ("true", "false"):
        return _const(kind == "true", kind.upper(), boolean=True)
    if kind == "null":
        return _const(None, "NULL", boolean=True)
    if kind == "prop":
        name = str(ch[0])
        return _Node(lambda p: p.get(name), name, prop=name)
    raise SelectorError(f"unexpected {kind}")  # pragma: no cover - the grammar has no other rule


def _apply_tail(left: _Node, tail: lark.Tree) -> _Node:
    kind, ch = tail.data, tail.children
    if kind == "eq":
        return _checked_equal(left, _build(ch[0]))
    if kind == "ne":
        return _not(_checked_equal(left, _build(ch[0])))
    if kind == "is_null":
        return _equal(left, _const(None, "NULL", boolean=True), f"{left.text} IS NULL")
    if kind == "is_not_null":
        return _not(_equal(left, _const(None, "NULL", boolean=True), f"{left.text} IS NULL"))
    if kind in _CMP_OPS:
        op, accept = _CMP_OPS[kind]
        return _ordering(left, _build(ch[0]), op, accept)
    if kind in _STRING_OPS:
        test, negate, op = _STRING_OPS[kind]
        return _string_test(left, _string(str(ch[0].children[0])), test, negate, op)
    if kind in ("between", "not_between"):
        return _between(left, _build(ch[0]), _build(ch[1]), kind == "not_between")
    if kind in ("in_list", "not_in_list"):
        return _in(left, [_string(str(c.children[0])) for c in ch], kind == "not_in_list")
    raise SelectorError(f"unexpected {kind}")  # pragma: no cover


_NESTING_RULES = frozenset({"not_", "neg", "unary", "or_expr"})


def _nesting(tree: lark.Tree) -> int:
    """How deeply parentheses and prefix operators are stacked (iteratively: the tree may be deep)."""
    deepest, stack = 0, [(tree, 0)]
    while stack:
        t, depth = stack.pop()
        if t.data in _NESTING_RULES:
            depth += 1
            deepest = max(deepest, depth)
        stack.extend((c, depth) for c in t.children if isinstance(c, lark.Tree))
    return deepest


@functools.cache
def _parser() -> lark.Lark:
    grammar = resources.files(__package__).joinpath("sql92.lark").read_text(encoding="utf-8")
    return lark.Lark(grammar, parser="lalr", maybe_placeholders=False)


@dataclass(frozen=True)
class Selector:
    """A compiled SQL92 expression."""

    expression: str
    _fn: Eval
    names: frozenset[str]  # the properties it reads

    def evaluate(self, props: Mapping[str, str]) -> bool:
        """True only when the expression is TRUE for these properties (NULL and errors do not match)."""
        try:
            return self._fn(props) is True
        except (_EvalError, TypeError, ValueError, OverflowError):
            return False

    def matches_record(self, raw: bytes | memoryview) -> bool:
        """Whether the CommitLog record ``raw`` matches, looking up in its raw properties only the ones the
        evaluation reaches (``a = 1 AND b = 2`` never looks for ``b`` when ``a`` is not 1)."""
        try:
            props = records.record_properties(raw)
        except (records.RecordError, IndexError, ValueError, struct.error):
            return False
        return self.evaluate(_RawProperties(props, self._finders))

    @functools.cached_property
    def _finders(self) -> dict[str, Callable[[bytes], str | None]]:
        return {n: properties.property_finder(n) for n in self.names}


class _RawProperties(Mapping[str, str]):
    """A record's raw properties string read as a mapping, each value found when asked for."""

    __slots__ = ("_raw", "_finders")

    def __init__(self, raw: bytes, finders: dict[str, Callable[[bytes], str | None]]) -> None:
        self._raw = raw
        self._finders = finders

    def get(self, name: str, default: Any = None) -> Any:
        find = self._finders.get(name)
        value = find(self._raw) if find is not None else properties.property_value(self._raw, name)
        return default if value is None else value

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(properties.decode_properties(self._raw))

    def __len__(self) -> int:
        return len(properties.decode_properties(self._raw))


def compile_selector(expression: str) -> Selector:
    """Parse and compile ``expression``; raise :class:`SelectorError` with the parser's message."""
    result = _compile_cached(expression)
    if isinstance(result, str):
        raise SelectorError(result)
    return result


@functools.lru_cache(maxsize=1024)
def _compile_cached(expression: str) -> Selector | str:
    if len(expression) > MAX_EXPRESSION_LENGTH:
        return f"Invalid MessageSelector. expression of {len(expression)} characters exceeds {MAX_EXPRESSION_LENGTH}"
    if not expression.strip():
        return "Invalid MessageSelector. empty expression"
    try:
        tree = _parser().parse(expression)
    except lark.exceptions.UnexpectedInput as e:
        return f"Invalid MessageSelector. {_describe(e)}"
    depth = _nesting(tree)
    if depth > MAX_NESTING:
        return f"Invalid MessageSelector. expression nests {depth} levels deep, more than {MAX_NESTING}"
    try:
        node = _as_boolean(_build(tree))
    except SelectorError as e:
        return f"Invalid MessageSelector. {e}"
    names = frozenset(str(t.children[0]) for t in tree.iter_subtrees() if t.data == "prop")
    return Selector(expression, node.fn, names)


def _describe(e: lark.exceptions.UnexpectedInput) -> str:
    where = f"line {e.line}, column {e.column}"
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        return f"Lexical error at {where}: unexpected {e.char!r}"
    if isinstance(e, lark.exceptions.UnexpectedToken):
        if e.token.type == "$END":
            return f"Encountered end of input at {where}; expected one of {sorted(e.expected)}"
        return f"Encountered {str(e.token)!r} at {where}; expected one of {sorted(e.expected)}"
    return f"{type(e).__name__} at {where}"
