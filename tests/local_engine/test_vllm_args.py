"""Our `vllm serve` argv, read by vLLM's own argument parser and engine-config checks.

Not part of the default run: it needs vLLM itself (the `[vllm]` extra), which CI does not
install. On a machine without a GPU, a CPU build is enough:

    pip install -e '.[vllm]'          # vLLM 0.33 (on a machine without a GPU, a CPU build)
    pytest -m vllm tests/local_engine/test_vllm_args.py

The model is a tiny Llama `config.json` written here (configs are built, no weights are
loaded), so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from local_engine.vllm_command import vllm_argv
from policies.engines import EngineSpec

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="needs vLLM: pip install -e '.[vllm]'")

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
}


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if not _has_accelerator():
        monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")  # a CUDA wheel on a CPU host
    path = tmp_path / "tiny-llama"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(TINY_LLAMA))
    return path


def _has_accelerator() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def parse(argv: list[str]) -> argparse.Namespace:
    """What `vllm serve` does with our argv before building the engine."""
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser  # vLLM 0.33
    except ImportError:  # older layout
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser

    assert argv[1] == "serve"
    args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(argv[2:])
    args.model = args.model_tag  # as vllm's serve subcommand does
    return args


def engine_config(argv: list[str]) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(parse(argv)).create_engine_config()


def spec(model_dir: Path, **fields: Any) -> EngineSpec:
    return EngineSpec.model_validate({"model": str(model_dir), "port": 8100, **fields})


def test_every_flag_is_known_to_vllm(model_dir: Path) -> None:
    full = spec(
        model_dir,
        served_model_name="small",
        dtype="float32",
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        gpu_memory_utilization=0.8,
        max_model_len=1024,
        max_num_seqs=32,
        max_num_batched_tokens=2048,
        max_num_queued_reqs=128,
        max_num_queued_tokens=65536,
        quantization="fp8",
        kv_cache_dtype="fp8",
        enable_prefix_caching=False,
        scheduling_policy="priority",
        speculative={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
    )

    args = parse(vllm_argv(full))

    assert (args.model, args.host, args.port) == (str(model_dir), "127.0.0.1", 8100)
    assert args.served_model_name == ["small"]
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (2, 2)
    assert (args.max_model_len, args.max_num_seqs, args.max_num_batched_tokens) == (
        1024,
        32,
        2048,
    )
    assert (args.max_num_queued_reqs, args.max_num_queued_tokens) == (128, 65536)
    assert (args.quantization, args.kv_cache_dtype, args.dtype) == ("fp8", "fp8", "float32")
    assert args.enable_prefix_caching is False
    assert args.scheduling_policy == "priority"
    assert args.gpu_memory_utilization == 0.8
    speculative = args.speculative_config
    assert speculative["method"] == "ngram" and speculative["prompt_lookup_max"] == 4


def test_minimal_spec_builds_an_engine_config(model_dir: Path) -> None:
    config = engine_config(vllm_argv(spec(model_dir, max_model_len=512, max_num_seqs=8)))

    assert config.model_config.max_model_len == 512
    assert config.scheduler_config.max_num_seqs == 8


def test_ngram_speculation_builds(model_dir: Path) -> None:
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
             "prompt_lookup_max": 4}  # fmt: skip
    config = engine_config(vllm_argv(spec(model_dir, max_model_len=512, speculative=ngram)))

    speculative = config.speculative_config
    assert (speculative.method, speculative.num_speculative_tokens) == ("ngram", 3)
    assert (speculative.prompt_lookup_min, speculative.prompt_lookup_max) == (2, 4)


def test_draft_model_speculation_builds(model_dir: Path) -> None:
    draft = {"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": 2,
             "draft_tensor_parallel_size": 1}  # fmt: skip
    config = engine_config(vllm_argv(spec(model_dir, max_model_len=512, speculative=draft)))

    speculative = config.speculative_config
    assert (speculative.method, speculative.draft_tensor_parallel_size) == ("draft_model", 1)


@pytest.mark.parametrize(
    ("speculative", "message"),
    [
        (
            {"method": "ngram", "num_speculative_tokens": 3, "tensor_parallel_size": 1},
            "'tensor_parallel_size' is not a valid argument",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
             "prompt_lookup_max": 2},
            "prompt_lookup_min=5 must be <= prompt_lookup_max=2",
        ),
        (
            {"method": "draft_model", "num_speculative_tokens": 3},
            "without speculative model",
        ),
        ({"method": "ngram"}, "num_speculative_tokens must be provided"),
    ],
)  # fmt: skip
def test_what_the_policy_rejects_vllm_rejects_too(
    model_dir: Path, speculative: Any, message: str
) -> None:
    argv = vllm_argv(spec(model_dir, max_model_len=512))
    argv += ["--speculative-config", json.dumps(speculative)]

    with pytest.raises(Exception, match=re.escape(message)):  # ValueError or pydantic's
        engine_config(argv)
