"""The throughput meter: rates, acceptance and latency means over a window, and pricing."""

from __future__ import annotations

import pytest

from local_engine.metrics import EngineMetrics
from local_engine.throughput import ThroughputMeter, ThroughputStats


def snapshot(tokens: float, **fields: float) -> EngineMetrics:
    return EngineMetrics(generation_tokens_total=tokens, **fields)


def test_no_rate_before_two_snapshots() -> None:
    meter = ThroughputMeter()
    assert meter.stats() == ThroughputStats(0.0, 0.0, None, None, None, None, None)
    meter.observe(snapshot(100), at=0.0)
    assert meter.stats().tokens_per_second is None


def test_rates_and_means_are_window_deltas() -> None:
    meter = ThroughputMeter(window_s=60)
    meter.observe(
        snapshot(
            1000,
            spec_drafts=10,
            spec_draft_tokens=40,
            spec_accepted_tokens=20,
            ttft_sum=1.0,
            ttft_count=4,
            itl_sum=1.0,
            itl_count=100,
        ),
        at=100.0,
    )
    meter.observe(
        snapshot(
            3000,
            spec_drafts=110,
            spec_draft_tokens=440,
            spec_accepted_tokens=320,
            ttft_sum=3.0,
            ttft_count=14,
            itl_sum=5.0,
            itl_count=300,
        ),
        at=110.0,
    )

    stats = meter.stats()

    assert stats.span_s == 10.0
    assert stats.generation_tokens == 2000
    assert stats.tokens_per_second == 200.0
    assert stats.acceptance_rate == 0.75
    assert stats.mean_acceptance_length == 4.0
    assert stats.ttft_mean_s == pytest.approx(0.2)
    assert stats.itl_mean_s == pytest.approx(0.02)


def test_window_slides_and_keeps_one_snapshot_at_its_start() -> None:
    meter = ThroughputMeter(window_s=10)
    for second in range(0, 31):
        tokens = 100 * second if second <= 20 else 2000 + 10 * (second - 20)
        meter.observe(snapshot(tokens), at=float(second))

    stats = meter.stats()

    assert stats.span_s == 10.0
    assert stats.tokens_per_second == 10.0


def test_counter_going_down_means_restart_and_history_starts_over() -> None:
    meter = ThroughputMeter()
    meter.observe(snapshot(5000), at=0.0)
    meter.observe(snapshot(6000), at=1.0)
    meter.observe(snapshot(10), at=2.0)
    assert meter.stats().tokens_per_second is None
    meter.observe(snapshot(110), at=3.0)
    assert meter.stats().tokens_per_second == 100.0


def test_no_speculation_gives_no_acceptance_figures() -> None:
    meter = ThroughputMeter()
    meter.observe(snapshot(0), at=0.0)
    meter.observe(snapshot(10), at=1.0)
    assert meter.stats().acceptance_rate is None
    assert meter.stats().mean_acceptance_length is None
    assert meter.stats().ttft_mean_s is None


def test_price_uses_static_rate_until_enough_tokens_then_measured() -> None:
    meter = ThroughputMeter()
    meter.observe(snapshot(0), at=0.0)
    meter.observe(snapshot(500), at=1.0)
    static = meter.price_per_token(3.6, static_tokens_per_second=1000, min_tokens=1000)
    assert static == pytest.approx(3.6 / 3600 / 1000)

    meter.observe(snapshot(2000), at=2.0)
    measured = meter.price_per_token(3.6, static_tokens_per_second=1000, min_tokens=1000)
    assert measured == pytest.approx(3.6 / 3600 / 1000)  # 2000 tokens over 2 s
    meter.observe(snapshot(2000), at=4.0)  # idle time raises the price
    assert meter.price_per_token(3.6, 1000, min_tokens=1000) == pytest.approx(3.6 / 3600 / 500)


def test_price_with_no_rate_at_all_is_an_error() -> None:
    with pytest.raises(ValueError, match="tokens per second is 0"):
        ThroughputMeter().price_per_token(2.0, static_tokens_per_second=0)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_s is 0"):
        ThroughputMeter(window_s=0)
