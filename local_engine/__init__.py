"""Self-hosted engines: vLLM launched and supervised from the policy's `engines`
(`engine up|status|down`), their load and token price read from `/metrics`, and the
embedded CPU engine (`local_engine.cpu`, imported only where torch is installed).

    metrics = parse_vllm_metrics(body)         # or: await scrape(url, client, timeout_s)
    meter.observe(metrics); meter.price_per_token(gpu_hour_usd, static_tokens_per_second)
"""

from __future__ import annotations

from local_engine.errors import EngineError
from local_engine.metrics import EngineMetrics, parse_load_header, parse_vllm_metrics, scrape
from local_engine.throughput import ThroughputMeter

__all__ = [
    "EngineError",
    "EngineMetrics",
    "ThroughputMeter",
    "parse_load_header",
    "parse_vllm_metrics",
    "scrape",
]
