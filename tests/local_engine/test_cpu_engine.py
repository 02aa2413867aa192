"""The scheduler: continuous batching, chunked prefill, stops, and speculative decoding."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from local_engine.cpu.engine import Engine, EngineOptions
from local_engine.cpu.runner import EngineRunner
from local_engine.cpu.sampling import SamplingParams
from local_engine.cpu.sequence import Output, Request, Sequence
from tests.local_engine.tiny_models import TOKENIZER, draft, target
from tests.support import eventually_async

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
PROMPTS = [
    list(range(1, 20)),
    [50, 51, 52],
    list(range(100, 141)),
    [5],
    list(range(7, 30)),
    list(range(200, 212)),
]


def run(
    engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY, join_every: int = 0
) -> list[list[Output]]:
    """Feed the prompts (all at once, or one every `join_every` steps) and step to the end."""
    outputs: list[list[Output]] = [[] for _ in prompts]
    pending = list(enumerate(prompts))
    step = 0
    while pending or engine.has_work():
        joining = pending if join_every == 0 else pending[: int(step % join_every == 0)]
        for i, prompt in joining:
            engine.add(Request(f"r{i}", prompt, params), outputs[i].append)
        pending = pending[len(joining) :]
        engine.step()
        step += 1
    return outputs


def tokens(outputs: list[Output]) -> list[int]:
    return [token for output in outputs for token in output.token_ids]


def alone(prompt: list[int]) -> list[int]:
    engine = Engine(target(), TOKENIZER, options=EngineOptions(max_model_len=128))
    return tokens(run(engine, [prompt])[0])


def test_requests_joining_mid_batch_match_running_alone() -> None:
    options = EngineOptions(max_num_seqs=4, max_model_len=128, max_prefill_tokens=16)
    engine = Engine(target(), TOKENIZER, options=options)
    together = run(engine, PROMPTS, join_every=3)
    expected = [alone(prompt) for prompt in PROMPTS]
    assert [tokens(outputs) for outputs in together] == expected
    assert all(outputs[-1].finish_reason == "length" for outputs in together)
    assert all(len(tokens(outputs)) == 24 for outputs in together)


def test_static_batching_gives_the_same_greedy_output() -> None:
    options = EngineOptions(max_num_seqs=4, max_model_len=128, scheduling="static")
    outputs = run(Engine(target(), TOKENIZER, options=options), PROMPTS)
    assert [tokens(o) for o in outputs] == [alone(prompt) for prompt in PROMPTS]


def test_chunked_prefill_bounds_tokens_per_step() -> None:
    options = EngineOptions(max_num_seqs=2, max_model_len=128, max_prefill_tokens=8)
    engine = Engine(target(), TOKENIZER, options=options)
    engine.add(Request("long", list(range(1, 41)), GREEDY), lambda output: None)
    engine.step()
    assert engine.running[0].prefilled == 8
    for _ in range(3):
        engine.step()
    assert (engine.running[0].prefilled, engine.running[0].generated) == (32, 0)
    engine.step()  # the last chunk: the first token is sampled (and decoding starts)
    assert engine.running[0].generated >= 1


def test_greedy_speculation_is_identical_to_plain_decoding() -> None:
    options = EngineOptions(max_num_seqs=3, max_model_len=128, num_speculative_tokens=3)
    plain = run(Engine(target(), TOKENIZER, options=options), PROMPTS)
    with_random_draft = Engine(target(), TOKENIZER, draft=draft(), options=options)
    speculated = run(with_random_draft, PROMPTS, join_every=2)
    assert [tokens(o) for o in speculated] == [tokens(o) for o in plain]
    assert with_random_draft.spec.drafts > 0
    # A draft equal to the target is always right: every drafted token is accepted.
    perfect = Engine(target(), TOKENIZER, draft=target(), options=options)
    assert [tokens(o) for o in run(perfect, PROMPTS)] == [tokens(o) for o in plain]
    assert perfect.spec.accepted_tokens == perfect.spec.draft_tokens > 0


def test_sampled_speculation_is_seed_reproducible() -> None:
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, seed=3)
    options = EngineOptions(max_num_seqs=2, max_model_len=128)
    runs = [
        tokens(
            run(Engine(target(), TOKENIZER, draft=draft(), options=options), [PROMPTS[0]], params)[
                0
            ]
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0]) == 20


def test_stop_string_and_eos_end_the_output() -> None:
    reference = alone(PROMPTS[0])
    text = TOKENIZER.decode(reference)
    stop = text[5:7]
    engine = Engine(target(), TOKENIZER, options=EngineOptions(max_model_len=128))
    params = SamplingParams(temperature=0.0, max_tokens=24, stop=(stop,))
    outputs = run(engine, [PROMPTS[0]], params)[0]
    assert outputs[-1].finish_reason == "stop"
    assert "".join(o.text for o in outputs) == text[: text.index(stop)]


def test_abort_frees_the_slot() -> None:
    engine = Engine(target(), TOKENIZER, options=EngineOptions(max_num_seqs=1, max_model_len=128))
    seen: list[Output] = []
    engine.add(Request("a", [1, 2, 3], GREEDY), seen.append)
    engine.step()
    engine.abort("a")
    engine.step()
    assert seen[-1].finish_reason == "abort" and not engine.running
    assert engine.free_slots == [0]


def test_failed_step_aborts_its_requests_and_the_engine_keeps_serving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = Engine(target(), TOKENIZER, options=EngineOptions(max_num_seqs=2, max_model_len=128))
    decode = engine._decode
    failures = iter([True])

    def flaky(seqs: list[Sequence]) -> None:
        if next(failures, False):
            raise RuntimeError("boom")
        decode(seqs)

    monkeypatch.setattr(engine, "_decode", flaky)
    stop = threading.Event()
    thread = threading.Thread(target=engine.run, args=(stop,))
    thread.start()
    try:
        finishes = []
        for name in ("first", "second"):
            outputs: queue.Queue[Output] = queue.Queue()
            engine.add(Request(name, [1, 2, 3], GREEDY), outputs.put)
            output = outputs.get(timeout=10)
            while output.finish_reason is None:
                output = outputs.get(timeout=10)
            finishes.append(output.finish_reason)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert finishes == ["abort", "length"]
    assert sorted(engine.free_slots) == [0, 1]


async def test_closing_a_stream_aborts_its_request(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(target(), TOKENIZER, options=EngineOptions(max_num_seqs=1, max_model_len=128))
    decode = engine._decode

    def slow(seqs: list[Sequence]) -> None:
        time.sleep(0.01)
        decode(seqs)

    monkeypatch.setattr(engine, "_decode", slow)
    runner = EngineRunner(engine)
    runner.start()
    try:
        params = SamplingParams(temperature=0.0, max_tokens=100)
        stream = runner.generate(Request("gone", [1, 2, 3], params))
        first = await anext(stream)
        await stream.aclose()  # what the server does when the client disconnects
        await eventually_async(lambda: not engine.running, 10, "the request aborted")
    finally:
        runner.stop()
    assert first.finish_reason is None
    assert not engine.running and engine.free_slots == [0]
