"""The scheduler and the model steps: continuous batching with optional speculation.

Each `step()`:
1. takes new requests and aborts from the inbox (filled from any thread);
2. admits waiting requests into free cache slots (all at once under "continuous"; under
   "static" only when the running batch has emptied, which is the baseline);
3. prefills at most `max_prefill_tokens` prompt tokens, in chunks, so a long prompt
   delays the running sequences by one bounded chunk rather than its whole length;
4. decodes one token for every running sequence, or, with a draft model, drafts up to
   K tokens per sequence and verifies them in one target pass;
5. emits text, retires finished sequences and frees their slots.

Requests join and leave the running batch between steps. `run(stop_event)` loops
`step()` on a thread of its own; outputs reach callers through each request's sink.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Literal

import torch

from local_engine.cpu.errors import InvalidRequest
from local_engine.cpu.kv_cache import KVCache
from local_engine.cpu.metrics import EngineMetrics
from local_engine.cpu.model import LlamaForCausalLM
from local_engine.cpu.sampling import distributions, sample
from local_engine.cpu.sequence import Output, Request, Sequence, Sink
from local_engine.cpu.speculative import verify
from local_engine.cpu.tokenizer import Detokenizer, Tokenizer

log = logging.getLogger("local_engine")

SchedulingType = Literal["continuous", "static"]


@dataclass(frozen=True)
class EngineOptions:
    max_num_seqs: int = 8
    max_model_len: int = 512
    max_prefill_tokens: int = 256
    num_speculative_tokens: int = 4
    scheduling: SchedulingType = "continuous"


@dataclass
class SpecStats:
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0


class Engine:
    """Generates for many requests at once on one target (and optional draft) model.

    engine = Engine(target, tokenizer, draft=draft)
    engine.add(Request("r1", ids, SamplingParams(temperature=0)), sink)
    while engine.has_work(): engine.step()
    """

    def __init__(
        self,
        target: LlamaForCausalLM,
        tokenizer: Tokenizer,
        draft: LlamaForCausalLM | None = None,
        options: EngineOptions | None = None,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.options = options or EngineOptions()
        self.metrics = metrics
        slots, length = self.options.max_num_seqs, self.max_model_len
        self.cache = KVCache(target.config, slots, length)
        self.draft_cache = KVCache(draft.config, slots, length) if draft is not None else None
        self.free_slots = list(range(slots - 1, -1, -1))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.spec = SpecStats()
        self._inbox: deque[tuple[Request, Sink] | str] = deque()
        self._lock = threading.Lock()
        self._wakeup = threading.Event()

    @property
    def max_model_len(self) -> int:
        limits = [self.options.max_model_len, self.target.config.max_position_embeddings]
        if self.draft is not None:
            limits.append(self.draft.config.max_position_embeddings)
        return min(limits)

    def check(self, request: Request, param: str) -> None:
        """Raise InvalidRequest if the request cannot fit the context; `param` names the prompt."""
        length, limit = len(request.prompt_ids), self.max_model_len
        wanted = request.params.max_tokens
        if length >= limit:
            raise InvalidRequest(
                f"{param} is {length} tokens; this model's maximum context length is {limit} "
                "tokens (input and completion). Please reduce the length of the input.",
                param,
            )
        if wanted is not None and length + wanted > limit:
            raise InvalidRequest(
                f"max_tokens is {wanted}; with {length} tokens of input, this model's maximum "
                f"context length of {limit} tokens leaves room for at most {limit - length}.",
                "max_tokens",
            )

    def add(self, request: Request, sink: Sink) -> None:
        """Queue a request (any thread); outputs go to `sink` on the engine's thread.

        Raises InvalidRequest (param "prompt") if it cannot fit the context."""
        self.check(request, "prompt")
        with self._lock:
            self._inbox.append((request, sink))
        self._wakeup.set()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._inbox.append(request_id)
        self._wakeup.set()

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._inbox)

    def run(self, stop: threading.Event) -> None:
        """Step until `stop` is set, sleeping while there is nothing to do."""
        with torch.inference_mode():
            while not stop.is_set():
                if not self.has_work():
                    self._wakeup.wait(timeout=0.05)
                    self._wakeup.clear()
                    continue
                try:
                    self.step()
                except Exception:
                    # A failed step leaves caches and sequences in an unknown state: end
                    # every request (their streams close with "abort") and keep serving.
                    log.exception("engine step failed; aborting %d requests", len(self.running))
                    self._abort_all()

    def _abort_all(self) -> None:
        self._take_inbox()
        for seq in [*self.running, *self.waiting]:
            seq.finish_reason = "abort"
        self.running.extend(self.waiting)
        self.waiting.clear()
        self._retire()

    def step(self) -> None:
        with torch.inference_mode():
            self._take_inbox()
            self._admit()
            prefilling = [s for s in self.running if s.prefilling]
            if prefilling:
                self._prefill(prefilling)
            decoding = [s for s in self.running if not s.prefilling and s.finish_reason is None]
            if decoding and self.draft is not None and self.options.num_speculative_tokens > 0:
                self._speculate(decoding)
            elif decoding:
                self._decode(decoding)
            self._retire()
            self._report()

    def _take_inbox(self) -> None:
        with self._lock:
            items, self._inbox = list(self._inbox), deque()
        aborted = {item for item in items if isinstance(item, str)}
        for item in items:
            if isinstance(item, tuple):
                self.waiting.append(self._sequence(*item))
        for seq in [*self.running, *self.waiting]:
            if seq.request.request_id in aborted and seq.finish_reason is None:
                seq.finish_reason = "abort"
        self.waiting = deque(s for s in self.waiting if s.finish_reason is None)

    def _sequence(self, request: Request, sink: Sink) -> Sequence:
        seed = request.params.seed
        generator = torch.Generator()
        generator.manual_seed(seed if seed is not None else int(torch.seed()))
        room = self.max_model_len - len(request.prompt_ids)
        wanted = request.params.max_tokens
        return Sequence(
            request=request,
            sink=sink,
            detokenizer=Detokenizer(self.tokenizer),
            max_tokens=room if wanted is None else min(wanted, room),
            generator=generator,
        )

    def _admit(self) -> None:
        if self.options.scheduling == "static" and self.running:
            return
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot = self.free_slots.pop()
            self.running.append(seq)

    def _prefill(self, seqs: list[Sequence]) -> None:
        budget = self.options.max_prefill_tokens
        chunks: list[tuple[Sequence, int]] = []
        for seq in seqs:
            if budget <= 0:
                break
            size = min(seq.prompt_len - seq.prefilled, budget)
            chunks.append((seq, size))
            budget -= size
        starts = [seq.prefilled for seq, _ in chunks]
        ids = [seq.tokens[seq.prefilled : seq.prefilled + size] for seq, size in chunks]
        logits = self._forward(self.target, self.cache, [s for s, _ in chunks], starts, ids)
        if self.draft is not None and self.draft_cache is not None:
            self._forward(self.draft, self.draft_cache, [s for s, _ in chunks], starts, ids)
        done: list[tuple[Sequence, int]] = []
        for row, (seq, size) in enumerate(chunks):
            seq.prefilled += size
            seq.draft_len = seq.prefilled if self.draft is not None else 0
            if not seq.prefilling:
                done.append((seq, row))
                if self.metrics is not None:
                    self.metrics.prompt_tokens.inc(seq.prompt_len)
        if done:
            last = logits[torch.tensor([row for _, row in done]), -1]
            probs = distributions(last, [seq.params for seq, _ in done])
            tokens = sample(probs, [seq.generator for seq, _ in done])
            for (seq, _), token in zip(done, tokens, strict=True):
                self._emit(seq, [token])

    def _decode(self, seqs: list[Sequence]) -> None:
        ids = [[seq.tokens[-1]] for seq in seqs]
        starts = [seq.cache_len for seq in seqs]
        logits = self._forward(self.target, self.cache, seqs, starts, ids)
        probs = distributions(logits[:, 0], [seq.params for seq in seqs])
        for seq, token in zip(seqs, sample(probs, [s.generator for s in seqs]), strict=True):
            self._emit(seq, [token])

    def _speculate(self, seqs: list[Sequence]) -> None:
        """Draft up to K tokens per sequence, score them all in one target pass, keep the
        prefix the accept/reject rule keeps plus one target token."""
        # Never draft past what the request may still emit or the cache can hold.
        k_max = self.options.num_speculative_tokens
        ks = [max(0, min(k_max, *(room - 1 for room in self._room(s)))) for s in seqs]
        drafts, draft_probs = self._draft(seqs, ks)
        ids = [[s.tokens[-1], *drafts[i]] for i, s in enumerate(seqs)]
        starts = [s.cache_len for s in seqs]
        logits = self._forward(self.target, self.cache, seqs, starts, ids, all_positions=True)
        for i, seq in enumerate(seqs):
            k = ks[i]
            target = distributions(logits[i, : k + 1], [seq.params] * (k + 1))
            if k == 0:
                self._emit(seq, sample(target, [seq.generator]))
                continue
            verdict = verify(drafts[i], torch.stack(draft_probs[i]), target, seq.generator)
            # The draft cached the drafts it was fed (all but the last): keep the accepted.
            seq.draft_len = len(seq.tokens) + min(verdict.accepted, k - 1)
            self._count_draft(k, verdict.accepted)
            self._emit(seq, verdict.tokens)

    def _room(self, seq: Sequence) -> tuple[int, int]:
        """Tokens the sequence may still emit, and still fit in its cache slot."""
        return seq.max_tokens - seq.generated, self.max_model_len - len(seq.tokens)

    def _draft(
        self, seqs: list[Sequence], ks: list[int]
    ) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
        """Sample ks[i] draft tokens for seqs[i], with the distributions they came from."""
        assert self.draft is not None and self.draft_cache is not None
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        for j in range(max(ks, default=0)):
            rows = [i for i, k in enumerate(ks) if k > j]
            active = [seqs[i] for i in rows]
            if j == 0:  # catch up on tokens the draft has not seen (prefill, last bonus)
                starts = [s.draft_len for s in active]
                ids = [s.tokens[s.draft_len :] for s in active]
            else:
                starts = [len(s.tokens) + j - 1 for s in active]
                ids = [[drafts[i][-1]] for i in rows]
            logits = self._forward(self.draft, self.draft_cache, active, starts, ids)
            step_probs = distributions(logits[:, -1], [s.params for s in active])
            tokens = sample(step_probs, [s.generator for s in active])
            for n, i in enumerate(rows):
                drafts[i].append(tokens[n])
                probs[i].append(step_probs[n])
        return drafts, probs

    def _count_draft(self, proposed: int, accepted: int) -> None:
        self.spec.drafts += 1
        self.spec.draft_tokens += proposed
        self.spec.accepted_tokens += accepted
        if self.metrics is not None:
            self.metrics.spec_drafts.inc()
            self.metrics.spec_draft_tokens.inc(proposed)
            self.metrics.spec_accepted_tokens.inc(accepted)

    def _forward(
        self,
        model: LlamaForCausalLM,
        cache: KVCache,
        seqs: Seq[Sequence],
        starts: list[int],
        ids: list[list[int]],
        all_positions: bool = False,
    ) -> torch.Tensor:
        """Feed row i's `ids[i]` from position `starts[i]`: logits [B, T, V] for every
        position, or [B, 1, V] for each row's last token."""
        counts = [len(row) for row in ids]
        width = max(counts)
        tokens = torch.tensor([row + [0] * (width - len(row)) for row in ids], dtype=torch.long)
        layout = cache.layout([s.slot for s in seqs], starts, counts)
        if all_positions or width == 1:
            logits: torch.Tensor = model(tokens, cache=cache, layout=layout)
            return logits
        last = torch.tensor(counts, dtype=torch.long) - 1
        logits = model(tokens, cache=cache, layout=layout, last_only=last)
        return logits

    def _emit(self, seq: Sequence, tokens: list[int]) -> None:
        """Append generated tokens, stopping at EOS, a stop string or the length limit."""
        now = time.perf_counter()
        kept: list[int] = []
        text, stopped = "", False
        for token in tokens:
            seq.tokens.append(token)
            seq.generated += 1
            kept.append(token)
            if token == self.tokenizer.eos_id:
                seq.finish_reason = "stop"
                break
            piece, stopped = seq.stream.feed(seq.detokenizer.add([token]))
            text += piece
            if stopped:
                seq.finish_reason = "stop"
                break
            if seq.generated >= seq.max_tokens or len(seq.tokens) >= self.max_model_len:
                seq.finish_reason = "length"
                break
        if seq.finish_reason is not None and not stopped:
            tail, stopped = seq.stream.feed(seq.detokenizer.flush())
            text += tail if stopped else tail + seq.stream.flush()
        self._observe(seq, len(kept), now)
        seq.sink(Output(text, kept, seq.prompt_len, seq.generated, seq.finish_reason))

    def _observe(self, seq: Sequence, count: int, now: float) -> None:
        if self.metrics is not None:
            self.metrics.generation_tokens.inc(count)
            if seq.first_token_at is None:
                self.metrics.ttft.observe(now - seq.arrival)
            elif seq.last_token_at is not None:
                self.metrics.inter_token.observe(now - seq.last_token_at)
        if seq.first_token_at is None:
            seq.first_token_at = now
        seq.last_token_at = now

    def _retire(self) -> None:
        for seq in [s for s in self.running if s.finish_reason is not None]:
            self.running.remove(seq)
            if seq.slot >= 0:
                self.free_slots.append(seq.slot)
            if seq.finish_reason == "abort":
                seq.sink(Output("", [], seq.prompt_len, seq.generated, "abort"))
            if self.metrics is not None:
                e2e_s = time.perf_counter() - seq.arrival
                self.metrics.finished(seq.finish_reason or "abort", e2e_s)

    def _report(self) -> None:
        if self.metrics is None:
            return
        self.metrics.running.set(len(self.running))
        self.metrics.waiting.set(len(self.waiting))
        used = sum(len(s.tokens) for s in self.running)
        self.metrics.kv_cache_usage.set(used / (self.options.max_num_seqs * self.max_model_len))
