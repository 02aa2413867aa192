"""Embedded CPU engine throughput: static vs continuous batching, and speculation.

    python -m tests.benchmarks.engine [--requests 96] [--rate 50] [--threads 2]

One run, one machine, the shipped tiny model pair, greedy decoding (so every variant
generates the same tokens and only the time differs):

1. batching: the same stream of requests (Poisson arrivals at `--rate` per second, output
   lengths drawn between 8 and 128 tokens) served with static batching (a batch runs until
   its last request finishes; arrivals wait) and with continuous batching (requests join
   and leave between decode steps). Throughput is generated tokens over the makespan, so
   the default rate is set above what the engine serves: at a rate it keeps up with, both
   finish with the last arrival and the ratio measures the arrival process instead.
2. speculation: the same requests one at a time (single stream), without and with the
   draft model; plus the Poisson stream under continuous batching with the draft.

Figures are ratios against the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from local_engine.cpu.checkpoint import load_model
from local_engine.cpu.engine import Engine, EngineOptions, SchedulingType
from local_engine.cpu.model import LlamaForCausalLM
from local_engine.cpu.sampling import SamplingParams
from local_engine.cpu.sequence import Output, Request, Sink
from local_engine.cpu.server import DEFAULT_DRAFT, DEFAULT_MODEL
from local_engine.cpu.tokenizer import TOKENIZER_FILE, Tokenizer

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "routing" / "gsm8k.jsonl"
MAX_OUTPUT = 128
FALLBACK_PROMPTS = ("How many legs do 3 spiders have?", "Write a function that adds two numbers.")


@dataclass(frozen=True)
class Job:
    arrival: float
    request: Request


@dataclass(frozen=True)
class Result:
    tokens: int
    seconds: float
    mean_latency: float
    mean_ttft: float
    outputs: dict[str, list[int]]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def workload(tokenizer: Tokenizer, count: int, rate: float, seed: int, context: int) -> list[Job]:
    rng = random.Random(seed)
    questions = _questions(count)
    jobs, clock = [], 0.0
    for i in range(count):
        clock += rng.expovariate(rate)
        messages = [{"role": "user", "content": questions[i % len(questions)]}]
        longest = min(MAX_OUTPUT, context // 4)
        max_tokens = rng.randint(8, longest)
        ids = tokenizer.encode(tokenizer.render_chat(messages))[-(context - longest) :]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        jobs.append(Job(clock, Request(f"b{i}", ids, params)))
    return jobs


def _questions(count: int) -> list[str]:
    if not GSM8K.exists():
        return list(FALLBACK_PROMPTS)
    with GSM8K.open() as rows:
        return [json.loads(row)["prompt"] for _, row in zip(range(count), rows, strict=False)]


def serve(engine: Engine, jobs: list[Job], paced: bool = True) -> Result:
    """Submit each job at its arrival time (or all at once) and step until all finish."""
    outputs: dict[str, list[Output]] = {job.request.request_id: [] for job in jobs}
    finished: dict[str, float] = {}
    first: dict[str, float] = {}
    pending = list(jobs)
    start = time.perf_counter()
    while pending or engine.has_work():
        now = time.perf_counter() - start
        while pending and (not paced or pending[0].arrival <= now):
            job = pending.pop(0)
            engine.add(job.request, _sink(outputs, first, finished, job.request.request_id, start))
        if engine.has_work():
            engine.step()
        elif pending:
            time.sleep(max(0.0, pending[0].arrival - now))
    makespan = time.perf_counter() - start
    arrivals = {job.request.request_id: job.arrival if paced else 0.0 for job in jobs}
    tokens = {rid: [t for o in outs for t in o.token_ids] for rid, outs in outputs.items()}
    return Result(
        tokens=sum(len(t) for t in tokens.values()),
        seconds=makespan,
        mean_latency=sum(finished[r] - arrivals[r] for r in finished) / len(finished),
        mean_ttft=sum(first[r] - arrivals[r] for r in first) / len(first),
        outputs=tokens,
    )


def _sink(
    outputs: dict[str, list[Output]],
    first: dict[str, float],
    finished: dict[str, float],
    rid: str,
    start: float,
) -> Sink:
    def sink(output: Output) -> None:
        outputs[rid].append(output)
        now = time.perf_counter() - start
        first.setdefault(rid, now)
        if output.finish_reason is not None:
            finished[rid] = now

    return sink


def one_at_a_time(engine: Engine, jobs: list[Job]) -> Result:
    results = [serve(engine, [Job(0.0, job.request)], paced=False) for job in jobs]
    seconds = sum(r.seconds for r in results)
    return Result(
        tokens=sum(r.tokens for r in results),
        seconds=seconds,
        mean_latency=seconds / len(results),
        mean_ttft=sum(r.mean_ttft for r in results) / len(results),
        outputs={k: v for r in results for k, v in r.outputs.items()},
    )


def make_engine(
    target: LlamaForCausalLM,
    tokenizer: Tokenizer,
    draft: LlamaForCausalLM | None,
    scheduling: SchedulingType,
    batch: int,
    k: int,
) -> Engine:
    options = EngineOptions(max_num_seqs=batch, num_speculative_tokens=k, scheduling=scheduling)
    return Engine(target, tokenizer, draft=draft, options=options)


def line(name: str, result: Result, baseline: Result) -> str:
    ratio = result.tokens_per_s / baseline.tokens_per_s
    return (
        f"  {name:<34} {result.tokens_per_s:7.1f} tok/s  x{ratio:4.2f}"
        f"  latency {result.mean_latency:5.2f} s  ttft {result.mean_ttft:5.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--draft-model", type=Path, default=DEFAULT_DRAFT)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--rate", type=float, default=50.0, help="arrivals per second")
    parser.add_argument("--batch", type=int, default=8, help="max running sequences")
    parser.add_argument("-k", type=int, default=4, help="speculative tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer.load(args.model / TOKENIZER_FILE)
    target, draft = load_model(args.model), load_model(args.draft_model)
    context = target.config.max_position_embeddings
    jobs = workload(tokenizer, args.requests, args.rate, args.seed, context)
    print(
        f"{len(jobs)} requests, Poisson {args.rate}/s, batch {args.batch}, K={args.k}, "
        f"{args.threads} threads, torch {torch.__version__}"
    )
    serve(make_engine(target, tokenizer, None, "continuous", args.batch, 0), jobs[:2])  # warm-up

    static = serve(make_engine(target, tokenizer, None, "static", args.batch, 0), jobs)
    continuous = serve(make_engine(target, tokenizer, None, "continuous", args.batch, 0), jobs)
    spec_engine = make_engine(target, tokenizer, draft, "continuous", args.batch, args.k)
    continuous_spec = serve(spec_engine, jobs)
    print("batching (Poisson arrivals, varied output lengths):")
    print(line("static batching (baseline)", static, static))
    print(line("continuous batching", continuous, static))
    print(line("continuous batching + speculation", continuous_spec, static))

    single = jobs[: max(4, len(jobs) // 4)]
    plain = one_at_a_time(make_engine(target, tokenizer, None, "continuous", 1, 0), single)
    spec_single = make_engine(target, tokenizer, draft, "continuous", 1, args.k)
    speculated = one_at_a_time(spec_single, single)
    print(f"speculation (single stream, {len(single)} requests):")
    print(line("no speculation (baseline)", plain, plain))
    print(line(f"speculation K={args.k}", speculated, plain))
    for name, engine in (("single stream", spec_single), ("batched stream", spec_engine)):
        stats = engine.spec
        rate = stats.accepted_tokens / max(1, stats.draft_tokens)
        mean_len = 1 + stats.accepted_tokens / max(1, stats.drafts)
        print(f"  {name}: acceptance rate {rate:.2f}, mean acceptance length {mean_len:.2f}")
    same = (
        continuous.outputs == static.outputs == continuous_spec.outputs
        and plain.outputs == speculated.outputs
    )
    print(f"greedy outputs identical across all variants: {same}")


if __name__ == "__main__":
    main()
