"""Thresholds from a sample of traffic: for a classifier route, the score cut-offs that
send a target share of requests to each tier, cheapest first;

    tiers = calibrate(scores, {"local-small": 0.6, "local-large": 0.3, "premium": 0.1})
    # -> [Threshold("local-small", 0.21), Threshold("local-large", 0.47), Threshold("premium")]

and for a cascade route, the verifier threshold that escalates a target share of answers:

    verify_threshold(verifier_scores, escalate=0.2)  # -> 0.6301

Shipped policies take theirs from the shipped data (`router/data/`), each task weighing
the same (at most `SAMPLE_PER_TASK` rows of each, chosen by a hash of the id):

    python -m router.training.calibration prompts | cascade-gateway router calibrate - --shares ...
    python -m router.training.calibration answers | cascade-gateway router calibrate-verify - \
        --escalate "$(python -m router.training.calibration unacceptable)"

`answers` are the cheap model's (Mixtral-8x7B's) answers, as a cascade's first tier
gives them; `unacceptable` is the share of them the data marks wrong (graded under 8 of
10 on arena chat), what a perfect verifier would escalate.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from router.errors import RoutingError
from router.planner import Threshold
from router.rows import unwrap_response
from router.training.dataset import DEFAULT_DATA_DIR, data_file, open_data

TOP = 1.0  # the highest `below` a policy takes: every score under it
# The shipped sample: each task's rows up to the smallest task's size (arena chat, 191).
SAMPLE_PER_TASK = 191
SAMPLE_STEMS = (
    "mmlu",
    "gsm8k",
    "routerbench_arc_challenge",
    "routerbench_winogrande",
    "routerbench_mbpp",
    "arena_chat",
)
# The cheap model whose answers a cascade verifies first, as each file names it.
CHEAP_MODELS = {
    "routerbench": "mistralai/mixtral-8x7b-chat",
    "arena_chat": "mistralai/Mixtral-8x7B-Instruct-v0.1",
}
ACCEPT_GRADE = 8.0  # an arena answer graded at least this is acceptable


def calibrate(scores: Sequence[float], shares: Mapping[str, float]) -> list[Threshold]:
    """Tiers in the order given; each gets (about) its share of the sample, a tier with
    share 0 none of it, and a tier whose later tiers all have share 0 every score below
    `TOP` (a classifier's score of exactly 1 still passes it: a policy's `below` is at
    most 1)."""
    if not scores:
        raise RoutingError("calibration needs at least one scored prompt")
    _check_shares(shares)
    values = np.asarray(scores, dtype=float)
    weights = list(shares.values())
    total = sum(weights)
    cumulative = np.cumsum([share / total for share in weights])[:-1]
    cuts = np.quantile(values, cumulative) if len(cumulative) else []
    names = list(shares)
    tiers = []
    for i, (name, cut) in enumerate(zip(names, cuts, strict=False)):
        if not any(weights[i + 1 :]):
            below = TOP  # the rest have no share: this tier takes every row
        elif not any(weights[: i + 1]):
            below = _floor(float(values.min()))  # share 0 so far: no score may fall below
        else:
            below = round(float(cut), 4)
        tiers.append(Threshold(name, below))
    return [*tiers, Threshold(names[-1])]


def _check_shares(shares: Mapping[str, float]) -> None:
    if not shares:
        raise RoutingError("give each tier a share, e.g. local=0.7,premium=0.3")
    if not all(name.strip() for name in shares):
        raise RoutingError(f"tier names must not be empty, got {list(shares)}")
    for name, share in shares.items():
        if not (math.isfinite(share) and share >= 0):
            raise RoutingError(f"tier '{name}' has share {share}; shares are finite and >= 0")
    if sum(shares.values()) <= 0:  # shares are scaled to sum to 1: a=70,b=30 is a=0.7,b=0.3
        raise RoutingError(f"tier shares must sum above 0, got {dict(shares)}")


def _floor(score: float) -> float:
    """`score` rounded down to 4 decimals, never above it."""
    cut = math.floor(score * 10_000) / 10_000
    return cut if cut <= score else round(cut - 0.0001, 4)


def verify_threshold(scores: Sequence[float], escalate: float) -> float:
    """The cascade `verify_threshold` that escalates the share of a sample's answers
    (their verifier scores) nearest `escalate`: `verify_cut`'s."""
    return verify_cut(scores, escalate).threshold


@dataclass(frozen=True, slots=True)
class VerifyCut:
    """A `verify_threshold` and how many of the sample's answers score below it, and so
    escalate (the gateway accepts a score at or above it)."""

    threshold: float
    escalated: int
    answers: int

    @property
    def share(self) -> float:
        return self.escalated / self.answers


def verify_cut(scores: Sequence[float], escalate: float) -> VerifyCut:
    """Of the thresholds a sample tells apart (one escalating none of it, one above each
    distinct score: just above it, or 1.0 above the highest), the one whose share
    escalated is nearest `escalate`. Of two as near, the one escalating more: a tie costs
    a premium answer rather than passing a doubtful one."""
    if not scores:
        raise RoutingError("calibration needs at least one scored answer")
    if not 0.0 <= escalate <= 1.0:
        raise RoutingError(f"--escalate must be a share in [0, 1], got {escalate}")
    outside = [score for score in scores if not 0.0 <= score <= 1.0]
    if outside:
        raise RoutingError(f"verifier scores are in [0, 1], got {outside[0]}")
    target = Fraction(escalate)  # exact, so that equally near shares do tie
    return min(
        _verify_cuts(sorted(scores)),
        key=lambda cut: (abs(Fraction(cut.escalated, cut.answers) - target), -cut.escalated),
    )


