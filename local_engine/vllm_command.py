"""An engine spec as a `vllm serve` command: an argv list (no shell).

    vllm_argv(spec)  # ['vllm', 'serve', 'Qwen/Qwen3-4B', '--host', '127.0.0.1', ...]

Only flags whose field is set are passed, in `FLAG_FIELDS` order, then prefix caching,
speculative decoding and `extra_args`. The API key travels in the environment
(`VLLM_API_KEY`, which vLLM reads like `--api-key`; see `local_engine.environment`) so
it does not show in `ps`.
"""

from __future__ import annotations

import json

from local_engine.errors import EngineSpecError
from policies.engines import FLAG_FIELDS, EngineSpec, Speculation

# Speculation fields copied into vLLM's JSON when set, in this order.
SPECULATIVE_JSON_FIELDS = (
    "method",
    "model",
    "num_speculative_tokens",
    "draft_tensor_parallel_size",
    "prompt_lookup_min",
    "prompt_lookup_max",
)


def vllm_argv(spec: EngineSpec) -> list[str]:
    """The `vllm serve` command line for `spec`."""
    if spec.model is None:  # the schema requires it for vLLM engines
        raise EngineSpecError("a vLLM engine needs model")
    argv = [spec.executable, "serve", spec.model]
    for name in FLAG_FIELDS:
        value = getattr(spec, name)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    if spec.enable_prefix_caching is not None:
        argv.append(
            "--enable-prefix-caching"
            if spec.enable_prefix_caching
            else "--no-enable-prefix-caching"
        )
    if spec.speculative is not None:
        argv += ["--speculative-config", speculative_config_json(spec.speculative)]
    return [*argv, *spec.extra_args]


def speculative_config_json(speculation: Speculation) -> str:
    """vLLM's `--speculative-config` value: compact JSON with the fields that are set."""
    config: dict[str, object] = {}
    for name in SPECULATIVE_JSON_FIELDS:
        value = getattr(speculation, name)
        if value is not None:
            config[name] = value
    config.update(speculation.extra)
    return json.dumps(config, separators=(",", ":"))
