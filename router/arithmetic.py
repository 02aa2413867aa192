"""Arithmetic in an answer, checked: the verifier's strongest signal on maths answers.

Worked answers state their steps as chains like ``60 * 3 = 180`` or GSM8K-style
``<<60*3=180>>``. Each ``=`` link whose two sides both evaluate, at least one of them
being an expression, is a checked step; a step whose sides differ is a wrong step.
A wrong step is a strong sign of a wrong answer (on the shipped GSM8K data, 55 of 65
Mixtral answers with a wrong step were wrong, against 37% of answers overall).

The evaluator walks Python's AST of numbers and + - * / ** only (no ``eval``), with
bounded exponents, so a hostile answer cannot make it run long.

    checked, wrong = check_arithmetic("3 * 4 = 12, 12 + 1 = 14")  # (2, 1)
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

TIMES, DIVIDE = "\u00d7", "\u00f7"  # the typeset signs, spelled out for readers' fonts
MAX_EXPONENT = 10.0
MAX_CHAINS = 200  # a long answer is judged on its first steps
MAX_SIDE_CHARS = 200  # longer "expressions" are noise (a loop of digits), not steps
EXACT_TOLERANCE = 1e-6  # relative, between two expressions

# A run of numbers, operators and spaces with at least one "=" in it. Both patterns
# only start where a run starts (the lookbehinds), so a long run is scanned once, not
# once from every position (quadratic on a model that loops on digits).
_RUN = r"[-+*/x\u00d7\u00f7^()$%.,\d ]"
_CHAIN = re.compile(rf"(?<!{_RUN})(?:{_RUN}+=)+{_RUN}+")
_TIMES_X = re.compile(r"(?<=[\d)])\s*x\s*(?=[\d(])")
_PERCENT = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)%")
_HAS_DIGIT = re.compile(r"\d")
_SENTENCE_END = re.compile(r"^\.\s++")  # the full stop before a step: "... time. 2 * 3 = 6"
# A full stop or comma after a number, before a space or the end: it ends one step, as
# in "48 / 2 = 24. 48 + 24 = 72" or "3 * 4 = 12, 12 + 1 = 13" (not "1,000" or "2.5").
_STEP_END = re.compile(r"(?<=\d)[.,](?=\s|$)")
_HAS_OPERATOR = re.compile(r"[\d)%]\s*[-+*/]")
# A first side that starts with an operator was cut from a longer expression (a variable
# or a word before it: "y + 7 = 13"): what it equals is unknown.
_CUT_START = re.compile(r"^\s*(?:[+*/)]|-\s)")
# Units between a number and an operator, "15 floors * 8 units/floor = 120": dropped,
# so the step is checked (one or two words; "x" is a times sign, not a unit). Before an
# operator for any number not part of a time or a decimal ("5:00 pm - 3 hours"); before
# "=" only for a number that an operator leads to, since "Day 1 total = 3 * 4" is a
# label, not a side.
_UNIT_WORD = r"[ \t]++(?!x\b)[A-Za-z]++(?:/[A-Za-z]++)?+"  # "units/floor" is one word
_UNIT_WORDS = rf"{_UNIT_WORD}(?:{_UNIT_WORD})?+"
_NUMBER_BEFORE_UNIT = r"(?<![\d.:,])(\$?\d[\d,]*+(?:\.\d+)?%?)"
_UNIT_BEFORE_OPERATOR = re.compile(
    rf"{_NUMBER_BEFORE_UNIT}{_UNIT_WORDS}(?=[ \t]*[-+*/\u00d7\u00f7]|[ \t]+x[ \t]+\$?\d)"
)
_UNIT_BEFORE_EQUALS = re.compile(
    rf"([-+*/\u00d7\u00f7x][ \t]*+){_NUMBER_BEFORE_UNIT}{_UNIT_WORDS}(?=[ \t]*=)"
)
# Quantities in two units of measure. A compound one, "3 hours 15 minutes", and a sum or
# difference of two, "4 feet + 3 inches", "$2 + 50 cents": their numbers are not the
# sides' values, so such a step is unknown, never a wrong step. Counted things are no
# units: "10 players + 2 coaches = 12 people" is checked.
_COMPOUND = re.compile(
    r"(?<![\d.])\d++(?:\.\d++)?+[ \t]++([A-Za-z]++)(?:[ \t]++and)?+[ \t]++\d++(?:\.\d++)?+"
    r"[ \t]++([A-Za-z]++)"
)
# A quantity, "$2" or "30 minutes"; in a sum the second one is a lookahead, so it can
# also start the next pair ("2 hours + 1 hour + 30 minutes").
_QUANTITY = r"(\$?)\d[\d,]*+(?:\.\d++)?+(?:[ \t]++([A-Za-z]++))?+"
_UNIT_SUM = re.compile(rf"(?<![\d.,$]){_QUANTITY}[ \t]*+([-+])(?=[ \t]*+{_QUANTITY})")
_MEASURES = {
    "second": "seconds secs sec",
    "minute": "minutes mins min",
    "hour": "hours hrs hr",
    "day": "days",
    "week": "weeks",
    "month": "months",
    "year": "years yrs",
    "inch": "inches",
    "foot": "feet ft",
    "yard": "yards yd yds",
    "mile": "miles",
    "meter": "meters metre metres m",
    "centimeter": "centimeters cm",
    "millimeter": "millimeters mm",
    "kilometer": "kilometers km",
    "ounce": "ounces oz",
    "pound": "pounds lb lbs",
    "gram": "grams g",
    "kilogram": "kilograms kg",
    "cent": "cents",
    "dollar": "dollars",
    "quarter": "quarters",
    "dime": "dimes",
    "nickel": "nickels",
    "penny": "pennies",
    "cup": "cups",
    "pint": "pints",
    "quart": "quarts",
    "gallon": "gallons",
    "liter": "liters litre litres",
    "milliliter": "milliliters ml",
    "dozen": "dozens",
}
_UNIT_OF: dict[str, str] = {
    alias: unit for unit, aliases in _MEASURES.items() for alias in (unit, *aliases.split())
}
_NOT_ARITHMETIC = "%%"  # an operator that stays in the run but never parses
# The number a side starts with (possessive: no two quantifiers trade the same spaces).
_LEADING_NUMBER = re.compile(r"^\s*+(?:\(\s*+)?(-?\d++(?:\.\d++)?)")
_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: math.pow,  # real powers only: a negative base to a fraction raises
}


def check_arithmetic(text: str) -> tuple[int, int]:
    """``(checked, wrong)``: the arithmetic steps found in ``text``, and how many are false."""
    text = text.replace("<<", " ; ").replace(">>", " ; ").replace("\\*", "*")
    text = _STEP_END.sub(" ;", text)
    text = _UNIT_SUM.sub(_mixed_sum_cut, _COMPOUND.sub(_compound_cut, text))
    text = _UNIT_BEFORE_EQUALS.sub(r"\1\2", _UNIT_BEFORE_OPERATOR.sub(r"\1", text))
    checked = wrong = 0
    for chain in _CHAIN.findall(text)[:MAX_CHAINS]:
        parts = chain.split("=")
        sides = [None if _CUT_START.match(parts[0]) else _side(parts[0])]
        sides += [_side(part) for part in parts[1:]]
        for (left, right), right_text in zip(itertools.pairwise(sides), parts[1:], strict=True):
            if left is None or right is None or (left.rounding and right.rounding):
                continue  # unparsed, or two bare numbers: nothing was computed
            if _equal(left, right):
                checked += 1
            elif not _carried_on(left, right_text):
                checked += 1
                wrong += 1
    return checked, wrong


def _unit(dollar: str, word: str | None) -> str | None:
    """The unit of measure of a quantity ("$" for a dollar sign), None for a count."""
    return "dollar" if dollar else _UNIT_OF.get((word or "").lower())


def _two_units(first: str | None, second: str | None) -> bool:
    return first is not None and second is not None and first != second


def _compound_cut(match: re.Match[str]) -> str:
    """ "3 hours 15 minutes" as a word: neither of its numbers is a side's value."""
    if _two_units(_unit("", match.group(1)), _unit("", match.group(2))):
        return "quantity"
    return match.group(0)


