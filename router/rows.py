"""The JSONL rows `router score`, `verify` and the calibrations read, and the lines they
print:

    rows = list(read_rows(Path("in.jsonl"), parse))  # Row("in.jsonl:3", id, parse(row))
    scores = score_rows(rows, classifier.score_batch)  # a failing row is named, FILE:LINE
    return print_lines(json.dumps({"id": r.id, "score": s}) for r, s in zip(rows, scores))

Every failure is a `RoutingError` whose message names the file and line. An answer
stored as RouterBench stores them, the text of a one-string Python list (`"['D']"`), is
read as that string (`unwrap_response`).
"""

from __future__ import annotations

import ast
import codecs
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from router.errors import RoutingError

STDIN = "-"  # the IN.jsonl that means the rows come on stdin
MAX_MESSAGE = 200  # characters of an unexpected exception's message that an error shows

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Row(Generic[T]):
    """A row of IN.jsonl: where it is (``FILE:LINE``), its id, and what was read from it."""

    where: str
    id: Any
    value: T


def read_rows(path: Path, parse: Callable[[Mapping[str, Any]], T]) -> Iterator[Row[T]]:
    """A row per non-blank line, `parse` raising ValueError on a bad one; a bad line
    raises naming the file and line. Lines end at LF only (CRLF too): JSON strings may
    hold U+2028, U+2029 and U+0085 unescaped, as `json.dumps(ensure_ascii=False)` writes
    them."""
    name, text = _read_text(path)
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield _read_row(f"{name}:{number}", line.removesuffix("\r"), parse)


def unwrap_response(text: str) -> str:
    """The answer in ``text``: RouterBench stores each as the text of a one-string Python
    list (``"['D']"``, ``'["def f(): ..."]'``), read as that string; any other text (an
    answer that merely starts with a bracket, a list of two) is the answer itself. A rule
    of the data's format: the gateway's live answers are never read so."""
    stripped = text.strip()
    if not (stripped.startswith("[") and stripped.endswith("]")):
        return text
    try:
        value = ast.literal_eval(stripped)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    return text


def score_rows(
    rows: Sequence[Row[T]], score_batch: Callable[[list[T]], list[float]]
) -> list[float]:
    """``score_batch`` of the rows' values, in one batch (as an embedding model wants
    them); should it fail, the row it fails on is found and named."""
    try:
        scores = score_batch([row.value for row in rows])
    except Exception as exc:  # a bug on some row: name it rather than show a traceback
        each(rows, lambda i: score_batch([rows[i].value]))
        raise RoutingError(f"cannot score these rows: {_describe(exc)}") from exc
    return finite(rows, scores)


def each(rows: Sequence[Row[Any]], work: Callable[[int], R]) -> list[R]:
    """``work(i)`` for each row's index. An exception on a row (a bug: rows are checked
    as they are read) becomes an error naming its line, not a traceback."""
    done = []
    for i, row in enumerate(rows):
        try:
            done.append(work(i))
        except Exception as exc:  # translated with the row's place, and chained
            raise RoutingError(f"{row.where}: cannot score this row: {_describe(exc)}") from exc
    return done


def finite(rows: Sequence[Row[Any]], scores: list[float]) -> list[float]:
    """The scores, each checked to be a number JSON can write."""
    for row, score in zip(rows, scores, strict=True):
        if not math.isfinite(score):
            raise RoutingError(f"{row.where}: cannot score this row: its score is {score}")
    return scores


def print_lines(lines: Iterable[str], reader_gone: int = 1) -> int:
    """Print the lines to stdout: 0, `reader_gone` when the reader has gone (`... | head
    -1`: 1 where the output was the point, 0 where the status is a check's outcome), or 1
    when stdout cannot be written (`> /dev/full`). A reader that goes ends the output
    quietly, as Python's docs advise (the note on SIGPIPE); a failed write says why, on
    stderr. Either way stdout is then pointed at devnull, so that the flush at exit
    cannot fail again."""
    try:
        for line in lines:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return reader_gone
    except OSError as exc:
        _silence_stdout()
        print(f"error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _read_text(path: Path) -> tuple[str, str]:
    """The name errors give IN.jsonl, and its text: `-` is stdin; a UTF-8 BOM is skipped."""
    name = "<stdin>" if str(path) == STDIN else str(path)
    try:
        data = sys.stdin.buffer.read() if str(path) == STDIN else path.read_bytes()
    except OSError as exc:
        raise RoutingError(f"cannot read {name}: {exc}") from exc
    data = data.removeprefix(codecs.BOM_UTF8)  # as "utf-8-sig", but offsets stay in `data`
    try:
        return name, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise RoutingError(
            f"{name}:{line}: not UTF-8: byte 0x{data[exc.start]:02x} at byte {column} of "
            f"the line ({exc.reason})"
        ) from exc


def _read_row(where: str, line: str, parse: Callable[[Mapping[str, Any]], T]) -> Row[T]:
    try:
        row = _parse_json(line)
        if not isinstance(row, dict) or "id" not in row:
            raise ValueError("expected a JSON object with an 'id'")
        _check_id(row["id"])
        return Row(where, row["id"], parse(row))
    except ValueError as exc:
        raise RoutingError(f"{where}: {exc}") from exc
    except RecursionError as exc:
        raise RoutingError(f"{where}: nested too deeply to read") from exc


def _parse_json(line: str) -> Any:
    """The line's JSON; an integer longer than Python converts (4300 digits) is an error
    naming its field, not Python's advice to raise the limit."""
    too_long: list[str] = []

    def integer(digits: str) -> Any:
        if _too_long(digits):
            too_long.append(digits)
            return TOO_LONG
        return int(digits)

    value = json.loads(line, parse_int=integer)
    if too_long:
        field = _field_of(value, TOO_LONG)
        raise ValueError(
            f"{f'{field!r}' if field else 'the row'} is an integer of "
            f"{len(too_long[0].lstrip('-')):,} digits; at most "
            f"{sys.get_int_max_str_digits():,} are read"
        )
    return value


TOO_LONG = object()  # stands for a too-long integer while its field is looked for


def _too_long(digits: str) -> bool:
    limit = sys.get_int_max_str_digits()  # 0: no limit
    return limit > 0 and len(digits.lstrip("-")) > limit


def _field_of(value: Any, target: object, path: str = "") -> str | None:
    """Where `target` is in `value`, as `messages[0].content`; None if it is not."""
    if value is target:
        return path
    if isinstance(value, dict):
        children = [(f"{path}.{key}" if path else key, child) for key, child in value.items()]
    elif isinstance(value, list):
        children = [(f"{path}[{i}]", child) for i, child in enumerate(value)]
    else:
        return None
    for where, child in children:
        if (found := _field_of(child, target, where)) is not None:
            return found
    return None


def _check_id(value: Any) -> None:
    """An id is printed back as it came, so it must be one that JSON can write."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError(
            f"'id' is {value!r:.40}: ids must be valid JSON, with no NaN, Infinity or number "
            "beyond a double's range (1e400)"
        ) from None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:MAX_MESSAGE]}"
