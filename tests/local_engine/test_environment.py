"""An engine's environment: the supervisor's allow-listed variables, the spec's `env`, the
API key (end to end through `engine up`: test_engine_cli)."""

from __future__ import annotations

from typing import Any

import pytest

from local_engine.environment import engine_env, inherited
from policies.engines import EngineSpec

ALLOWED = {
    "PATH": "/usr/bin",
    "HOME": "/home/engine",
    "LC_ALL": "C.UTF-8",
    "PYTHONPATH": "/srv/app",
    "CUDA_VISIBLE_DEVICES": "0",
    "HF_HOME": "/models",
    "OMP_NUM_THREADS": "4",
}
SECRETS = {
    "OPENAI_API_KEY": "fake-openai-key",
    "ANTHROPIC_API_KEY": "fake-anthropic-key",
    "GATEWAY_ADMIN_KEY": "fake-admin-key",
    "REDIS_URL": "redis://:fake-redis-password@127.0.0.1:6379/0",
    "CASCADE_REDIS_URL": "redis://:fake-redis-password@127.0.0.1:6379/0",
}
SUPERVISOR = {**ALLOWED, **SECRETS, "VLLM_API_KEY": "inherited"}


def spec(**fields: Any) -> EngineSpec:
    return EngineSpec.model_validate({"model": "Qwen/Qwen3-4B", "port": 8100, **fields})


def test_only_the_allow_listed_variables_are_inherited() -> None:
    assert engine_env(spec(), SUPERVISOR) == ALLOWED


def test_the_spec_env_adds_any_name_and_wins() -> None:
    own = {"CUDA_VISIBLE_DEVICES": "2,3", "HTTPS_PROXY": "http://proxy:3128"}

    assert engine_env(spec(env=own), SUPERVISOR) == {**ALLOWED, **own}


def test_the_api_key_comes_from_the_spec_alone() -> None:
    keyed = spec(api_key="fake-engine-key", env={"VLLM_API_KEY": "from-env"})

    assert engine_env(keyed, SUPERVISOR) == {**ALLOWED, "VLLM_API_KEY": "fake-engine-key"}
    assert engine_env(spec(env={"VLLM_API_KEY": "from-env"}), SUPERVISOR) == ALLOWED
    # `${VAR:-}` with VAR unset: no key, as the gateway (which then sends none) sees it
    assert engine_env(spec(api_key=""), SUPERVISOR) == ALLOWED


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("USER", True),
        ("VIRTUAL_ENV", True),
        ("LD_LIBRARY_PATH", True),
        ("SSL_CERT_FILE", True),
        ("NVIDIA_VISIBLE_DEVICES", True),
        ("NCCL_DEBUG", True),
        ("HUGGING_FACE_HUB_TOKEN", True),
        ("VLLM_ATTENTION_BACKEND", True),
        ("PYTORCH_CUDA_ALLOC_CONF", True),
        ("OPENBLAS_CORETYPE", True),
        ("AWS_SECRET_ACCESS_KEY", False),
        ("CASCADE_POLICY", False),
        ("LOCAL_ENGINE_URL", False),
        ("HTTPS_PROXY", False),  # may carry a password: an engine that needs it says so
        ("PATHEXT", False),  # names match whole, prefixes by their start
    ],
)
def test_inherited_names_and_prefixes(name: str, expected: bool) -> None:
    assert inherited(name) is expected
