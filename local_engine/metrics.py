"""Reading a vLLM engine's load: its Prometheus `/metrics` and the per-response
`endpoint-load-metrics` header.

    async with httpx.AsyncClient() as client:
        snapshot = await scrape(metrics_url("http://gpu-1:8000/v1"), client, timeout_s=1.0)
    snapshot.running, snapshot.waiting, snapshot.kv_cache_usage

Names are vLLM 0.33's (V1 engine). Samples are summed over their label sets (vLLM labels
by `model_name` and `engine`), except the KV-cache usage, a ratio, which is averaged.
Older servers' names are read when the current one is absent.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from local_engine.errors import MetricsError

# Field → sample names, first found wins (current vLLM name first, then older ones).
SUMMED: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "generation_tokens_total": ("vllm:generation_tokens_total", "vllm:generation_tokens"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total", "vllm:prompt_tokens"),
    "ttft_sum": ("vllm:time_to_first_token_seconds_sum",),
    "ttft_count": ("vllm:time_to_first_token_seconds_count",),
    "itl_sum": (
        "vllm:inter_token_latency_seconds_sum",
        "vllm:time_per_output_token_seconds_sum",
    ),
    "itl_count": (
        "vllm:inter_token_latency_seconds_count",
        "vllm:time_per_output_token_seconds_count",
    ),
    "spec_drafts": ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts"),
    "spec_draft_tokens": (
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_draft_tokens",
    ),
    "spec_accepted_tokens": (
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens",
    ),
}
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
LOAD_HEADER_FORMATS = ("TEXT", "JSON")
NAMED_METRICS_PREFIX = "named_metrics."


@dataclass(frozen=True)
class EngineMetrics:
    """One scrape of an engine's `/metrics`. Counters are totals since the engine started;
    `kv_cache_usage` is a fraction in [0, 1], None when the server does not report it."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float | None = None
    generation_tokens_total: float = 0.0
    prompt_tokens_total: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0
    spec_drafts: float = 0.0
    spec_draft_tokens: float = 0.0
    spec_accepted_tokens: float = 0.0


def parse_vllm_metrics(text: str) -> EngineMetrics:
    """Parse a Prometheus text body from vLLM's `/metrics`; missing metrics read as 0
    (None for the KV-cache usage). Raises `MetricsError` when the body is not Prometheus text.
    """
    samples = _samples_by_name(text)
    values = {field: _first_sum(samples, names) for field, names in SUMMED.items()}
    return EngineMetrics(kv_cache_usage=_first_mean(samples, KV_CACHE_USAGE), **values)


def parse_load_header(value: str) -> dict[str, float]:
    """Read vLLM's `endpoint-load-metrics` response header (ORCA load report), lenient.

    Accepts the text form (`TEXT named_metrics.kv_cache_usage_perc=0.4, ...`) and the JSON
    form (`JSON {"named_metrics": {...}}`), with or without the format word. Nested JSON keys
    are joined with dots; each `named_metrics.X` is also returned as `X` unless `X` is a
    field of its own. Non-numeric fields are skipped; never raises (garbage gives `{}`).
    """
    body = value.strip()
    word, _, rest = body.partition(" ")
    if word.upper() in LOAD_HEADER_FORMATS:
        body = rest.strip()
    found = _load_json(body) if body.startswith("{") else _load_text(body)
    for key in [k for k in found if k.startswith(NAMED_METRICS_PREFIX)]:
        found.setdefault(key.removeprefix(NAMED_METRICS_PREFIX), found[key])
    return found


def metrics_url(base_url: str) -> str:
    """The `/metrics` URL of an engine given its API base (`http://h:8000/v1` or `http://h:8000`)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    return f"{root}/metrics"


async def scrape(url: str, client: httpx.AsyncClient, timeout_s: float) -> EngineMetrics:
    """GET an engine's `/metrics` URL and parse it; any failure is a `MetricsError`."""
    try:
        response = await client.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise MetricsError(f"scraping {url} failed: {exc!r}") from exc
    if response.status_code != 200:
        raise MetricsError(f"scraping {url} returned HTTP {response.status_code}; expected 200")
    return parse_vllm_metrics(response.text)


def _samples_by_name(text: str) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not math.isnan(sample.value):
                    samples[sample.name].append(float(sample.value))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise MetricsError(f"cannot parse /metrics body as Prometheus text: {exc}") from exc
    return samples


def _first_sum(samples: Mapping[str, list[float]], names: Iterable[str]) -> float:
    return next((sum(samples[name]) for name in names if name in samples), 0.0)


def _first_mean(samples: Mapping[str, list[float]], names: Iterable[str]) -> float | None:
    for name in names:
        if samples.get(name):
            return sum(samples[name]) / len(samples[name])
    return None


def _load_json(body: str) -> dict[str, float]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    found: dict[str, float] = {}
    _flatten(document, "", found)
    return found


def _flatten(node: object, prefix: str, found: dict[str, float]) -> None:
    if isinstance(node, dict):
        for key, child in node.items():
            _flatten(child, f"{prefix}{key}.", found)
    elif isinstance(node, int | float) and not isinstance(node, bool) and math.isfinite(node):
        found[prefix.removesuffix(".")] = float(node)


def _load_text(body: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for item in body.split(","):
        key, sep, raw = item.partition("=")
        number = _number(raw.strip()) if sep else None
        if key.strip() and number is not None:
            found[key.strip()] = number
    return found


def _number(raw: str) -> float | None:
    try:
        number = float(raw)
    except ValueError:
        return None
    return number if math.isfinite(number) else None
