"""The tokenizer, the samplers and the speculative accept/reject rule."""

from __future__ import annotations

from pathlib import Path

import torch

from local_engine.cpu.sampling import SamplingParams, distributions, sample
from local_engine.cpu.sequence import TextStream
from local_engine.cpu.speculative import verify
from local_engine.cpu.tokenizer import Detokenizer, Tokenizer

TEXT = "The cat sat on the mat. The cat ate 12 fish; the dog ate 7! Ünïcödé ✓ naïve café."


def test_tokenizer_round_trip_and_special_tokens(tmp_path: Path) -> None:
    tokenizer = Tokenizer.train([TEXT] * 3, vocab_size=300)
    assert tokenizer.vocab_size == 300
    ids = tokenizer.encode(TEXT)
    assert len(ids) < len(TEXT.encode())  # merges were learned and used
    assert tokenizer.decode(ids) == TEXT
    chat = tokenizer.render_chat([{"role": "user", "content": "Hi"}])
    chat_ids = tokenizer.encode(chat)
    assert chat_ids[0] == tokenizer.bos_id and chat_ids[-1] == tokenizer.special_id("<|assistant|>")
    assert tokenizer.decode(chat_ids) == "Hi"
    assert tokenizer.decode(chat_ids, skip_special=False) == chat
    tokenizer.save(tmp_path / "tokenizer.json")
    assert Tokenizer.load(tmp_path / "tokenizer.json").encode(TEXT) == ids


def test_detokenizer_waits_for_whole_characters() -> None:
    tokenizer = Tokenizer(merges=[])
    detok = Detokenizer(tokenizer)
    pieces = [detok.add([byte]) for byte in "é✓".encode()]
    assert pieces == ["", "é", "", "", "✓"]


def test_text_stream_holds_back_possible_stop_prefix() -> None:
    stream = TextStream(("STOP",))
    assert stream.feed("abc ST") == ("abc ", False)
    assert stream.feed("x") == ("STx", False)
    assert stream.feed(" yy ST") == (" yy ", False)
    assert stream.feed("OP and more") == ("", True)


def test_top_p_and_temperature_distributions() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 3)
    params = [SamplingParams(temperature=0.0), SamplingParams(top_p=0.7), SamplingParams()]
    probs = distributions(logits, params)
    assert probs[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    full = torch.softmax(logits[0], -1)
    torch.testing.assert_close(probs[2], full)
    # top_p 0.7: the two most likely tokens hold 0.88 >= 0.7 while the first alone holds 0.64.
    torch.testing.assert_close(probs[1], torch.cat([full[:2] / full[:2].sum(), torch.zeros(2)]))


def test_seeded_sampling_reproduces() -> None:
    probs = torch.softmax(torch.randn(1, 50, generator=torch.Generator().manual_seed(0)), -1)
    draws = [sample(probs, [torch.Generator().manual_seed(7)]) for _ in range(2)]
    assert draws[0] == draws[1]


def test_accept_reject_rule_keeps_target_distribution() -> None:
    """Drafting from q and verifying against p must emit tokens distributed as p."""
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.6, 0.1, 0.2], [0.4, 0.4, 0.1, 0.1]])
    gen = torch.Generator().manual_seed(0)
    trials = 20_000
    first = torch.zeros(4)
    pairs = torch.zeros(4, 4)
    accepted = 0
    for _ in range(trials):
        d1 = int(torch.multinomial(q[0], 1, generator=gen))
        d2 = int(torch.multinomial(q[1], 1, generator=gen))
        verdict = verify([d1, d2], q, p, gen)
        first[verdict.tokens[0]] += 1
        accepted += verdict.accepted >= 1
        if verdict.accepted >= 1:
            pairs[verdict.tokens[0], verdict.tokens[1]] += 1
    freq = first / trials
    tolerance = 4 * torch.sqrt(p[0] * (1 - p[0]) / trials)
    assert bool(((freq - p[0]).abs() < tolerance).all()), (freq, p[0])
    # The first draft is accepted with probability sum_x min(p(x), q(x)) = 0.5.
    assert abs(accepted / trials - 0.5) < 0.015
    # After an accepted first token the second is distributed as p_2 (independent of d1 here).
    second = pairs.sum(0) / pairs.sum()
    tolerance = 4 * torch.sqrt(p[1] * (1 - p[1]) / pairs.sum())
    assert bool(((second - p[1]).abs() < tolerance).all()), (second, p[1])


def test_greedy_verdicts_keep_draft_until_first_mismatch() -> None:
    onehot = torch.eye(5)
    p = onehot[[1, 2, 3, 4]]
    gen = torch.Generator().manual_seed(0)
    assert verify([1, 2, 0], onehot[[1, 2, 0]], p, gen).tokens == [1, 2, 3]
    assert verify([1, 2, 3], onehot[[1, 2, 3]], p, gen).tokens == [1, 2, 3, 4]
    assert verify([0, 2, 3], onehot[[0, 2, 3]], p, gen).tokens == [1]
