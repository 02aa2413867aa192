"""Engine specs in the policy: what vLLM would reject is a policy error naming the field."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from policies import Policy, PolicyError, load_policy
from policies.engines import EngineSpec


def engine(**fields: Any) -> dict[str, Any]:
    return {"model": "Qwen/Qwen3-4B", "port": 8100, **fields}


def policy_with(engines: dict[str, Any], **deployment: Any) -> dict[str, Any]:
    return {
        "engines": engines,
        "deployments": {"local": {"model": "Qwen/Qwen3-4B", "engine": "small", **deployment}},
        "routes": {"auto": {"deployments": ["local"]}},
    }


def error_of(**fields: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        EngineSpec.model_validate(engine(**fields))
    return str(caught.value)


def test_defaults_pass_no_flags_and_listen_on_loopback() -> None:
    spec = EngineSpec.model_validate(engine())
    assert (spec.host, spec.tensor_parallel_size, spec.speculative) == ("127.0.0.1", 1, None)
    assert spec.api_base == "http://127.0.0.1:8100/v1"
    assert spec.served_name == "Qwen/Qwen3-4B"


@pytest.mark.parametrize(
    ("host", "base"),
    [
        ("0.0.0.0", "http://127.0.0.1:1/v1"),
        ("::", "http://[::1]:1/v1"),
        ("gpu-1", "http://gpu-1:1/v1"),
    ],
)
def test_api_base_reaches_wildcard_hosts_on_loopback(host: str, base: str) -> None:
    assert EngineSpec.model_validate(engine(host=host, port=1)).api_base == base


@pytest.mark.parametrize(
    ("speculative", "message"),
    [
        (
            {"method": "ngram", "num_speculative_tokens": 4, "tensor_parallel_size": 2},
            "tensor_parallel_size is not a speculative field",
        ),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 4,
                "prompt_lookup_min": 6,
                "prompt_lookup_max": 4,
            },
            "prompt_lookup_min 6 is above prompt_lookup_max 4",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 4, "model": "small"},
            "model does not apply to method 'ngram'",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 4, "draft_tensor_parallel_size": 1},
            "draft_tensor_parallel_size does not apply to method 'ngram'",
        ),
        (
            {"method": "draft_model", "num_speculative_tokens": 4},
            "method 'draft_model' needs model",
        ),
        (
            {"method": "eagle3", "num_speculative_tokens": 2, "model": "h", "prompt_lookup_max": 3},
            "prompt_lookup_max does not apply to method 'eagle3'",
        ),
        ({"method": "mtp", "num_speculative_tokens": 1, "model": "x"}, "model does not apply"),
        ({"method": "ngram"}, "num_speculative_tokens\n  Field required"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "greater than 0"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0},
            "greater than 0",
        ),
        ({"method": "medusa", "num_speculative_tokens": 2}, "'ngram', 'ngram_gpu', 'draft_model'"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "extra": {"prompt_lookup_max": 3}},
            "extra repeats prompt_lookup_max",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "extra": {"tensor_parallel_size": 2}},
            "extra repeats tensor_parallel_size",
        ),
    ],
)
def test_speculation_vllm_would_reject(speculative: dict[str, Any], message: str) -> None:
    assert message in error_of(speculative=speculative)


@pytest.mark.parametrize("draft_tp", [1, 4])
def test_draft_tensor_parallel_size_one_or_the_targets(draft_tp: int) -> None:
    speculative = {
        "method": "draft_model",
        "model": "d",
        "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": draft_tp,
    }
    spec = EngineSpec.model_validate(engine(tensor_parallel_size=4, speculative=speculative))
    assert spec.speculative is not None
    assert spec.speculative.draft_tensor_parallel_size == draft_tp


def test_other_draft_tensor_parallel_size_is_rejected() -> None:
    speculative = {
        "method": "draft_model",
        "model": "d",
        "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": 2,
    }
    message = error_of(tensor_parallel_size=4, speculative=speculative)
    assert "speculative.draft_tensor_parallel_size is 2; vLLM takes 1 or the engine's" in message


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"scheduling_policy": "lifo"}, "'fcfs' or 'priority'"),
        ({"gpu_memory_utilization": 1.5}, "less than or equal to 1"),
        ({"port": 0}, "greater than or equal to 1"),
        ({"tensor_parallel_size": 0}, "greater than 0"),
        ({"extra_args": ["--port=9000"]}, "extra_args has --port, which a field of the engine"),
        ({"extra_args": ["--speculative-config", "{}"]}, "extra_args has --speculative-config"),
        ({"restart_backoff_s": 10, "restart_backoff_max_s": 5}, "restart_backoff_max_s 5.0 is"),
        ({"max_num_seq": 8}, "Extra inputs are not permitted"),
    ],
)
def test_engine_fields_are_checked(fields: dict[str, Any], message: str) -> None:
    assert message in error_of(**fields)


def test_deployment_gets_api_base_key_pricing_and_priority_from_its_engine() -> None:
    small = engine(
        api_key="k", gpu_hour_usd=2.0, tokens_per_second=500, scheduling_policy="priority"
    )
    policy = Policy.model_validate(policy_with({"small": small}))

    deployment = policy.deployments["local"]

    assert (deployment.api_base, deployment.api_key) == ("http://127.0.0.1:8100/v1", "k")
    assert deployment.self_hosted is not None
    assert (deployment.self_hosted.gpu_hour_usd, deployment.self_hosted.tokens_per_second) == (
        2,
        500,
    )
    assert deployment.priority_scheduling is True
    assert deployment.unavailable_reason() is None


def test_deployment_own_api_base_wins() -> None:
    data = policy_with({"small": engine()}, api_base="http://lb:80/v1")
    assert Policy.model_validate(data).deployments["local"].api_base == "http://lb:80/v1"


def test_cross_references(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        textwrap.dedent("""\
        engines:
          small: {model: Qwen/Qwen3-4B, port: 8100}
          other: {model: m2, port: 8100}
        deployments:
          local: {model: Qwen/Qwen3-4B, engine: smal}
          wrong-name: {model: qwen, engine: small}
        routes:
          auto: {deployments: [local, wrong-name]}
        """)
    )

    with pytest.raises(PolicyError) as caught:
        load_policy(path, env={})

    assert [f"{p.line}: {p.field}: {p.message}" for p in caught.value.problems] == [
        "3: engines.other.port: engine 'other' listens on 127.0.0.1:8100, as engine 'small' "
        "does; give each engine its own port",
        "5: deployments.local.engine: deployment 'local' names engine 'smal', which is not "
        "declared; declared: small, other",
        "6: deployments.wrong-name.model: deployment 'wrong-name' asks for model 'qwen' but "
        "engine 'small' serves 'Qwen/Qwen3-4B'",
    ]


def test_speculation_error_is_located_and_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        textwrap.dedent("""\
        engines:
          small:
            model: Qwen/Qwen3-4B
            port: 8100
            speculative:
              method: ngram
              num_speculative_tokens: 4
              prompt_lookup_min: 5
              prompt_lookup_max: 2
        deployments:
          local: {model: Qwen/Qwen3-4B, engine: small}
        routes:
          auto: {deployments: [local]}
        """)
    )

    with pytest.raises(PolicyError) as caught:
        load_policy(path, env={})

    (problem,) = caught.value.problems
    assert (problem.line, problem.field) == (6, "engines.small.speculative")
    assert problem.message == "prompt_lookup_min 5 is above prompt_lookup_max 2"


def test_engine_api_key_must_come_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    body = (
        "engines:\n  small: {model: m, port: 8100, api_key: %s}\n"
        "deployments:\n  local: {model: m, engine: small}\n"
        "routes:\n  auto: {deployments: [local]}\n"
    )
    path.write_text(body % "plain-secret")
    with pytest.raises(PolicyError, match=r"engines\.small\.api_key: secrets come from the env"):
        load_policy(path, env={})

    path.write_text(body % "'${ENGINE_KEY}'")
    loaded = load_policy(path, env={"ENGINE_KEY": "fake-engine-key"})
    assert loaded.policy.engines["small"].api_key == "fake-engine-key"
    assert loaded.policy.deployments["local"].api_key == "fake-engine-key"
