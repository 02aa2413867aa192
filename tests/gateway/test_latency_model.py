"""The live latency model: windowed TTFT quantiles, engine load, busy marks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gateway.health.latency import MIN_SAMPLES, EngineLoad, LatencyModel
from policies import Policy


def test_unknown_until_enough_samples() -> None:
    model = LatencyModel()
    for _ in range(MIN_SAMPLES - 1):
        model.observe("a", ok=True, ttft_s=0.1, now=100.0)
    assert model.predict("a", now=100.0).ttft_s is None


def test_p90_of_the_window() -> None:
    model = LatencyModel()
    for i in range(100):
        model.observe("a", ok=True, ttft_s=2.0 if i % 10 == 0 else 0.05, now=100.0)
    assert model.predict("a", now=100.0).ttft_s == pytest.approx(0.05, rel=0.25)
    for i in range(100):  # now 30% slow: the p90 is the slow one
        model.observe("b", ok=True, ttft_s=2.0 if i % 10 < 3 else 0.05, now=100.0)
    assert model.predict("b", now=100.0).ttft_s == pytest.approx(2.0, rel=0.25)


def test_samples_age_out_of_the_window() -> None:
    model = LatencyModel(window_s=10)
    for _ in range(20):
        model.observe("a", ok=True, ttft_s=3.0, now=100.0)
    assert model.predict("a", now=101.0).ttft_s is not None
    assert model.predict("a", now=120.0).ttft_s is None  # re-measured from scratch


def test_error_rate() -> None:
    model = LatencyModel()
    for i in range(10):
        model.observe("a", ok=i % 2 == 0, ttft_s=0.1 if i % 2 == 0 else None, now=5.0)
    assert model.predict("a", now=5.0).error_rate == pytest.approx(0.5)


def test_queue_depth_scales_the_prediction() -> None:
    model = LatencyModel()
    for _ in range(10):
        model.observe("a", ok=True, ttft_s=0.1, now=50.0)
    model.observe_load("a", EngineLoad(running=4, waiting=12, kv_cache_usage=0.5, at=50.0))
    prediction = model.predict("a", now=50.0)
    assert prediction.ttft_s == pytest.approx(0.1 * (1 + 12 / 4), rel=0.25)
    assert "12 waiting" in prediction.reason


def test_engine_load_alone_predicts_a_queue() -> None:
    model = LatencyModel()
    model.observe_load("a", EngineLoad(running=8, waiting=200, kv_cache_usage=0.99, at=10.0))
    predicted = model.predict("a", now=10.0).ttft_s
    assert predicted is not None and predicted > 1.0


def test_busy_means_a_certain_miss_for_a_while() -> None:
    model = LatencyModel()
    model.mark_busy("a", 2.0, now=10.0)
    assert model.predict("a", now=11.0).ttft_s == math.inf
    assert model.predict("a", now=12.5).ttft_s is None


def test_a_reloaded_latency_window_applies(tmp_path: Path) -> None:
    """`gateway.latency_window_s` is read at each reload, not only at start."""
    from gateway.health.sla import build_guard
    from gateway.metrics import Metrics
    from policies.loader import load_sources

    def policy(extra: str) -> Policy:
        text = "deployments: {a: {model: m, api_base: 'http://h/v1'}}\nroutes: {}\n" + extra
        return load_sources([(tmp_path / "p.yaml", text.encode())], {}).policy

    guard = build_guard(Metrics(), policy(""), None, "test:", tmp_path)
    assert guard.latency.window_s == 60.0
    guard.configure(policy("gateway: {latency_window_s: 15}\n"))
    assert guard.latency.window_s == 15.0
