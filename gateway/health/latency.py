"""The live latency model: per deployment, TTFT, inter-token time and error rate over a
sliding window, plus the engine's own load, combined into a predicted TTFT.

Samples land in one-second buckets of log-spaced histogram bins, so recording is O(1)
on the request path and a quantile merges at most `window_s` small buckets. Predictions
are cached for `REFRESH_S`: selection asks for them on every request.

A deployment with too few samples has no observed TTFT; it is then predicted from its
engine's load alone, or not at all (unknown is treated as "may meet the SLA", so a
deployment that aged out of the window gets traffic again and is re-measured).
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from dataclasses import dataclass, field

# Bin edges in seconds: 1 ms .. ~200 s, 20% apart (quantiles are good to ~10%).
BIN_EDGES: tuple[float, ...] = tuple(0.001 * 1.2**i for i in range(68))
REFRESH_S = 0.25
MIN_SAMPLES = 5
TTFT_QUANTILE = 0.9
# Assumed per-request TTFT of an engine with a queue but no samples yet.
DEFAULT_BASE_TTFT_S = 0.1
KV_CACHE_FULL = 0.98


@dataclass(slots=True)
class _Bucket:
    second: int
    ttft: list[int] = field(default_factory=lambda: [0] * (len(BIN_EDGES) + 1))
    itl_sum: float = 0.0
    itl_count: int = 0
    ok: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a deployment's engine says about itself (vLLM's `/metrics` or its
    `endpoint-load-metrics` header)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float | None = None
    mean_ttft_s: float | None = None  # the engine's own recent TTFT, queueing included
    at: float = 0.0  # time.monotonic() when read


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted TTFT in seconds (None: unknown) and why."""

    ttft_s: float | None
    reason: str
    samples: int = 0
    error_rate: float = 0.0


class _Series:
    def __init__(self) -> None:
        self.buckets: deque[_Bucket] = deque()
        self.load: EngineLoad | None = None
        self.busy_until = 0.0
        self.cached: Prediction | None = None
        self.cached_at = -math.inf

    def bucket(self, second: int) -> _Bucket:
        if not self.buckets or self.buckets[-1].second != second:
            self.buckets.append(_Bucket(second))
        return self.buckets[-1]

    def expire(self, oldest: int) -> None:
        while self.buckets and self.buckets[0].second < oldest:
            self.buckets.popleft()


class LatencyModel:
    """Per-deployment latency over the last `window_s` seconds.

    model.observe("gpu-a", ttft_s=0.12, ok=True)
    model.predict("gpu-a").ttft_s
    """

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._series: dict[str, _Series] = {}

    def _get(self, deployment: str) -> _Series:
        series = self._series.get(deployment)
        if series is None:
            series = self._series[deployment] = _Series()
        return series

    def observe(
        self,
        deployment: str,
        *,
        ok: bool,
        ttft_s: float | None = None,
        itl_s: float | None = None,
        now: float | None = None,
    ) -> None:
        """One finished attempt: its outcome, and its TTFT and mean inter-token time."""
        series = self._get(deployment)
        now = time.monotonic() if now is None else now
        bucket = series.bucket(int(now))
        if len(series.buckets) > self.window_s + 2:  # bounded even if nobody predicts
            series.expire(int(now - self.window_s))
        if ok:
            bucket.ok += 1
        else:
            bucket.failed += 1
        if ttft_s is not None:
            bucket.ttft[bisect.bisect_left(BIN_EDGES, ttft_s)] += 1
        if itl_s is not None:
            bucket.itl_sum += itl_s
            bucket.itl_count += 1

    def observe_load(self, deployment: str, load: EngineLoad) -> None:
        series = self._get(deployment)
        series.load = load
        series.cached_at = -math.inf

    def mark_busy(self, deployment: str, seconds: float, now: float | None = None) -> None:
        """The engine refused for lack of room (vLLM's 503): predict a miss for a while."""
        series = self._get(deployment)
        series.busy_until = (time.monotonic() if now is None else now) + seconds
        series.cached_at = -math.inf

    def predict(self, deployment: str, now: float | None = None) -> Prediction:
        now = time.monotonic() if now is None else now
        series = self._get(deployment)
        if now < series.busy_until:
            return Prediction(math.inf, "busy (the engine refused for lack of room)")
        if series.cached is not None and now - series.cached_at < REFRESH_S:
            return series.cached
        series.expire(int(now - self.window_s))
        series.cached = _predict(series, now)
        series.cached_at = now
        return series.cached

    def itl_mean(self, deployment: str) -> float | None:
        series = self._get(deployment)
        total = sum(b.itl_sum for b in series.buckets)
        count = sum(b.itl_count for b in series.buckets)
        return total / count if count else None


def _predict(series: _Series, now: float) -> Prediction:
    counts = [0] * (len(BIN_EDGES) + 1)
    ok = failed = 0
    for bucket in series.buckets:
        ok += bucket.ok
        failed += bucket.failed
        for i, n in enumerate(bucket.ttft):
            if n:
                counts[i] += n
    samples = sum(counts)
    error_rate = failed / (ok + failed) if ok + failed else 0.0
    observed = _quantile(counts, TTFT_QUANTILE) if samples >= MIN_SAMPLES else None
    load = series.load
    if load is None or now - load.at > 30.0:  # no fresh load reading: latency alone
        if observed is None:
            return Prediction(None, f"{samples} TTFT samples, no load reading", samples, error_rate)
        reason = f"p90 TTFT {observed * 1000:.0f} ms over {samples} requests"
        return Prediction(observed, reason, samples, error_rate)
    # Queued requests wait for running ones to leave the batch: scale by queue depth.
    factor = 1.0 + load.waiting / max(1.0, load.running)
    if load.kv_cache_usage is not None and load.kv_cache_usage >= KV_CACHE_FULL and load.waiting:
        factor *= 2.0  # full KV cache: new requests also wait for memory
    base = observed or load.mean_ttft_s or DEFAULT_BASE_TTFT_S
    reason = (
        f"base TTFT {base * 1000:.0f} ms x queue factor {factor:.2f} "
        f"({load.running:g} running, {load.waiting:g} waiting)"
    )
    return Prediction(base * factor, reason, samples, error_rate)


def _quantile(counts: list[int], q: float) -> float:
    """Upper edge of the bin holding the q-quantile (conservative by one bin)."""
    target = q * sum(counts)
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= target:
            return BIN_EDGES[min(i, len(BIN_EDGES) - 1)]
    return BIN_EDGES[-1]
