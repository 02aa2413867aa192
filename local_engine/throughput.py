"""Measured throughput and token price of an engine, from successive `/metrics` snapshots.

    meter = ThroughputMeter(window_s=60.0)
    meter.observe(parse_vllm_metrics(body), at=time.monotonic())   # after each scrape
    meter.stats().tokens_per_second
    meter.price_per_token(gpu_hour_usd=2.5, static_tokens_per_second=1500.0)

Rates are deltas between the oldest and newest snapshot in the window. The window keeps
one snapshot at or before its start, so it spans the whole window once that much history
exists. A counter that goes down means the engine restarted: history starts over.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from local_engine.metrics import EngineMetrics

DEFAULT_WINDOW_S = 60.0
DEFAULT_MIN_TOKENS = 1000.0
SECONDS_PER_HOUR = 3600.0
# Monotonic counters; any of them going down marks an engine restart.
COUNTER_FIELDS = (
    "generation_tokens_total",
    "prompt_tokens_total",
    "ttft_count",
    "itl_count",
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
)


@dataclass(frozen=True)
class ThroughputStats:
    """What the window measured; a figure is None when the window holds no data for it."""

    span_s: float
    generation_tokens: float
    tokens_per_second: float | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    ttft_mean_s: float | None
    itl_mean_s: float | None


class ThroughputMeter:
    """Generation rate, speculative-decoding acceptance and latency means over a window."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s is {window_s}; expected a positive number of seconds")
        self.window_s = window_s
        self._snapshots: deque[tuple[float, EngineMetrics]] = deque()

    def observe(self, metrics: EngineMetrics, at: float | None = None) -> None:
        """Record a snapshot taken at `at` (monotonic seconds; now when omitted)."""
        now = time.monotonic() if at is None else at
        if self._snapshots and _restarted(self._snapshots[-1][1], metrics):
            self._snapshots.clear()
        self._snapshots.append((now, metrics))
        start = now - self.window_s
        while len(self._snapshots) > 2 and self._snapshots[1][0] <= start:
            self._snapshots.popleft()

    def reset(self) -> None:
        self._snapshots.clear()

    def stats(self) -> ThroughputStats:
        if len(self._snapshots) < 2:
            return ThroughputStats(0.0, 0.0, None, None, None, None, None)
        (t0, first), (t1, last) = self._snapshots[0], self._snapshots[-1]
        span = t1 - t0
        tokens = last.generation_tokens_total - first.generation_tokens_total
        drafts = last.spec_drafts - first.spec_drafts
        draft_tokens = last.spec_draft_tokens - first.spec_draft_tokens
        accepted = last.spec_accepted_tokens - first.spec_accepted_tokens
        return ThroughputStats(
            span_s=span,
            generation_tokens=tokens,
            tokens_per_second=tokens / span if span > 0 else None,
            acceptance_rate=_ratio(accepted, draft_tokens),
            mean_acceptance_length=None if drafts <= 0 else 1.0 + accepted / drafts,
            ttft_mean_s=_ratio(last.ttft_sum - first.ttft_sum, last.ttft_count - first.ttft_count),
            itl_mean_s=_ratio(last.itl_sum - first.itl_sum, last.itl_count - first.itl_count),
        )

    def price_per_token(
        self,
        gpu_hour_usd: float,
        static_tokens_per_second: float,
        min_tokens: float = DEFAULT_MIN_TOKENS,
    ) -> float:
        """USD per generated token: the GPU-hour cost over the measured rate once the window
        saw `min_tokens` tokens, else over `static_tokens_per_second` (the policy's figure).

        The measured rate includes idle time, so an underused engine prices its tokens
        higher: the GPU costs the same whether or not it is busy.
        """
        stats = self.stats()
        rate = static_tokens_per_second
        if stats.tokens_per_second and stats.generation_tokens >= min_tokens:
            rate = stats.tokens_per_second
        if rate <= 0:
            raise ValueError(f"tokens per second is {rate}; expected a positive rate")
        return gpu_hour_usd / (SECONDS_PER_HOUR * rate)


def _restarted(before: EngineMetrics, after: EngineMetrics) -> bool:
    return any(getattr(after, name) < getattr(before, name) for name in COUNTER_FIELDS)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None
