"""The /metrics parser, the load header parser and the scrape helper."""

from __future__ import annotations

import httpx
import pytest

from local_engine.errors import EngineError, MetricsError
from local_engine.metrics import (
    EngineMetrics,
    metrics_url,
    parse_load_header,
    parse_vllm_metrics,
    scrape,
)

# Trimmed from a vLLM 0.33 server with two engines (data parallel) behind one API server.
VLLM_BODY = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 4.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.25
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 1000.0
vllm:prompt_tokens_total{engine="1",model_name="qwen"} 500.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="qwen"} 7000.0
vllm:generation_tokens_total{engine="1",model_name="qwen"} 3000.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="qwen"} 5.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="qwen"} 8.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="qwen"} 8.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="qwen"} 1.6
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="qwen"} 400.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="qwen"} 400.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="qwen"} 8.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="qwen"} 100.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="qwen"} 400.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="qwen"} 250.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen",position="0"} 90.0
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
"""

OLD_BODY = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.75
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_count{model_name="m"} 10.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.5
"""


def test_parses_vllm_names_summed_over_label_sets() -> None:
    metrics = parse_vllm_metrics(VLLM_BODY)

    assert metrics == EngineMetrics(
        running=5.0,
        waiting=4.0,
        kv_cache_usage=0.375,
        generation_tokens_total=10000.0,
        prompt_tokens_total=1500.0,
        ttft_sum=1.6,
        ttft_count=8.0,
        itl_sum=8.0,
        itl_count=400.0,
        spec_drafts=100.0,
        spec_draft_tokens=400.0,
        spec_accepted_tokens=250.0,
    )


def test_older_servers_names_are_read_when_current_ones_are_absent() -> None:
    metrics = parse_vllm_metrics(OLD_BODY)

    assert metrics.kv_cache_usage == 0.75
    assert (metrics.itl_sum, metrics.itl_count) == (0.5, 10.0)


def test_missing_metrics_read_as_zero_and_kv_cache_as_none() -> None:
    assert parse_vllm_metrics("") == EngineMetrics()
    assert parse_vllm_metrics("# TYPE other gauge\nother 1\n").kv_cache_usage is None


def test_untyped_counters_without_type_lines_are_read() -> None:
    assert parse_vllm_metrics("vllm:generation_tokens_total 42\n").generation_tokens_total == 42


@pytest.mark.parametrize("body", ["<html><body>502 Bad Gateway</body></html>", "a b c", "x{ 1"])
def test_garbage_raises_one_local_engine_error(body: str) -> None:
    with pytest.raises(MetricsError, match="Prometheus text") as caught:
        parse_vllm_metrics(body)
    assert isinstance(caught.value, EngineError)


@pytest.mark.parametrize(
    "header",
    [
        "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3",
        "named_metrics.kv_cache_usage_perc=0.4,named_metrics.num_requests_waiting=3",
        'JSON {"named_metrics": {"kv_cache_usage_perc": 0.4, "num_requests_waiting": 3}}',
        '{"named_metrics": {"kv_cache_usage_perc": 0.4, "num_requests_waiting": 3}}',
    ],
)
def test_load_header_text_and_json_forms(header: str) -> None:
    assert parse_load_header(header) == {
        "named_metrics.kv_cache_usage_perc": 0.4,
        "named_metrics.num_requests_waiting": 3.0,
        "kv_cache_usage_perc": 0.4,
        "num_requests_waiting": 3.0,
    }


def test_load_header_keeps_top_level_fields_and_skips_non_numbers() -> None:
    header = "TEXT cpu_utilization=0.3, rps_fractional=abc, named_metrics.cpu_utilization=9, x"

    assert parse_load_header(header) == {
        "cpu_utilization": 0.3,
        "named_metrics.cpu_utilization": 9.0,
    }
    assert parse_load_header('JSON {"a": true, "b": "1", "c": [1], "d": 2}') == {"d": 2.0}


@pytest.mark.parametrize("header", ["", "garbage", "JSON {not json", "TEXT =1, a=nan"])
def test_load_header_garbage_gives_nothing(header: str) -> None:
    assert parse_load_header(header) == {}


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://gpu-1:8000/v1", "http://gpu-1:8000/metrics"),
        ("http://gpu-1:8000/v1/", "http://gpu-1:8000/metrics"),
        ("http://gpu-1:8000", "http://gpu-1:8000/metrics"),
    ],
)
def test_metrics_url_from_api_base(base: str, expected: str) -> None:
    assert metrics_url(base) == expected


async def test_scrape_parses_the_body() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=VLLM_BODY))
    async with httpx.AsyncClient(transport=transport) as client:
        metrics = await scrape("http://engine/metrics", client, timeout_s=1.0)
    assert metrics.running == 5.0


async def test_scrape_failures_are_metrics_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(MetricsError, match="scraping http://engine/metrics failed"):
            await scrape("http://engine/metrics", client, timeout_s=1.0)
    transport = httpx.MockTransport(lambda request: httpx.Response(503, text="down"))
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(MetricsError, match="HTTP 503"):
            await scrape("http://engine/metrics", client, timeout_s=1.0)
