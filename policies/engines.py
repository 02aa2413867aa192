"""The policy's `engines` section: self-hosted vLLM servers that `cascade-gateway engine up`
launches, and that deployments name with `engine:`.

    engines:
      small:
        model: Qwen/Qwen3-4B
        port: 8100
        speculative: {method: ngram, num_speculative_tokens: 4, prompt_lookup_max: 4}

Field names follow `vllm serve`'s flags (vLLM 0.33); `local_engine.vllm_command` turns a
spec into the command line. What vLLM would reject at start-up is rejected here, with the
field named, so a bad edit fails in `policy check` rather than minutes into a model load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from policies.section import (
    Count,
    GpuHourUsd,
    Interval,
    PositiveInt,
    Seconds,
    Secret,
    Section,
    TokensPerSecond,
)

EngineKindType = Literal["vllm", "cpu"]
SpeculativeMethodType = Literal["ngram", "ngram_gpu", "draft_model", "eagle", "eagle3", "mtp"]
SchedulingPolicyType = Literal["fcfs", "priority"]
DtypeType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]

# Per method: the fields it needs and the optional ones it accepts, beyond
# `method` and `num_speculative_tokens`. Anything else set is an error.
SPECULATIVE_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "ngram": (frozenset(), frozenset({"prompt_lookup_min", "prompt_lookup_max"})),
    "ngram_gpu": (frozenset(), frozenset({"prompt_lookup_min", "prompt_lookup_max"})),
    "draft_model": (frozenset({"model"}), frozenset({"draft_tensor_parallel_size"})),
    "eagle": (frozenset({"model"}), frozenset({"draft_tensor_parallel_size"})),
    "eagle3": (frozenset({"model"}), frozenset({"draft_tensor_parallel_size"})),
    # MTP drafts with the target's own prediction heads: no separate model.
    "mtp": (frozenset(), frozenset()),
}
OPTIONAL_SPECULATIVE_FIELDS = frozenset(
    {"model", "draft_tensor_parallel_size", "prompt_lookup_min", "prompt_lookup_max"}
)
# Fields our flags or fields own; `extra_args` and `speculative.extra` must not repeat them.
RESERVED_SPECULATIVE_KEYS = OPTIONAL_SPECULATIVE_FIELDS | {"method", "num_speculative_tokens"}

# Spec fields passed as `--<field-with-dashes> VALUE`, in command-line order.
FLAG_FIELDS = (
    "host",
    "port",
    "served_model_name",
    "dtype",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_num_queued_reqs",
    "max_num_queued_tokens",
    "quantization",
    "kv_cache_dtype",
    "scheduling_policy",
)
RESERVED_FLAGS = frozenset(
    {"--" + name.replace("_", "-") for name in FLAG_FIELDS}
    | {"--speculative-config", "--api-key", "--enable-prefix-caching", "--no-enable-prefix-caching"}
)
# The embedded CPU engine (`engine serve-cpu`) takes these fields; the rest are vLLM's.
CPU_FIELDS = frozenset(
    {"kind", "model", "served_model_name", "host", "port", "max_num_seqs", "max_model_len",
     "threads", "speculative", "gpu_hour_usd", "tokens_per_second", "autostart", "env",
     "startup_timeout_s", "stop_timeout_s", "health_interval_s", "unhealthy_after",
     "restart_backoff_s", "restart_backoff_max_s", "max_restarts", "log_dir"}
)  # fmt: skip
CPU_DEFAULT_SERVED_NAME = "local-tiny"  # the shipped model pair's name
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}

JsonScalar = str | int | float | bool


class Speculation(Section):
    """Speculative decoding, passed to vLLM as `--speculative-config '<json>'`.

    `ngram` (or `ngram_gpu`) drafts from the prompt (`prompt_lookup_min`/`_max`, n-gram
    sizes; vLLM uses 5 for both when both are left out, and one for the other when one
    is); `draft_model` runs a smaller `model` of the same tokenizer, on
    `draft_tensor_parallel_size` GPUs (1 or the target's size); `eagle` and `eagle3` run
    a trained draft head `model`; `mtp` uses the target's own MTP layers.
    `extra` carries other vLLM speculative-config fields verbatim.
    """

    method: SpeculativeMethodType
    num_speculative_tokens: PositiveInt
    model: str | None = None
    draft_tensor_parallel_size: PositiveInt | None = None
    prompt_lookup_min: PositiveInt | None = None
    prompt_lookup_max: PositiveInt | None = None
    extra: dict[str, JsonScalar] = {}

    @model_validator(mode="before")
    @classmethod
    def _reject_target_parallelism(cls, data: object) -> object:
        if isinstance(data, dict) and "tensor_parallel_size" in data:
            raise ValueError(
                "tensor_parallel_size is not a speculative field (vLLM rejects it); the "
                "draft's parallelism is draft_tensor_parallel_size, 1 or the engine's "
                "tensor_parallel_size"
            )
        return data

    @model_validator(mode="after")
    def _check_method_fields(self) -> Self:
        required, optional = SPECULATIVE_FIELDS[self.method]
        given = {name for name in OPTIONAL_SPECULATIVE_FIELDS if getattr(self, name) is not None}
        for name in sorted(required - given):
            raise ValueError(f"method '{self.method}' needs {name}")
        for name in sorted(given - required - optional):
            raise ValueError(f"{name} does not apply to method '{self.method}'")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and low > high:
            raise ValueError(f"prompt_lookup_min {low} is above prompt_lookup_max {high}")
        clashes = sorted(RESERVED_SPECULATIVE_KEYS.intersection(self.extra))
        if clashes or "tensor_parallel_size" in self.extra:
            named = ", ".join(clashes) or "tensor_parallel_size"
            raise ValueError(f"extra repeats {named}; set it as a field of its own")
        return self


class EngineSpec(Section):
    """One `vllm serve` process: the model, where it listens, how it uses the GPUs, what
    it costs, and how the supervisor treats it.

    Flags left unset are not passed, so vLLM's defaults apply. Queue limits: the running
    batch is bounded by `max_num_seqs` and `max_num_batched_tokens`; vLLM 0.33's
    `max_num_queued_reqs` (requests in flight, waiting or running) and
    `max_num_queued_tokens` (prompt tokens waiting for prefill) bound the queue, and past
    them vLLM answers new requests with HTTP 503 while `/health` stays 200.
    """

    # `vllm`: a `vllm serve` process; `cpu`: the embedded CPU engine (`engine serve-cpu`),
    # for machines without a GPU (its `model` defaults to the shipped tiny pair).
    kind: EngineKindType = "vllm"
    model: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)]
    api_key: Secret = None  # as ${ENV}; given to vLLM as VLLM_API_KEY, not argv
    executable: str = "vllm"

    tensor_parallel_size: PositiveInt = 1
    pipeline_parallel_size: PositiveInt = 1
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    max_model_len: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    max_num_queued_reqs: Count | None = None
    max_num_queued_tokens: Count | None = None
    dtype: DtypeType | None = None
    quantization: str | None = Field(None, examples=["awq", "gptq", "fp8"])
    kv_cache_dtype: str | None = Field(None, examples=["auto", "fp8", "fp8_e4m3"])
    enable_prefix_caching: bool | None = None
    scheduling_policy: SchedulingPolicyType | None = None
    speculative: Speculation | None = None
    extra_args: list[str] = []
    env: dict[str, str] = {}
    threads: PositiveInt | None = None  # cpu: torch intra-op threads
    # Started (and stopped) with the gateway by `cascade-gateway serve`.
    autostart: bool = False

    # Pricing: USD per GPU-hour for the whole engine, and the tokens/s assumed until the
    # throughput measured from /metrics replaces it.
    gpu_hour_usd: GpuHourUsd | None = None
    tokens_per_second: TokensPerSecond | None = None

    # Supervision.
    startup_timeout_s: Seconds = 900.0
    stop_timeout_s: Seconds = 30.0
    health_interval_s: Interval = 2.0
    unhealthy_after: PositiveInt = 3  # consecutive failed /health probes before a restart
    restart_backoff_s: Seconds = 5.0
    restart_backoff_max_s: Seconds = 300.0
    max_restarts: Count | None = None  # None: keep restarting
    log_dir: str | None = None  # default: the run directory (var/engines)

    @model_validator(mode="after")
    def _check_kind(self) -> Self:
        if self.kind == "vllm":
            if self.model is None:
                raise ValueError("a vLLM engine needs model (a Hugging Face id or a directory)")
            if self.threads is not None:
                raise ValueError("threads applies to kind 'cpu' engines only")
            return self
        foreign = sorted(name for name in self.model_fields_set if name not in CPU_FIELDS)
        if foreign:
            raise ValueError(
                f"{', '.join(foreign)} do not apply to kind 'cpu' (the embedded engine takes "
                f"{', '.join(sorted(CPU_FIELDS - {'kind'}))})"
            )
        if self.speculative is not None and self.speculative.method != "draft_model":
            raise ValueError(
                f"the cpu engine speculates with a draft model only, not "
                f"'{self.speculative.method}'"
            )
        return self

    @model_validator(mode="after")
    def _check_engine(self) -> Self:
        draft_tp = self.speculative.draft_tensor_parallel_size if self.speculative else None
        if draft_tp is not None and draft_tp not in (1, self.tensor_parallel_size):
            raise ValueError(
                f"speculative.draft_tensor_parallel_size is {draft_tp}; vLLM takes 1 or the "
                f"engine's tensor_parallel_size ({self.tensor_parallel_size})"
            )
        for arg in self.extra_args:
            if arg.split("=", 1)[0] in RESERVED_FLAGS:
                raise ValueError(
                    f"extra_args has {arg.split('=', 1)[0]}, which a field of the engine sets; "
                    "use the field"
                )
        if self.restart_backoff_max_s < self.restart_backoff_s:
            raise ValueError(
                f"restart_backoff_max_s {self.restart_backoff_max_s} is below "
                f"restart_backoff_s {self.restart_backoff_s}"
            )
        return self

    @property
    def served_name(self) -> str:
        """The model name clients send: `served_model_name`, else `model` (the shipped
        pair's name for a cpu engine without one)."""
        if self.served_model_name:
            return self.served_model_name
        if self.model is None:
            return CPU_DEFAULT_SERVED_NAME
        return self.model if self.kind == "vllm" else Path(self.model).name

    @property
    def api_base(self) -> str:
        """The OpenAI-compatible base URL, `http://host:port/v1` (a wildcard listen address
        is reached on loopback)."""
        host = WILDCARD_HOSTS.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/v1"
