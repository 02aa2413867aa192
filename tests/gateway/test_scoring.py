"""The router's models applied to request and reply bodies (`gateway.scoring`)."""

from __future__ import annotations

from gateway.scoring import AnswerVerifier, RequestScorer, shipped_verifier

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
