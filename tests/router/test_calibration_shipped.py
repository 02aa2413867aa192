"""The shipped policies' thresholds are what `router calibrate` gives on the shipped
data (`python -m router.training.calibration`, recorded in router/models/defaults.md),
and the default policy's complexity score puts hard prompts visibly above small talk."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.classifier import Classifier
from router.training.calibration import (
    SAMPLE_PER_TASK,
    SAMPLE_STEMS,
    calibrate,
    shipped_answers,
    shipped_rows,
    verify_threshold,
)
from router.verifier import Verifier

ROOT = Path(__file__).resolve().parents[2]
YI = "zero-one-ai/Yi-34B-Chat"
TOLERANCE = 0.01  # thresholds are pinned to calibration within this
HARD = (
    "Prove that there are infinitely many twin primes, or explain why this is an open "
    "problem and what is known.",
    "Write a Python class implementing an LRU cache with get(key) and put(key, value) in "
    "O(1) time, with unit tests.",
)
TRIVIAL = ("hi", "Hello!", "thanks", "What is the capital of France?")


def policy(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "policies" / name).read_text())
    return document


def verifier_scores(answers: Sequence[dict[str, Any]]) -> list[float]:
    """As `router verify` scores the rows: the classifier's score as the prior."""
    verifier, classifier = Verifier.load(), Classifier.load()
    return [
        verifier.score(
            a["prompt"],
            a["response"],
            prompt_score=classifier.score([{"role": "user", "content": a["prompt"]}]),
            samples=a.get("samples", ()),
        )
        for a in answers
    ]


def calibrated(opinion: str | None = None) -> float:
    answers = shipped_answers(opinion=opinion)
    unacceptable = sum(not a["acceptable"] for a in answers) / len(answers)
    return verify_threshold(verifier_scores(answers), unacceptable)


def test_the_sample_weighs_each_task_alike() -> None:
    rows = list(shipped_rows())
    assert len(rows) == SAMPLE_PER_TASK * len(SAMPLE_STEMS)
    answers = shipped_answers()
    assert len(answers) == SAMPLE_PER_TASK * (len(SAMPLE_STEMS) - 1)  # MMLU has none
    assert {type(a["acceptable"]) for a in answers} == {bool}
    assert rows == list(shipped_rows())  # a fixed order: the same thresholds every run


def test_default_verify_threshold_is_the_calibrated_one() -> None:
    shipped = policy("default.yaml")["routes"]["auto"]["verify_threshold"]
    assert shipped == pytest.approx(calibrated(), abs=TOLERANCE)


def test_second_opinion_example_is_calibrated_with_its_opinion() -> None:
    route = policy("examples/cascade-second-opinion.yaml")["routes"]["exam"]
    assert route["verify_threshold"] == pytest.approx(calibrated(YI), abs=TOLERANCE)


def test_classifier_example_tiers_are_the_calibrated_ones() -> None:
    classifier = Classifier.load()
    scores = [classifier.score([{"role": "user", "content": r["prompt"]}]) for r in shipped_rows()]
    tiers = calibrate(scores, {"cheap": 0.7, "strong": 0.3})
    shipped = policy("examples/vllm-engines.yaml")["routes"]["auto"]["tiers"]
    assert shipped[0]["tier"] == "cheap"
    assert shipped[0]["below"] == pytest.approx(tiers[0].below, abs=TOLERANCE)


def explained_score(prompt: str) -> float:
    command = [sys.executable, "-m", "gateway.cli", "policy", "explain"]
    done = subprocess.run(
        [*command, str(ROOT / "policies" / "default.yaml"), "--prompt", prompt],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    score: float = json.loads(done.stdout)["score"]
    return score


def test_policy_explain_scores_hard_prompts_well_above_small_talk() -> None:
    hard = [explained_score(p) for p in HARD]
    trivial = explained_score("hi")
    assert min(hard) > 10 * trivial, (hard, trivial)
    assert min(hard) - trivial > 0.05


def test_small_talk_scores_below_every_hard_prompt() -> None:
    classifier = Classifier.load()

    def score(text: str) -> float:
        return classifier.score([{"role": "user", "content": text}])

    assert max(map(score, TRIVIAL)) < min(map(score, HARD)) / 3
