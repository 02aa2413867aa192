"""One request's state in the engine: its tokens, cache lengths, text and finish.

Invariant while decoding: the target's cache holds every token but the last
(`cache_len == len(tokens) - 1`); the last token is fed on the next step. The draft's
cache may lag further behind (`draft_len`) and catches up on its next step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

from local_engine.cpu.sampling import SamplingParams
from local_engine.cpu.tokenizer import Detokenizer

FinishReasonType = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class Request:
    """What a client asked for, tokenised."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class Output:
    """New text for a request; the last one carries `finish_reason`."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReasonType | None = None


Sink = Callable[[Output], None]


class TextStream:
    """Text out, held back while it could still be the start of a stop string."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self.buffer = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """The text now safe to emit, and whether a stop string ended the output."""
        self.buffer += piece
        hits = [i for i in (self.buffer.find(stop) for stop in self.stops) if i >= 0]
        if hits:
            text, self.buffer = self.buffer[: min(hits)], ""
            return text, True
        hold = max(
            (
                n
                for stop in self.stops
                for n in range(1, len(stop))
                if self.buffer.endswith(stop[:n])
            ),
            default=0,
        )
        text = self.buffer[: len(self.buffer) - hold]
        self.buffer = self.buffer[len(text) :]
        return text, False

    def flush(self) -> str:
        text, self.buffer = self.buffer, ""
        return text


@dataclass(eq=False)
class Sequence:
    request: Request
    sink: Sink
    detokenizer: Detokenizer
    max_tokens: int
    generator: torch.Generator
    arrival: float = field(default_factory=time.perf_counter)
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens in the target's cache
    draft_len: int = 0  # tokens in the draft's cache
    generated: int = 0
    finish_reason: FinishReasonType | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    stream: TextStream = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = list(self.request.prompt_ids)
        self.stream = TextStream(self.request.params.stop)

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.prompt_len

    @property
    def cache_len(self) -> int:
        return len(self.tokens) - 1
