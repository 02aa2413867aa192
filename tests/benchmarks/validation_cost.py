"""What checking a request body costs beyond parsing it: `parse_object` (orjson, the
nesting bound, integers beyond 64 bits) against plain `orjson.loads` of the same bytes.

    python -m tests.benchmarks.validation_cost [--repeat 5] [--budget-s 0.2]

One row per body shape, each timed best of `--repeat` (a round runs a shape for about
`--budget-s`), both sides in the same run: the typical small chat, large bodies of text
and of integers with and without long digit runs (nanosecond timestamps and 19-digit
IDs, in strings and as integers orjson holds), and, for scale, a body that does hold an
integer beyond 64 bits (the one shape parsed twice: it is refused, naming the field).
Columns: both timings and `parse_object`'s ratio to orjson's; then the integer check
alone (`_check_exact_integers`: the prefilter, and the second parse where it leads to
one) and its ratio; `twice` says whether the prefilter sends the body to that parse.
Alone, the check makes its own copy of the body (`OUTLINE`), which `parse_object`
shares with the nesting bound's bracket count; the rest of `parse_object`'s cost is
that bound's (a walk of the parsed body when it has over `MAX_JSON_DEPTH` brackets).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.http.validation import (
    _check_exact_integers,
    _may_hold_inexact_integer,
    parse_object,
)

NS_TIMESTAMP = 1_712_345_678_901_234_567  # 19 digits, within i64
U64_ID = 10_000_000_000_000_000_000  # 20 digits, within u64
SNOWFLAKE = "1234567890123456789"
WORDS = (
    "The quick brown fox jumps over the lazy dog while the committee reviews the "
    "quarterly figures and drafts a reply to every open question in the thread. "
)


@dataclass
class Shape:
    name: str
    raw: bytes


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": content}], **extra}


def shapes() -> list[Shape]:
    text = (WORDS * (1_000_000 // len(WORDS)))[:1_000_000]
    half = len(text) // 2
    stamped = f"{text[:half]} logged at {NS_TIMESTAMP} ns {text[half:]}"
    token_ids = [(i * 7919) % 100_000 for i in range(150_000)]
    embedding_ids = [[(i * 31 + j) % 100_000 for j in range(512)] for i in range(800)]
    metadata_ints = {f"k{i}": [(i * j) % 1_000_000 for j in range(40)] for i in range(8_000)}
    events = [{"ts_ns": NS_TIMESTAMP + i, "id": U64_ID + i} for i in range(20_000)]
    string_ids = [f"{int(SNOWFLAKE) + i}" for i in range(50_000)]
    dump = json.dumps
    return [
        Shape("chat, 300 B", dump(chat("Summarise the attached notes.", max_tokens=300)).encode()),
        Shape("chat, 1 MB text", dump(chat(text)).encode()),
        Shape("chat, 1 MB text + ns timestamp in it", dump(chat(stamped)).encode()),
        Shape(
            "completion, 150k token ids + 19-digit user",
            dump({"model": "auto", "prompt": token_ids, "user": SNOWFLAKE}).encode(),
        ),
        Shape(
            "embeddings, 800x512 token ids + 19-digit user",
            dump({"model": "auto", "input": embedding_ids, "user": SNOWFLAKE}).encode(),
        ),
        Shape(
            "chat, 2.5 MB metadata ints + 19-digit user",
            dump(chat("hi", metadata=metadata_ints, user=SNOWFLAKE)).encode(),
        ),
        Shape(
            "chat, 20k ns timestamps and 20-digit u64 ids",
            dump(chat("hi", metadata={"events": events})).encode(),
        ),
        Shape(
            "chat, 50k 19-digit ids in strings",
            dump(chat("hi", metadata={"ids": string_ids})).encode(),
        ),
        Shape(
            "chat, 2.5 MB metadata ints + one beyond 64 bits",
            dump(chat("hi", metadata={**metadata_ints, "big": 2**64})).encode(),
        ),
    ]


def check(raw: bytes) -> None:
    """`parse_object`; a refusal is its answer, not a failure."""
    with contextlib.suppress(InvalidRequest):
        parse_object(raw)


def check_integers(raw: bytes) -> None:
    with contextlib.suppress(InvalidRequest):
        _check_exact_integers(raw)


def best_s(fn: Callable[[bytes], object], raw: bytes, repeat: int, budget_s: float) -> float:
    """Best mean seconds per call over `repeat` rounds of about `budget_s` each."""
    start = time.perf_counter()
    fn(raw)
    once = max(time.perf_counter() - start, 1e-7)
    loops = max(1, int(budget_s / once))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(loops):
            fn(raw)
        best = min(best, (time.perf_counter() - start) / loops)
    return best


def show_s(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:8.1f} us"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=0.2)
    args = parser.parse_args()
    print(
        f"{'body':<48} {'size':>7} {'orjson.loads':>12} {'parse_object':>12} {'ratio':>6} "
        f"{'int check':>11} {'ratio':>6}  twice"
    )
    for shape in shapes():
        base = best_s(orjson.loads, shape.raw, args.repeat, args.budget_s)
        checked = best_s(check, shape.raw, args.repeat, args.budget_s)
        integers = best_s(check_integers, shape.raw, args.repeat, args.budget_s)
        twice = "yes" if _may_hold_inexact_integer(shape.raw) else "no"
        print(
            f"{shape.name:<48} {len(shape.raw) / 1e6:5.2f}MB {show_s(base):>12} "
            f"{show_s(checked):>12} {checked / base:5.2f}x {show_s(integers):>11} "
            f"{integers / base:5.2f}x  {twice}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
