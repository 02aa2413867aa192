"""The command line that runs a `kind: cpu` engine spec: the embedded CPU engine.

    cpu_argv(spec)  # [python, -m, local_engine.cli, serve-cpu, --host, ..., --port, ...]

It runs under the same interpreter as the supervisor, so the engine sees the same
installed packages (torch comes with the `[engine]` extra).
"""

from __future__ import annotations

import importlib.util
import sys

from policies.engines import EngineSpec


def cpu_argv(spec: EngineSpec) -> list[str]:
    argv = [sys.executable, "-m", "local_engine.cli", "serve-cpu"]
    argv += ["--host", spec.host, "--port", str(spec.port)]
    argv += ["--served-model-name", spec.served_name]
    if spec.model is not None:
        argv += ["--model", spec.model]
    for flag, value in (
        ("--max-num-seqs", spec.max_num_seqs),
        ("--max-model-len", spec.max_model_len),
        ("--threads", spec.threads),
    ):
        if value is not None:
            argv += [flag, str(value)]
    speculation = spec.speculative
    if speculation is not None and speculation.model is not None:
        argv += ["--draft-model", speculation.model]
        argv += ["--num-speculative-tokens", str(speculation.num_speculative_tokens)]
    return argv


def cpu_engine_installed() -> bool:
    """Can this interpreter run the CPU engine (is torch installed)?"""
    return importlib.util.find_spec("torch") is not None
