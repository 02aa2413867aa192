"""Engine spec → `vllm serve` argv, compared exactly (its environment: test_environment)."""

from __future__ import annotations

import json
from typing import Any

from local_engine.vllm_command import speculative_config_json, vllm_argv
from policies.engines import EngineSpec


def spec(**fields: Any) -> EngineSpec:
    return EngineSpec.model_validate({"model": "Qwen/Qwen3-4B", "port": 8100, **fields})


def test_minimal_spec_passes_where_it_listens_and_its_parallelism() -> None:
    assert vllm_argv(spec()) == [
        "vllm", "serve", "Qwen/Qwen3-4B", "--host", "127.0.0.1", "--port", "8100",
        "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1",
    ]  # fmt: skip


def test_every_flag_in_order() -> None:
    full = spec(
        executable="/opt/vllm/bin/vllm",
        served_model_name="small",
        host="0.0.0.0",
        dtype="bfloat16",
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        gpu_memory_utilization=0.85,
        max_model_len=8192,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        max_num_queued_reqs=256,
        max_num_queued_tokens=65536,
        quantization="fp8",
        kv_cache_dtype="fp8",
        enable_prefix_caching=False,
        scheduling_policy="priority",
        extra_args=["--seed", "7", "--enforce-eager"],
    )

    assert vllm_argv(full) == [
        "/opt/vllm/bin/vllm", "serve", "Qwen/Qwen3-4B",
        "--host", "0.0.0.0",
        "--port", "8100",
        "--served-model-name", "small",
        "--dtype", "bfloat16",
        "--tensor-parallel-size", "2",
        "--pipeline-parallel-size", "2",
        "--gpu-memory-utilization", "0.85",
        "--max-model-len", "8192",
        "--max-num-seqs", "64",
        "--max-num-batched-tokens", "4096",
        "--max-num-queued-reqs", "256",
        "--max-num-queued-tokens", "65536",
        "--quantization", "fp8",
        "--kv-cache-dtype", "fp8",
        "--scheduling-policy", "priority",
        "--no-enable-prefix-caching",
        "--seed", "7", "--enforce-eager",
    ]  # fmt: skip


def test_prefix_caching_on() -> None:
    assert vllm_argv(spec(enable_prefix_caching=True))[-1] == "--enable-prefix-caching"


def test_ngram_speculation() -> None:
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
             "prompt_lookup_max": 5}  # fmt: skip

    assert vllm_argv(spec(speculative=ngram))[-2:] == [
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":5}',
    ]


def test_draft_model_speculation() -> None:
    draft = {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 5,
             "draft_tensor_parallel_size": 1}  # fmt: skip
    argv = vllm_argv(spec(tensor_parallel_size=2, speculative=draft))

    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "draft_model",
        "model": "Qwen/Qwen3-0.6B",
        "num_speculative_tokens": 5,
        "draft_tensor_parallel_size": 1,
    }


def test_eagle3_and_mtp_and_extra_fields() -> None:
    eagle = spec(speculative={"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                              "num_speculative_tokens": 3})  # fmt: skip
    assert eagle.speculative is not None
    assert speculative_config_json(eagle.speculative) == (
        '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",'
        '"num_speculative_tokens":3}'
    )
    mtp = spec(speculative={"method": "mtp", "num_speculative_tokens": 1,
                            "extra": {"disable_padded_drafter_batch": True}})  # fmt: skip
    assert mtp.speculative is not None
    assert speculative_config_json(mtp.speculative) == (
        '{"method":"mtp","num_speculative_tokens":1,"disable_padded_drafter_batch":true}'
    )


def test_api_key_stays_out_of_argv() -> None:
    assert "fake-engine-key" not in " ".join(vllm_argv(spec(api_key="fake-engine-key")))
