from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from router.classifier import DEFAULT_PATH, Classifier
from router.errors import RoutingError

EASY = [{"role": "user", "content": "hi, what's the capital of France?"}]
HARD = [
    {
        "role": "user",
        "content": (
            "Prove step by step that for every integer n >= 1 the sum 1^3 + 2^3 + ... + n^3 "
            "equals (n(n+1)/2)^2. Then solve the recurrence a_{n+1} = 3a_n + 2^n with "
            "a_0 = 1, derive a closed form, calculate a_10, and prove by induction that "
            r"your formula is correct. Use LaTeX: $\sum_{k=1}^{n} k^3$, $\frac{n(n+1)}{2}$. "
            "Explain why each step holds and compare with a generating-function proof."
        ),
    }
]


@pytest.fixture(scope="module")
def classifier() -> Classifier:
    return Classifier.load()


def test_shipped_artifact_is_small_json() -> None:
    assert DEFAULT_PATH.stat().st_size < 2_000_000
    document = json.loads(DEFAULT_PATH.read_text())
    assert document["format"] == "cascade-gateway/classifier"
    assert DEFAULT_PATH.with_suffix(".card.md").is_file()


def test_scores_are_probabilities_and_rank_hard_above_easy(classifier: Classifier) -> None:
    easy, hard = classifier.score(EASY), classifier.score(HARD)
    assert 0.0 <= easy < hard <= 1.0
    requests: list[dict[str, object]] = [
        {"messages": EASY},
        {"messages": HARD, "max_tokens": 100, "tools": []},
    ]
    assert classifier.score_batch(requests) == pytest.approx([easy, hard])


def test_json_round_trip_is_exact(classifier: Classifier, tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    classifier.save(path)
    again = Classifier.load(path)
    assert path.read_bytes() == DEFAULT_PATH.read_bytes()
    assert again.score(HARD) == classifier.score(HARD)
    assert np.array_equal(again.hash_coef, classifier.hash_coef)


def test_mismatched_feature_spec_is_refused(classifier: Classifier, tmp_path: Path) -> None:
    document = classifier.to_dict() | {"feature_version": 999}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    with pytest.raises(RoutingError, match="feature_version=999"):
        Classifier.load(path)


def test_unreadable_model_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(RoutingError, match=r"broken\.json"):
        Classifier.load(path)
