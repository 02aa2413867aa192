"""The split on the routing data the package ships (``router/data``: a missing file
fails these tests, never skips them), and how that data is read."""

from __future__ import annotations

import gzip
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from router.errors import RoutingError
from router.training import dataset, open_verifier_train, quality_data
from router.training.dataset import (
    DEFAULT_DATA_DIR,
    Example,
    cheap_pool,
    data_digest,
    data_file,
    evaluation_folds,
    is_held_out_subject,
    load_examples,
    pooled_gains,
    selection_folds,
    subject_folds,
    training_pool,
)

ROOT = Path(__file__).resolve().parents[2]
STEMS = sorted({*dataset.DATASETS, *quality_data.DATASETS, open_verifier_train.ARENA_STEM})


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    return load_examples()


def test_the_package_ships_every_data_file_with_its_card() -> None:
    """Each file any trainer reads is in ``router/data``, gzip-compressed, and matched by
    the package data globs, so an installed package trains as a clone does."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["router"]
    shipped = sorted(p.name for p in DEFAULT_DATA_DIR.iterdir())
    assert shipped == sorted([*(f"{stem}.jsonl.gz" for stem in STEMS), "README.md"])
    for name in shipped:
        assert any(fnmatch(f"data/{name}", glob) for glob in globs), name
    for stem in STEMS:
        assert data_file(DEFAULT_DATA_DIR, stem) == DEFAULT_DATA_DIR / f"{stem}.jsonl.gz"


def test_plain_and_compressed_files_read_alike(tmp_path: Path) -> None:
    """A ``--data`` directory of plain ``.jsonl`` reads as the shipped ``.jsonl.gz`` does,
    with the same digest (taken over the content), so artefacts record one figure."""
    for stem in dataset.DATASETS:
        plain = gzip.decompress(data_file(DEFAULT_DATA_DIR, stem).read_bytes())
        (tmp_path / f"{stem}.jsonl").write_bytes(plain)
    assert data_digest(tmp_path) == data_digest()
    assert quality_data.data_digest(tmp_path) != quality_data.data_digest()  # no arena
    assert load_examples(tmp_path)[::500] == load_examples()[::500]


def test_a_missing_file_is_named_with_both_forms(tmp_path: Path) -> None:
    with pytest.raises(RoutingError, match=r"mmlu\.jsonl is missing; expected mmlu\.jsonl or"):
        load_examples(tmp_path)


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


def test_subject_folds_leave_out_each_training_subject_once(examples: list[Example]) -> None:
    """More draws of unseen MMLU subjects, made of the training pool only: every training
    subject is judged once, by a fold that trains on neither it nor a held-out subject."""
    pool = training_pool(examples)
    folds = subject_folds(pool)
    assert [f.name for f in folds] == ["mmlu-subjects-0", "mmlu-subjects-1", "mmlu-subjects-2"]
    judged = [e.subject for f in folds for e in {x.subject: x for x in f.test}.values()]
    assert sorted(judged) == sorted({e.subject for e in pool if e.dataset == "mmlu"})
    for fold in folds:
        assert {e.dataset for e in fold.test} == {"mmlu"}
        assert not {e.subject for e in fold.test} & {e.subject for e in fold.train}
        mmlu = [e for e in fold.test + fold.train if e.dataset == "mmlu"]
        assert not any(is_held_out_subject(e.subject) for e in mmlu)
        assert len(fold.train) + len(fold.test) == len(pool)


def test_routerbench_gains_are_pooled_over_the_cheap_models(examples: list[Example]) -> None:
    """RouterBench rows: GPT-4's correctness minus the cheap pool's mean (graded);
    MMLU and GSM8K carry only the pair, so their gain is strong - weak (-1, 0 or 1)."""
    for e in examples:
        if e.dataset in ("mmlu", "gsm8k"):
            assert e.gain == float(e.strong_correct) - float(e.weak_correct)
        else:
            assert -1.0 <= e.gain <= 1.0
    graded = {e.gain for e in examples if e.dataset == "arc_challenge"}
    assert len(graded) > 3


def test_the_cheap_pool_is_the_models_under_half_the_strong_cost() -> None:
    def row(i: int, correct: dict[str, float]) -> dict[str, object]:
        costs = {"gpt-4-1106-preview": 1.0, "dear": 0.6, "small": 0.1, "mid": 0.3}
        models = {m: {"correct": c, "cost_usd": costs[m]} for m, c in correct.items()}
        return {"id": i, "models": models}

    rows = [
        row(1, {"gpt-4-1106-preview": 1, "dear": 1, "small": 0, "mid": 1}),
        row(2, {"gpt-4-1106-preview": 0, "dear": 1, "small": 1, "mid": 1}),
    ]
    assert cheap_pool(rows) == ["mid", "small"]
    assert pooled_gains(rows) == {"1": 0.5, "2": -1.0}
    assert pooled_gains([{"id": 3, "weak_correct": 1}]) == {}  # no pool: the pair's gain
