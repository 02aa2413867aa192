"""Tiny Llama models with random weights, for the CPU engine's tests: an HF-style config
(HF_CONFIG) and models of it, and a target and a draft model over the byte tokenizer's
vocabulary. Used by test_cpu_model, test_cpu_engine, test_cpu_server,
test_cpu_embeddings and tests/gateway/test_default_policy_e2e."""

from __future__ import annotations

import torch

from local_engine.cpu.app import EngineService
from local_engine.cpu.config import LlamaConfig
from local_engine.cpu.engine import Engine, EngineOptions
from local_engine.cpu.metrics import EngineMetrics
from local_engine.cpu.model import LlamaForCausalLM
from local_engine.cpu.runner import EngineRunner
from local_engine.cpu.tokenizer import Tokenizer

HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def tiny_config(**overrides: object) -> LlamaConfig:
    """HF_CONFIG's model, with `overrides`."""
    return LlamaConfig.from_dict(HF_CONFIG | overrides)


def random_model(config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    """A model of `config` with random weights (the same for the same seed), in eval mode."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    return model.eval()


TOKENIZER = Tokenizer(merges=[])  # bytes + 5 special tokens: 261 ids
VOCAB = TOKENIZER.vocab_size


def target() -> LlamaForCausalLM:
    """A tiny model over TOKENIZER's vocabulary."""
    return random_model(tiny_config(vocab_size=VOCAB, max_position_embeddings=128), seed=0)


def draft(seed: int = 1) -> LlamaForCausalLM:
    """A smaller model over the same vocabulary, to draft for `target()`."""
    config = tiny_config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    return random_model(config, seed=seed)


def speculative_service(model_name: str) -> EngineService:
    """The CPU engine's service over the tiny target with a draft (3 speculative tokens),
    serving `model_name`: what test_cpu_server and test_cpu_metrics serve."""
    options = EngineOptions(max_num_seqs=4, max_model_len=128, num_speculative_tokens=3)
    metrics = EngineMetrics(model_name)
    engine = Engine(target(), TOKENIZER, draft=draft(), options=options, metrics=metrics)
    return EngineService(EngineRunner(engine), TOKENIZER, metrics, model_name)
