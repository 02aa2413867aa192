"""Deadline-aware selection: order a plan's deployments by whether they can meet the
route's time-to-first-token SLA. Pure logic; the gateway supplies the health view.

    select(["gpu-a", "gpu-b"], health, ttft_s=0.5, on_miss="degrade")

Rules, in order:
1. Deployments whose circuit breaker is open are dropped (all dropped: nothing to try).
2. Without an SLA (or with load-aware selection off) the plan's order stands.
3. Deployments predicted to miss `ttft_s` are skipped; the rest keep the plan's order
   (the router's tier choice first, then its fallbacks). Unknown predictions count as
   meeting it, so a deployment that aged out of the latency window is tried again.
4. If none is predicted to meet it: `degrade` tries them all, fastest predicted first
   (which may be a different tier); `shed` refuses, with a retry hint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

SlaMissType = Literal["degrade", "shed"]
SHED_RETRY_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class Health:
    """What the gateway knows of one deployment right now."""

    ejected: bool = False  # circuit breaker open
    predicted_ttft_s: float | None = None  # None: unknown
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Selection:
    order: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (deployment, why)
    shed: bool = False
    degraded: bool = False
    retry_after_s: float = 0.0


def select(
    planned: Sequence[str],
    health: Mapping[str, Health],
    ttft_s: float | None = None,
    on_miss: SlaMissType = "degrade",
) -> Selection:
    skipped: list[tuple[str, str]] = []
    usable: list[str] = []
    for name in planned:
        if health.get(name, Health()).ejected:
            skipped.append((name, "ejected by its circuit breaker"))
        else:
            usable.append(name)
    if ttft_s is None or not usable:
        return Selection(tuple(usable), tuple(skipped))
    meets: list[str] = []
    misses: list[str] = []
    for name in usable:
        predicted = health.get(name, Health()).predicted_ttft_s
        if predicted is None or predicted <= ttft_s:
            meets.append(name)
        else:
            misses.append(name)
            reason = health[name].reason or "slow"
            skipped.append((name, f"predicted TTFT {_ms(predicted)} > SLA {_ms(ttft_s)}: {reason}"))
    if meets:
        return Selection(tuple(meets), tuple(skipped))
    if on_miss == "shed":
        return Selection((), tuple(skipped), shed=True, retry_after_s=SHED_RETRY_AFTER_S)
    fastest = sorted(misses, key=lambda name: _predicted(health, name))
    return Selection(tuple(fastest), tuple(skipped), degraded=True)


def _predicted(health: Mapping[str, Health], name: str) -> float:
    value = health[name].predicted_ttft_s
    return math.inf if value is None else value


def _ms(seconds: float) -> str:
    return "inf" if math.isinf(seconds) else f"{seconds * 1000:.0f} ms"
