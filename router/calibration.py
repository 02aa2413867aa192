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


def calibrate(scores: Sequence[float], shares: Mapping[str, float]) -> list[Threshold]:
    """Tiers in the order given; each gets (about) its share of the sample."""
    if not scores:
        raise RoutingError("calibration needs at least one scored prompt")
    total = sum(shares.values())
    if not shares or total <= 0 or any(share < 0 for share in shares.values()):
        raise RoutingError(f"tier shares must be non-negative and sum above 0, got {dict(shares)}")
    cumulative = np.cumsum([share / total for share in shares.values()])[:-1]
    cuts = np.quantile(np.asarray(scores, dtype=float), cumulative) if len(cumulative) else []
    names = list(shares)
    tiers = [Threshold(name, round(float(cut), 4)) for name, cut in zip(names, cuts, strict=False)]
    return [*tiers, Threshold(names[-1])]


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
