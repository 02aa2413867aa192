from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from router.classifier import DEFAULT_PATH, Classifier
from router.errors import RoutingError
from router.features import extract

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
    hard_short = classifier.score(HARD, max_tokens=100, tools=[])
    assert classifier.score_batch(requests) == pytest.approx([easy, hard_short])


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


def logit(p: float) -> float:
    return float(np.log(p / (1 - p)))


QUESTION = "Explain how quantum entanglement differs from classical correlation."
TRANSLATIONS = [
    "解释量子纠缠与经典相关性有何不同。",
    "Объясните, чем квантовая запутанность отличается от классической корреляции.",
    "اشرح كيف يختلف التشابك الكمومي عن الارتباط الكلاسيكي.",
]


def test_a_request_outside_the_training_range_weighs_as_its_edge(classifier: Classifier) -> None:
    """Features are clipped into the range training saw: the same question in another
    script (training had under 12% non-ASCII text) or padded far past the longest
    training prompt moves the score by a bounded amount, not 200 standard deviations'."""
    english = logit(classifier.score([{"role": "user", "content": QUESTION}]))
    for text in TRANSLATIONS:
        assert abs(logit(classifier.score([{"role": "user", "content": text}])) - english) < 2.5
    assert classifier.dense_high is not None
    longest = float(np.expm1(classifier.dense_high[0]))  # log_chars, the longest prompt
    padded = [{"role": "user", "content": "filler " * int(longest) + QUESTION}]
    more = [{"role": "user", "content": "filler " * int(4 * longest) + QUESTION}]
    assert classifier.score(more) == pytest.approx(classifier.score(padded), abs=0.02)


def test_request_options_the_data_never_varied_carry_prior_weights(
    classifier: Classifier,
) -> None:
    """Tools and JSON output ask more of a model, a small max_tokens less."""
    plain = classifier.score(EASY)
    assert classifier.score(EASY, tools=[{"type": "function"}]) > plain
    assert classifier.score(EASY, response_format={"type": "json_object"}) > plain
    assert classifier.score(EASY, max_tokens=16) < classifier.score(EASY, max_tokens=4096)
    assert 0.0 < classifier.score(EASY, max_tokens=10**400) < 1.0  # read as 10**7


def test_a_model_file_without_bounds_scores_unclipped(classifier: Classifier) -> None:
    document = classifier.to_dict()
    del document["dense_low"], document["dense_high"]
    older = Classifier.from_dict(document)
    assert older.dense_low is None
    assert classifier.dense_low is not None and classifier.dense_high is not None
    inside = [{"role": "user", "content": HARD[0]["content"][:300]}]
    dense = extract(inside).dense
    assert np.all((classifier.dense_low <= dense) & (dense <= classifier.dense_high))
    assert older.score(inside) == pytest.approx(classifier.score(inside), rel=1e-9)
    # EASY is shorter than any training prompt: clipped, it scores as the shortest one.
    assert extract(EASY).dense[0] < classifier.dense_low[0]
    assert older.score(EASY) != pytest.approx(classifier.score(EASY), rel=1e-6)
