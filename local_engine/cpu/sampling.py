"""Sampling parameters, the distributions they define, and draws from them.

A request's parameters turn logits into the distribution its tokens are drawn from
(temperature 0 is the one-hot argmax, so greedy decoding is sampling too, and the
speculative rule needs no special case for it). Draws use each request's own
`torch.Generator`, so a `seed` reproduces a request whatever else is in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler; `max_tokens` None means up to the context limit."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def distributions(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Row i of `logits` [N, V] as the distribution `params[i]` samples from (float32)."""
    logits = logits.float()
    greedy = torch.tensor([p.greedy for p in params])
    temperature = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params])
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    top_p = torch.tensor([p.top_p for p in params])
    if bool((top_p < 1.0).any()):
        probs = _nucleus(probs, top_p)
    if bool(greedy.any()):
        onehot = torch.zeros_like(probs)
        onehot.scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], onehot, probs)
    return probs


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; renormalise."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p[:, None]
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from the distribution `probs` [V], by inverse CDF with one uniform draw."""
    cdf = probs.cumsum(dim=0)
    u = torch.rand((), generator=generator) * cdf[-1]
    index = int(torch.searchsorted(cdf, u[None], right=True))
    # Rounding can put u at the very top of the CDF: fall back to the last possible token.
    return min(index, int(probs.nonzero()[-1]))


def sample(probs: torch.Tensor, generators: Sequence[torch.Generator]) -> list[int]:
    """One token per row of `probs` [N, V]; one-hot rows (greedy) take no random draw."""
    tokens: list[int] = []
    argmax = probs.argmax(dim=-1).tolist()
    top = probs.max(dim=-1).values.tolist()
    for row, generator in enumerate(generators):
        tokens.append(argmax[row] if top[row] >= 1.0 else draw(probs[row], generator))
    return tokens