def _verify_cuts(values: Sequence[float]) -> Iterator[VerifyCut]:
    """A threshold for each share of the sorted `values` a threshold can escalate."""
    answers = len(values)
    yield VerifyCut(_floor(values[0]), 0, answers)
    for below, (score, above) in enumerate(itertools.pairwise(values), start=1):
        if above != score:  # a threshold above a score is above its ties too
            yield VerifyCut(_just_above(score, above), below, answers)
    if values[-1] < TOP:  # every answer: the highest a policy takes, so future ones too
        yield VerifyCut(TOP, answers, answers)


def _just_above(score: float, ceiling: float) -> float:
    """A threshold above `score` and at most `ceiling` (the next score up): `score`
    rounded up at 4 decimals, or at more where the next score is nearer, so that the
    printed threshold escalates the same answers."""
    shortest = Decimal(repr(score))  # the float's own digits, not its binary expansion
    for places in range(4, 18):
        step = Decimal(1).scaleb(-places)
        cut = float(shortest.quantize(step, rounding=ROUND_FLOOR) + step)
        if score < cut <= ceiling:
            return cut
    return ceiling


def verify_yaml(cut: VerifyCut) -> str:
    """The `verify_threshold:` line to paste into a cascade route, with what it escalates;
    the threshold without an exponent (YAML reads `1e-05` as a string)."""
    threshold = np.format_float_positional(cut.threshold, trim="0")
    return f"verify_threshold: {threshold}  # escalates {cut.share:.1%} of {cut.answers} answers"


def tiers_yaml(tiers: Sequence[Threshold]) -> str:
    """The `tiers:` block to paste into a classifier route."""
    lines = ["tiers:"]
    for tier in tiers:
        bound = f", below: {tier.below}" if tier.below is not None else ""
        lines.append(f"  - {{tier: {tier.tier}{bound}}}")
    return "\n".join(lines) + "\n"


def shipped_rows(data_dir: Path | None = None) -> Iterator[dict[str, Any]]:
    """Each task's sampled rows of the shipped data, in a fixed order."""
    directory = data_dir or DEFAULT_DATA_DIR
    for stem in SAMPLE_STEMS:
        with open_data(data_file(directory, stem)) as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
        rows.sort(key=lambda row: hashlib.sha256(f"{stem}:{row['id']}".encode()).digest())
        yield from rows[:SAMPLE_PER_TASK]


def cheap_answer(row: Mapping[str, Any]) -> tuple[str, bool] | None:
    """The cheap model's answer to a shipped row and whether it is acceptable; None for
    rows without answers (MMLU's)."""
    if "weak_response" in row:
        return str(row["weak_response"]), bool(row["weak_correct"])
    source = "arena_chat" if row.get("source") == "arena_chat" else "routerbench"
    answer = row.get("models", {}).get(CHEAP_MODELS[source])
    if answer is None:
        return None
    if source == "arena_chat":
        return str(answer["response"]), float(answer["score"]) >= ACCEPT_GRADE
    return unwrap_response(answer["response"]), float(answer["correct"]) >= 0.5


def shipped_answers(
    data_dir: Path | None = None, opinion: str | None = None
) -> list[dict[str, Any]]:
    """`router verify` rows of the sample's cheap answers, with `acceptable`; with
    `opinion` (a RouterBench model), its answer as the row's second opinion where the
    gateway would ask one (questions whose answers compare) and the data has it."""
    from router.answers import comparable

    answers = []
    for row in shipped_rows(data_dir):
        found = cheap_answer(row)
        if found is None:
            continue
        response, acceptable = found
        answer = {"id": row["id"], "prompt": row["prompt"], "response": response}
        other = row.get("models", {}).get(opinion) if opinion else None
        if other is not None and comparable(row["prompt"]):
            answer["samples"] = [unwrap_response(other["response"])]
        answers.append({**answer, "acceptable": acceptable})
    return answers


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m router.training.calibration prompts|answers|unacceptable [--data DIR]`."""
    parser = argparse.ArgumentParser(prog="python -m router.training.calibration")
    parser.add_argument("sample", choices=("prompts", "answers", "unacceptable"))
    parser.add_argument("--data", type=Path, default=None, help="routing data directory")
    parser.add_argument("--opinion", help="answers: a second opinion's model, e.g. Yi-34B's")
    args = parser.parse_args(argv)
    if args.sample == "prompts":
        lines = [
            json.dumps({"id": r["id"], "prompt": r["prompt"]}) for r in shipped_rows(args.data)
        ]
    else:
        answers = shipped_answers(args.data, args.opinion)
        if args.sample == "unacceptable":
            share = sum(not a["acceptable"] for a in answers) / len(answers)
            lines = [f"{share:.3f}"]
        else:
            lines = [json.dumps(a) for a in answers]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
