"""The Llama forward pass, the safetensors loader and the KV cache.

The reference forward here is written independently of local_engine.cpu.model (explicit
per-head attention, HF's rotate_half, repeated KV heads), so agreeing with it checks the
loader's name mapping and the model's maths together.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from local_engine.cpu.checkpoint import load_model, save_model
from local_engine.cpu.errors import CheckpointError
from local_engine.cpu.kv_cache import KVCache
from tests.local_engine.tiny_models import HF_CONFIG, random_model, tiny_config


def hf_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under HF's names and shapes, built without our model class."""
    gen = torch.Generator().manual_seed(seed)
    c = HF_CONFIG
    d, kv = int(c["hidden_size"]), int(c["num_key_value_heads"]) * 16  # type: ignore[call-overload]
    ff, vocab = int(c["intermediate_size"]), int(c["vocab_size"])  # type: ignore[call-overload]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.2

    state = {"model.embed_tokens.weight": rand(vocab, d), "model.norm.weight": 1 + rand(d)}
    state["lm_head.weight"] = rand(vocab, d)
    for i in range(int(c["num_hidden_layers"])):  # type: ignore[call-overload]
        p = f"model.layers.{i}."
        state |= {
            p + "self_attn.q_proj.weight": rand(d, d),
            p + "self_attn.k_proj.weight": rand(kv, d),
            p + "self_attn.v_proj.weight": rand(kv, d),
            p + "self_attn.o_proj.weight": rand(d, d),
            p + "mlp.gate_proj.weight": rand(ff, d),
            p + "mlp.up_proj.weight": rand(ff, d),
            p + "mlp.down_proj.weight": rand(d, ff),
            p + "input_layernorm.weight": 1 + rand(d),
            p + "post_attention_layernorm.weight": 1 + rand(d),
        }
    return state


def reference_logits(state: dict[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """A plain, loop-per-head Llama forward (HF semantics) for one sequence."""
    c = HF_CONFIG
    heads, kv_heads = int(c["num_attention_heads"]), int(c["num_key_value_heads"])  # type: ignore[call-overload]
    dim = int(c["hidden_size"]) // heads  # type: ignore[call-overload]
    eps, theta = float(c["rms_norm_eps"]), float(c["rope_theta"])  # type: ignore[arg-type]
    n = len(tokens)

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    inv = 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)
    ang = torch.outer(torch.arange(n).float(), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(x: torch.Tensor) -> torch.Tensor:  # [n, dim]
        rotated = torch.cat([-x[:, dim // 2 :], x[:, : dim // 2]], -1)
        return x * cos + rotated * sin

    x = state["model.embed_tokens.weight"][tokens]
    for i in range(int(c["num_hidden_layers"])):  # type: ignore[call-overload]
        p = f"model.layers.{i}."
        h = norm(x, state[p + "input_layernorm.weight"])
        q = h @ state[p + "self_attn.q_proj.weight"].T
        k = h @ state[p + "self_attn.k_proj.weight"].T
        v = h @ state[p + "self_attn.v_proj.weight"].T
        outs = []
        for head in range(heads):
            g = head // (heads // kv_heads)
            qh = rope(q[:, head * dim : (head + 1) * dim])
            kh = rope(k[:, g * dim : (g + 1) * dim])
            scores = qh @ kh.T / math.sqrt(dim)
            scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), -1e9)
            outs.append(torch.softmax(scores, -1) @ v[:, g * dim : (g + 1) * dim])
        x = x + torch.cat(outs, -1) @ state[p + "self_attn.o_proj.weight"].T
        h = norm(x, state[p + "post_attention_layernorm.weight"])
        gate = h @ state[p + "mlp.gate_proj.weight"].T
        up = h @ state[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ state[p + "mlp.down_proj.weight"].T
    return norm(x, state["model.norm.weight"]) @ state["lm_head.weight"].T


def write_checkpoint(
    directory: Path, state: dict[str, torch.Tensor], config: dict[str, object]
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(state, str(directory / "model.safetensors"))


def test_loaded_checkpoint_matches_reference_forward(tmp_path: Path) -> None:
    state = hf_state_dict()
    write_checkpoint(tmp_path, state, HF_CONFIG)
    model = load_model(tmp_path)
    tokens = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
    with torch.inference_mode():
        logits = model(torch.tensor([tokens]))[0]
    torch.testing.assert_close(logits, reference_logits(state, tokens), atol=1e-4, rtol=1e-4)


def test_save_and_load_round_trip_in_bfloat16(tmp_path: Path) -> None:
    model = random_model(tiny_config(tie_word_embeddings=True))
    save_model(model, tmp_path, dtype=torch.bfloat16)
    loaded = load_model(tmp_path)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.to(torch.bfloat16).float()), name


def test_missing_weight_is_named(tmp_path: Path) -> None:
    state = hf_state_dict()
    del state["model.layers.1.mlp.up_proj.weight"]
    write_checkpoint(tmp_path, state, HF_CONFIG)
    with pytest.raises(CheckpointError, match=re.escape("model.layers.1.mlp.up_proj.weight")):
        load_model(tmp_path)


def test_unsupported_config_is_named(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, hf_state_dict(), HF_CONFIG | {"hidden_act": "gelu"})
    with pytest.raises(CheckpointError, match="hidden_act 'gelu'"):
        load_model(tmp_path)


def test_kv_cache_decode_equals_full_forward() -> None:
    model = random_model(tiny_config())
    tokens = torch.randint(0, 97, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    cache = KVCache(model.config, num_slots=3, max_len=32)
    rows = []
    with torch.inference_mode():
        full = model(torch.tensor([tokens]))[0]
        # A 6-token chunk into slot 2, then one token per step.
        layout = cache.layout([2], [0], [6])
        rows.append(model(torch.tensor([tokens[:6]]), cache=cache, layout=layout)[0])
        for pos in range(6, len(tokens)):
            layout = cache.layout([2], [pos], [1])
            rows.append(model(torch.tensor([[tokens[pos]]]), cache=cache, layout=layout)[0])
    torch.testing.assert_close(torch.cat(rows), full, atol=1e-5, rtol=1e-5)


def test_ragged_batch_step_equals_separate_sequences() -> None:
    model = random_model(tiny_config())
    a, b = [5, 6, 7, 8, 9, 10, 11], [40, 41, 42]
    cache = KVCache(model.config, num_slots=2, max_len=32)
    with torch.inference_mode():
        padded = torch.tensor([a, b + [0] * (len(a) - len(b))])
        layout = cache.layout([1, 0], [0, 0], [len(a), len(b)])
        logits = model(padded, cache=cache, layout=layout)
        torch.testing.assert_close(logits[0], model(torch.tensor([a]))[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            logits[1, : len(b)], model(torch.tensor([b]))[0], atol=1e-5, rtol=1e-5
        )
        # Next step: a decodes one token, b feeds two; each sees only its own slot.
        layout = cache.layout([1, 0], [len(a), len(b)], [1, 2])
        step = model(torch.tensor([[12, 0], [43, 44]]), cache=cache, layout=layout)
        full_a, full_b = model(torch.tensor([[*a, 12]]))[0], model(torch.tensor([[*b, 43, 44]]))[0]
    torch.testing.assert_close(step[0, 0], full_a[-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step[1], full_b[-2:], atol=1e-5, rtol=1e-5)
