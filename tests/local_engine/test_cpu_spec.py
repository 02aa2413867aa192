"""`kind: cpu` engine specs: the embedded CPU engine declared in the policy, its
command line, and what does not apply to it."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from pydantic import ValidationError

from local_engine.config import EngineConfig
from local_engine.cpu_command import cpu_argv
from policies import Policy
from policies.engines import EngineSpec


def cpu(**fields: Any) -> EngineSpec:
    return EngineSpec.model_validate({"kind": "cpu", "port": 8001, **fields})


def test_the_shipped_pair_by_default() -> None:
    spec = cpu()
    assert spec.served_name == "local-tiny"
    assert cpu_argv(spec) == [
        sys.executable, "-m", "local_engine.cli", "serve-cpu",
        "--host", "127.0.0.1", "--port", "8001", "--served-model-name", "local-tiny",
    ]  # fmt: skip


def test_a_checkpoint_with_a_draft_and_limits() -> None:
    spec = cpu(
        model="/models/llama-mini",
        max_num_seqs=4,
        max_model_len=256,
        threads=2,
        speculative={
            "method": "draft_model",
            "model": "/models/draft",
            "num_speculative_tokens": 3,
        },
    )
    assert spec.served_name == "llama-mini"  # the directory's name, as serve-cpu says
    assert cpu_argv(spec)[4:] == [
        "--host", "127.0.0.1", "--port", "8001", "--served-model-name", "llama-mini",
        "--model", "/models/llama-mini", "--max-num-seqs", "4", "--max-model-len", "256",
        "--threads", "2", "--draft-model", "/models/draft", "--num-speculative-tokens", "3",
    ]  # fmt: skip


def test_the_supervisor_picks_the_builder_by_kind() -> None:
    assert EngineConfig("local", cpu()).argv_builder is cpu_argv


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tensor_parallel_size": 2}, "tensor_parallel_size do not apply to kind 'cpu'"),
        ({"quantization": "awq"}, "quantization do not apply to kind 'cpu'"),
        (
            {"speculative": {"method": "ngram", "num_speculative_tokens": 3}},
            "draft model only, not 'ngram'",
        ),
    ],
)
def test_what_the_cpu_engine_cannot_do_is_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        cpu(**fields)


def test_a_vllm_engine_still_needs_its_model() -> None:
    with pytest.raises(ValidationError, match="needs model"):
        EngineSpec.model_validate({"port": 8100})


def test_a_deployment_on_a_cpu_engine() -> None:
    policy = Policy.model_validate(
        {
            "engines": {"local": {"kind": "cpu", "port": 8123, "gpu_hour_usd": 0.05,
                                  "tokens_per_second": 50, "autostart": True}},
            "deployments": {"tiny": {"engine": "local", "model": "local-tiny"}},
            "routes": {"auto": {"deployments": ["tiny"]}},
        }
    )  # fmt: skip
    deployment = policy.deployments["tiny"]
    assert deployment.api_base == "http://127.0.0.1:8123/v1"
    assert deployment.self_hosted is not None and deployment.self_hosted.gpu_hour_usd == 0.05
    assert policy.engines["local"].autostart
