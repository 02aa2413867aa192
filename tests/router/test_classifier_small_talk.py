"""Small talk takes a prior that no training prompt takes, so the classifier's
cross-validated figures cannot move with it."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from router.classifier import SMALL_TALK_LOGIT, Classifier
from router.features import extract

DATA = Path(__file__).resolve().parents[2] / "router" / "data"


def features(text: str, role: str = "user") -> bool:
    return extract([{"role": role, "content": text}]).small_talk


@pytest.mark.parametrize("text", ["hi", "Hello!", "thanks a lot", "What is the capital of France?"])
def test_short_prompts_of_no_task_are_small_talk(text: str) -> None:
    assert features(text)


@pytest.mark.parametrize(
    "text",
    [
        "Prove that 7 is prime.",  # maths words
        "Write a python function to add.",  # code
        "Why is the sky blue? Explain why.",  # reasoning
        "x" * 40,  # long enough to be a task
    ],
)
def test_tasks_are_not(text: str) -> None:
    assert not features(text)


def test_no_shipped_prompt_is_small_talk() -> None:
    for path in sorted(DATA.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            assert not any(features(json.loads(line)["prompt"]) for line in lines), path.name


def test_the_prior_lowers_the_logit_by_its_weight() -> None:
    classifier = Classifier.load()
    found = extract([{"role": "user", "content": "hi"}])
    plain = classifier.score_features(type(found)(found.dense, found.hash_index, found.hash_value))
    shifted = classifier.score_features(found)

    def logit(p: float) -> float:
        return math.log(p / (1 - p))

    assert logit(shifted) - logit(plain) == pytest.approx(SMALL_TALK_LOGIT)