def _mixed_sum_cut(match: re.Match[str]) -> str:
    """ "4 feet + 3 inches" with an operator that never parses: its side is unknown."""
    if not _two_units(_unit(match.group(1), match.group(2)), _unit(match.group(4), match.group(5))):
        return match.group(0)
    at = match.start(3) - match.start()
    whole = match.group(0)
    return f"{whole[:at]}{_NOT_ARITHMETIC}{whole[at + 1 :]}"


def _equal(left: _Side, right: _Side) -> bool:
    """The two sides agree, within a bare number's rounding; a bare percentage also
    stands for its number of hundredths ("0.5 * 100 = 50%")."""
    if _close(left.value, right.value, max(left.rounding, right.rounding)):
        return True
    return any(
        side.percent and _close(side.value * 100.0, other.value, side.rounding * 100.0)
        for side, other in ((left, right), (right, left))
    )


def _close(a: float, b: float, rounding: float) -> bool:
    return abs(a - b) <= max(rounding, EXACT_TOLERANCE * abs(a)) + 1e-12


def _carried_on(left: _Side, right_text: str) -> bool:
    """A running chain, "90 / 450 = 0.2 * 100 = 20": the right side starts with the
    left's result and goes on computing; the next link checks what follows."""
    match = _LEADING_NUMBER.match(right_text.replace(",", "").replace("$", ""))
    if match is None or not _HAS_OPERATOR.search(right_text):
        return False
    leading = match.group(1)
    rounding = 0.5 * 10.0 ** -len(leading.partition(".")[2])
    return _close(left.value, float(leading), max(left.rounding, rounding))


