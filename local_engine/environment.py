"""The environment an engine process starts with: what it inherits from the supervisor,
filtered through an allow-list, then the spec's `env`, then the API key.

    engine_env(spec, os.environ)  # {'PATH': ..., 'HF_HOME': ..., 'VLLM_API_KEY': ...}

The supervisor runs with the gateway's environment, secrets included (provider API keys,
the admin key, a Redis URL with its password); it needs them to fill the policy's
`${VAR}`s. An engine needs none of them, and it may run code the gateway does not vouch
for (with `--trust-remote-code`, a model repository's own), so it is handed only what
a Python program on a GPU uses: the names below, and any name starting with one of
the prefixes. Anything else an engine needs goes in its spec's `env`, which wins
(`env: {HTTPS_PROXY: "${HTTPS_PROXY}"}`).
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.engines import EngineSpec

API_KEY_ENV = "VLLM_API_KEY"
# Inherited by name: the process basics, where programs, libraries and caches are, and
# the CA bundles a model download trusts.
INHERITED_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR",
        "VIRTUAL_ENV", "LD_LIBRARY_PATH", "XDG_CACHE_HOME",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    }
)  # fmt: skip
# Inherited by prefix: locale, the interpreter's settings (PYTHONPATH, PYTHONUNBUFFERED),
# GPUs, the model hub, the engine and its frameworks, and the math libraries' threads
# and CPU-type workarounds (OMP_NUM_THREADS, OPENBLAS_CORETYPE, NVPL_BLAS_DEBUG_CPU_TYPE).
INHERITED_PREFIXES = (
    "LC_", "PYTHON",
    "CUDA_", "NVIDIA_", "NCCL_",
    "HF_", "HUGGING_FACE_", "TRANSFORMERS_",
    "VLLM_", "TORCH_", "PYTORCH_", "TRITON_",
    "OMP_", "MKL_", "OPENBLAS_", "NVPL_",
)  # fmt: skip


def engine_env(spec: EngineSpec, base: Mapping[str, str]) -> dict[str, str]:
    """The engine's environment: the allowed part of `base` (the supervisor's), the spec's
    `env`, the API key.

    An inherited VLLM_API_KEY is dropped: the policy alone decides whether the engine
    asks for a key, so the deployments pointing at it agree. An empty key (`${VAR:-}`
    with VAR unset) is no key, as for the gateway, which then sends none."""
    env = {name: value for name, value in base.items() if inherited(name)}
    env.update(spec.env)
    env.pop(API_KEY_ENV, None)
    if spec.api_key:
        env[API_KEY_ENV] = spec.api_key
    return env


def inherited(name: str) -> bool:
    """Does an engine inherit the supervisor's variable `name`?"""
    return name in INHERITED_NAMES or name.startswith(INHERITED_PREFIXES)
