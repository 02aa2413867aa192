"""Thresholds from a sample of traffic: for a classifier route, the score cut-offs that
send a target share of requests to each tier, cheapest first;

    tiers = calibrate(scores, {"local-small": 0.6, "local-large": 0.3, "premium": 0.1})
    # -> [Threshold("local-small", 0.21), Threshold("local-large", 0.47), Threshold("premium")]

and for a cascade route, the verifier threshold that escalates a target share of answers:

    verify_threshold(verifier_scores, escalate=0.2)  # -> 0.63
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from router.errors import RoutingError
from router.planner import Threshold

TOP = 1.0  # the highest `below` a policy takes: every score under it


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
    if sum(shares.values()) <= 0:  # shares are scaled to sum to 1: 70,30 reads as 0.7,0.3
        raise RoutingError(f"tier shares must sum above 0, got {dict(shares)}")


def _floor(score: float) -> float:
    """`score` rounded down to 4 decimals, never above it."""
    cut = math.floor(score * 10_000) / 10_000
    return cut if cut <= score else round(cut - 0.0001, 4)


def verify_threshold(scores: Sequence[float], escalate: float) -> float:
    """The cascade `verify_threshold` at which about `escalate` of a sample's answers
    (their verifier scores) fall below it, and so escalate."""
    if not scores:
        raise RoutingError("calibration needs at least one scored answer")
    if not 0.0 <= escalate <= 1.0:
        raise RoutingError(f"--escalate must be a share in [0, 1], got {escalate}")
    values = np.asarray(scores, dtype=float)
    if escalate >= 1.0:
        return 1.0  # nothing scores 1 or above: every answer escalates
    # Rounded down: rounding up could pass answers at the quantile itself to escalation.
    return math.floor(float(np.quantile(values, escalate)) * 10_000) / 10_000


def tiers_yaml(tiers: Sequence[Threshold]) -> str:
    """The `tiers:` block to paste into a classifier route."""
    lines = ["tiers:"]
    for tier in tiers:
        bound = f", below: {tier.below}" if tier.below is not None else ""
        lines.append(f"  - {{tier: {tier.tier}{bound}}}")
    return "\n".join(lines) + "\n"
