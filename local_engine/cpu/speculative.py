"""Speculative sampling's accept/reject rule (Leviathan et al. 2023, Chen et al. 2023).

The draft proposed tokens d_1..d_K from its distributions q_1..q_K; the target scored the
same prefix, giving p_1..p_{K+1}. Token d_i is accepted with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection the replacement is drawn from
norm(max(0, p_i - q_i)) and the rest is dropped; if all K are accepted, a bonus token is
drawn from p_{K+1}. Every emitted token is then distributed exactly as the target's
own sampling would have produced it; with one-hot (greedy) distributions this reduces to
"keep the draft while it equals the target's argmax, then take the target's argmax".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from local_engine.cpu.sampling import draw


@dataclass(frozen=True)
class Verdict:
    """The tokens one speculative step emits: the accepted drafts, then one more."""

    tokens: list[int]
    accepted: int


def verify(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Apply the rule to one sequence: q is `draft_probs` [K, V], p is `target_probs` [K+1, V]."""
    k = len(draft_tokens)
    index = torch.tensor(list(draft_tokens), dtype=torch.long)
    rows = torch.arange(k)
    p = target_probs[rows, index].tolist()
    q = draft_probs[rows, index].tolist()
    uniforms = torch.rand(k, generator=generator).tolist() if k else []
    for i in range(k):
        # u < p/q, written without the division: q > 0 since d_i was drawn from q_i.
        if uniforms[i] * q[i] >= p[i]:
            residual = (target_probs[i] - draft_probs[i]).clamp(min=0.0)
            if float(residual.sum()) <= 0.0:  # p == q: unreachable in exact arithmetic
                residual = target_probs[i]
            token = _draw_or_argmax(residual / residual.sum(), generator)
            return Verdict(tokens=[*draft_tokens[:i], token], accepted=i)
    return Verdict(tokens=[*draft_tokens, _draw_or_argmax(target_probs[k], generator)], accepted=k)


def _draw_or_argmax(probs: torch.Tensor, generator: torch.Generator) -> int:
    top, token = probs.max(dim=0)
    return int(token) if float(top) >= 1.0 else draw(probs, generator)