@dataclass(frozen=True, slots=True)
class _Side:
    value: float
    # A bare number stands for anything it rounds from ("1/3 = 0.33", "100/3 = 33"):
    # half a unit of its last digit. 0.0 for an expression, which is exact.
    rounding: float
    percent: bool = False  # a bare percentage: 0.5 or 50 ("= 50%") both match it


def _side(text: str) -> _Side | None:
    """One side of an ``=``: its value and rounding; None when it is not arithmetic."""
    source = text.replace(",", "").replace("$", "").replace(TIMES, "*").replace(DIVIDE, "/")
    source = _TIMES_X.sub("*", source.replace("^", "**")).strip().rstrip(".").strip()
    source = _SENTENCE_END.sub("", source)
    if len(source) > MAX_SIDE_CHARS or not _HAS_DIGIT.search(source):
        return None
    bare = not _HAS_OPERATOR.search(source)  # decided before "%" becomes "/100"
    try:
        value = _evaluate(ast.parse(_PERCENT.sub(r"(\1/100)", source), mode="eval").body)
    except (SyntaxError, ValueError, ArithmeticError, RecursionError, MemoryError):
        return None
    if not bare:
        return _Side(value, 0.0)
    decimals = len(source.rstrip("%").partition(".")[2].strip())
    percent = 0.01 if source.endswith("%") else 1.0  # "66.7%" rounds in hundredths
    return _Side(value, 0.5 * 10.0**-decimals * percent, source.endswith("%"))


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)  # bool is an int, but "True" has no digit to get here
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError("exponent too large")
        result = _BINARY[type(node.op)](left, right)
        if not math.isfinite(result):
            raise ValueError("not finite")
        return result
    raise ValueError(f"not arithmetic: {type(node).__name__}")
