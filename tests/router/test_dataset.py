"""The split on the real routing data (present in CI, where a missing copy fails)."""

from __future__ import annotations

import os

import pytest

from router.dataset import (
    DEFAULT_DATA_DIR,
    Example,
    evaluation_folds,
    is_held_out_subject,
    load_examples,
    selection_folds,
)


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    if not DEFAULT_DATA_DIR.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"routing data missing at {DEFAULT_DATA_DIR} under CI=true")
        pytest.skip(f"routing data not at {DEFAULT_DATA_DIR}")
    return load_examples()


def test_folds_never_test_on_training_prompts(examples: list[Example]) -> None:
    folds = evaluation_folds(examples)
    assert [f.name for f in folds] == ["mmlu", "gsm8k", "arc_challenge", "winogrande", "mbpp"]
    for fold in folds:
        train_ids, train_prompts = {e.id for e in fold.train}, {e.prompt for e in fold.train}
        assert fold.test and not any(e.id in train_ids for e in fold.test)
        assert not any(e.prompt in train_prompts for e in fold.test)
        assert {e.dataset for e in fold.test} == {fold.name}


def test_about_thirty_percent_of_mmlu_subjects_are_held_out(examples: list[Example]) -> None:
    subjects = {e.subject for e in examples if e.dataset == "mmlu"}
    held_out = {s for s in subjects if is_held_out_subject(s)}
    assert 0.2 <= len(held_out) / len(subjects) <= 0.4


def test_labels(examples: list[Example]) -> None:
    labels = {(e.weak_correct, e.strong_correct): e.label for e in examples}
    assert labels == {(False, True): 1, (True, True): 0, (True, False): 0, (False, False): None}


def test_selection_folds_stay_inside_the_training_rows(examples: list[Example]) -> None:
    mmlu_fold = evaluation_folds(examples)[0]
    held_out = {e.id for e in mmlu_fold.test}
    folds = selection_folds(mmlu_fold.train)
    assert [f.name for f in folds][:4] == ["gsm8k", "arc_challenge", "winogrande", "mbpp"]
    for fold in folds:
        assert not ({e.id for e in fold.train} | {e.id for e in fold.test}) & held_out
        assert not {e.id for e in fold.test} & {e.id for e in fold.train}
        if fold.name.startswith("mmlu"):
            test_subjects = {e.subject for e in fold.test}
            assert not test_subjects & {e.subject for e in fold.train}
