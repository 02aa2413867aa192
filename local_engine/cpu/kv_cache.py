"""A slot-based KV cache for a running batch of sequences of different lengths.

Each running sequence owns one slot: `max_len` positions per layer. A forward step writes
the new tokens' keys and values at their positions and attends over positions
`0..position` of its own slot. Rolling a sequence back (rejected draft tokens) is only a
matter of the caller's length counter: stale positions are overwritten before they are
read again, and the mask never reaches past a query's own position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from local_engine.cpu.config import LlamaConfig


@dataclass(frozen=True)
class StepLayout:
    """Where a ragged step's tokens sit: batch row b feeds `counts[b]` tokens from `starts[b]`.

    Token tensors of the step are padded to [B, T]; padded entries are neither written to
    the cache nor meaningful in the output.
    """

    slots: torch.Tensor  # [B] slot of each row
    positions: torch.Tensor  # [B, T] absolute position of each (padded) token
    write_rows: torch.Tensor  # [N] batch row of each real token
    write_times: torch.Tensor  # [N] index in T of each real token
    write_slots: torch.Tensor  # [N]
    write_positions: torch.Tensor  # [N]
    mask: torch.Tensor  # [B, 1, T, L] True where the query may attend to the key
    key_len: int  # L: positions read from each slot


class KVCache:
    """Keys and values of `num_slots` sequences, `max_len` positions each, for every layer.

    cache = KVCache(config, num_slots=8, max_len=512)
    layout = cache.layout(slots=[0, 3], starts=[17, 0], counts=[1, 12])
    """

    def __init__(
        self, config: LlamaConfig, num_slots: int, max_len: int, dtype: torch.dtype = torch.float32
    ) -> None:
        shape = (num_slots, config.num_key_value_heads, max_len, config.head_dim)
        # Zeros, not empty: masked scores must stay finite (NaN * 0 is NaN).
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.num_slots = num_slots
        self.max_len = max_len

    def layout(
        self, slots: Sequence[int], starts: Sequence[int], counts: Sequence[int]
    ) -> StepLayout:
        width = max(counts)
        start = torch.tensor(starts, dtype=torch.long)
        count = torch.tensor(counts, dtype=torch.long)
        times = torch.arange(width, dtype=torch.long)
        # Padding repeats the row's last real position, so it never runs past the table.
        positions = start[:, None] + torch.minimum(times[None, :], count[:, None] - 1)
        real = times[None, :] < count[:, None]
        rows, cols = real.nonzero(as_tuple=True)
        key_len = int((start + count).max())
        keys = torch.arange(key_len, dtype=torch.long)
        mask = keys[None, None, :] <= positions[:, :, None]
        slot = torch.tensor(slots, dtype=torch.long)
        return StepLayout(
            slots=slot,
            positions=positions,
            write_rows=rows,
            write_times=cols,
            write_slots=slot[rows],
            write_positions=positions[rows, cols],
            mask=mask[:, None, :, :],
            key_len=key_len,
        )

    def update(
        self, layer: int, layout: StepLayout, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's [B, T, Hkv, D] keys/values; return [B, Hkv, L, D] to attend over."""
        keys, values = self.keys[layer], self.values[layer]
        rows, times = layout.write_rows, layout.write_times
        keys[layout.write_slots, :, layout.write_positions] = key[rows, times]
        values[layout.write_slots, :, layout.write_positions] = value[rows, times]
        span = slice(0, layout.key_len)
        return keys[layout.slots, :, span], values[layout.slots, :, span]
