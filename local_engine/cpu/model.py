"""The Llama decoder in torch, with Hugging Face's parameter names.

`LlamaForCausalLM(config)` holds `model.embed_tokens`, `model.layers.N.self_attn.{q,k,v,o}_proj`,
`model.layers.N.mlp.{gate,up,down}_proj`, `model.layers.N.{input,post_attention}_layernorm`,
`model.norm` and `lm_head`, so an HF state dict loads as it is. RoPE follows HF's
rotate-half convention (the one HF's q/k weights are permuted for); grouped-query
attention shares each key/value head among `num_attention_heads / num_key_value_heads`
query heads.

Without a cache, `forward(tokens)` is the plain causal pass (training, reference); with
one, `forward(tokens, cache=..., layout=...)` is a ragged step of a running batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from local_engine.cpu.config import LlamaConfig
from local_engine.cpu.kv_cache import KVCache, StepLayout


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (x * scale)


class Rotary(nn.Module):
    """cos/sin tables for every position, gathered per token."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        angles = torch.outer(
            torch.arange(config.max_position_embeddings, dtype=torch.float32), inv_freq
        )
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [B, T, H, D] by its tokens' positions [B, T]."""
        cos = self.cos[positions][:, :, None, :]
        sin = self.sin[positions][:, :, None, :]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        size, kv_size = config.hidden_size, config.num_key_value_heads * config.head_dim
        self.q_proj = nn.Linear(size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(size, kv_size, bias=False)
        self.v_proj = nn.Linear(size, kv_size, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: Rotary,
        cache: KVCache | None,
        layout: StepLayout | None,
    ) -> torch.Tensor:
        batch, time, _ = x.shape
        q = rotary(self.q_proj(x).view(batch, time, self.heads, self.head_dim), positions)
        k = rotary(self.k_proj(x).view(batch, time, self.kv_heads, self.head_dim), positions)
        v = self.v_proj(x).view(batch, time, self.kv_heads, self.head_dim)
        if cache is None or layout is None:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                is_causal=True,
                enable_gqa=True,
            )
        else:
            keys, values = cache.update(self.layer, layout, k, v)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys, values, attn_mask=layout.mask, enable_gqa=True
            )
        merged: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(batch, time, -1))
        return merged


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: Rotary,
        cache: KVCache | None,
        layout: StepLayout | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, rotary, cache, layout)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class LlamaBackbone(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = Rotary(config)


class LlamaForCausalLM(nn.Module):
    """A Llama decoder with its LM head.

    model(tokens)                          # [B, T] -> logits [B, T, V], causal, no cache
    model(tokens, cache=c, layout=l)       # a ragged step over cached sequences
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        layout: StepLayout | None = None,
        last_only: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits for every position, or, given `last_only` [B] time indices, one row each."""
        if layout is None:
            positions = torch.arange(tokens.shape[1], dtype=torch.long).expand_as(tokens)
        else:
            positions = layout.positions
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, positions, self.model.rotary, cache, layout)
        if last_only is not None:
            x = x[torch.arange(x.shape[0]), last_only][:, None, :]
        logits: torch.Tensor = self.lm_head(self.model.norm(x))
        return logits
