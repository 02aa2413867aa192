"""Deadline-aware selection: pure rules over a health view."""

from __future__ import annotations

import math

from router.selection import Health, select


def test_without_an_sla_the_plan_order_stands_minus_ejected() -> None:
    health = {"a": Health(ejected=True), "b": Health(predicted_ttft_s=9.0)}
    chosen = select(["a", "b", "c"], health)
    assert chosen.order == ("b", "c")
    assert chosen.skipped == (("a", "ejected by its circuit breaker"),)


def test_predicted_misses_are_skipped_and_unknowns_kept() -> None:
    health = {
        "a": Health(predicted_ttft_s=0.9, reason="queue"),
        "b": Health(predicted_ttft_s=0.2),
        "c": Health(),
    }
    chosen = select(["a", "b", "c"], health, ttft_s=0.5)
    assert chosen.order == ("b", "c")
    assert chosen.skipped[0][0] == "a" and "900 ms > SLA 500 ms: queue" in chosen.skipped[0][1]
    assert not chosen.degraded and not chosen.shed


def test_none_meets_it_degrade_orders_fastest_first() -> None:
    health = {
        "a": Health(predicted_ttft_s=3.0),
        "b": Health(predicted_ttft_s=math.inf),
        "c": Health(predicted_ttft_s=0.8),
    }
    chosen = select(["a", "b", "c"], health, ttft_s=0.5)
    assert chosen.order == ("c", "a", "b") and chosen.degraded


def test_none_meets_it_shed_refuses_with_a_retry_hint() -> None:
    health = {"a": Health(predicted_ttft_s=3.0)}
    chosen = select(["a"], health, ttft_s=0.5, on_miss="shed")
    assert chosen.shed and chosen.order == () and chosen.retry_after_s > 0


def test_all_ejected_leaves_nothing() -> None:
    chosen = select(["a"], {"a": Health(ejected=True)}, ttft_s=0.5)
    assert chosen.order == () and not chosen.shed
