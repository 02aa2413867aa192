"""The quality predictor's data, splits, training and evaluation, on small fixture rows
written here (the tests never read the shipped data)."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
import pytest

from router.cli import add_router_commands
from router.errors import RoutingError
from router.quality import STRONG_MODEL, QualityPredictor
from router.training.quality_data import (
    INNER_FOLDS,
    OUTER_FOLDS,
    QualityTable,
    final_split,
    inner_folds,
    load_table,
    outer_folds,
    prompt_group,
)
from router.training.quality_evaluation import best_single, judge, single_point, sweep
from router.training.quality_train import (
    Recipe,
    dense_features,
    evaluate_split,
    fit,
    fit_basis,
    train,
)

MIXTRAL = "mistralai/mixtral-8x7b-chat"
YI = "zero-one-ai/Yi-34B-Chat"
SHARED = "Which planet is the largest in the solar system?"
QUICK = (Recipe("prior"), Recipe("gain", 1.0, 1.0), Recipe("heads", 1.0))


def quiz(i: int) -> str:
    return (
        f"Question {i}: which of these is warmer at noon, place {i} or place {i + 1}?\n"
        f"A) the first\nB) the second\nC) both\nD) neither\nAnswer:"
    )


def code(i: int) -> str:
    return f"Write a python function to return the {i}th number of a sequence."


def write_data(directory: Path, rows: int = 40, seed: int = 0) -> Path:
    """RouterBench-like quiz and code rows (three models, costs), arena-like chat rows
    under arena's model names, and MMLU-like pair rows; one prompt in two files."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)

    def answers(names: dict[str, tuple[float, float]]) -> dict[str, object]:
        return {
            name: {"correct": float(rng.random() < p), "cost_usd": price, "response": "A"}
            for name, (p, price) in names.items()
        }

    quiz_models = {STRONG_MODEL: (0.95, 5e-3), YI: (0.9, 4e-4), MIXTRAL: (0.8, 3e-4)}
    code_models = {STRONG_MODEL: (0.7, 9e-3), YI: (0.3, 2e-4), MIXTRAL: (0.6, 2e-4)}
    arc = [{"id": f"q{i}", "prompt": quiz(i), "models": answers(quiz_models)} for i in range(rows)]
    arc.append({"id": "shared", "prompt": SHARED, "models": answers(quiz_models)})
    mbpp = [{"id": f"c{i}", "prompt": code(i), "models": answers(code_models)} for i in range(rows)]
    arena = [
        {
            "id": f"a{i}",
            "prompt": f"Tell me a story about a dragon named {i}, with a twist.",
            "models": {
                STRONG_MODEL: {"score": rng.choice([8, 9, 10]), "cost_usd": 0.02},
                "mistralai/Mixtral-8x7B-Instruct-v0.1": {
                    "score": rng.randint(1, 10),
                    "cost_usd": 3e-4,
                },
                "claude-instant-1": {"score": rng.randint(1, 10), "cost_usd": 8e-4},
            },
        }
        for i in range(rows // 2)
    ]
    mmlu = [
        {
            "id": f"m{i}",
            "prompt": f"{SHARED}\n" if i == 0 else f"What is {i} plus {i}?\nA. {2 * i}\nB. 1",
            "subject": "maths",
            "weak_correct": rng.random() < 0.6,
            "strong_correct": rng.random() < 0.8,
        }
        for i in range(rows)
    ]
    for stem, data in {
        "routerbench_arc_challenge": arc,
        "routerbench_mbpp": mbpp,
        "arena_chat": arena,
        "mmlu": mmlu,
    }.items():
        (directory / f"{stem}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    return directory


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> QualityTable:
    return load_table(write_data(tmp_path_factory.mktemp("data")))


@pytest.fixture(scope="module")
def dense(table: QualityTable) -> np.ndarray:
    return dense_features(table)


def test_table_unifies_aliases_and_maps_grades(table: QualityTable) -> None:
    assert table.models == tuple(sorted({STRONG_MODEL, YI, MIXTRAL, "claude-instant-v1"}))
    arena = table.of("arena_chat")
    mixtral = table.models.index(MIXTRAL)
    assert not np.isnan(table.quality[arena, mixtral]).any()  # arena's name, one column
    assert ((table.quality[arena] >= 0) | np.isnan(table.quality[arena])).all()
    strong = table.quality[arena, table.models.index(STRONG_MODEL)]
    assert set(np.round(strong * 9 + 1).tolist()) <= {8.0, 9.0, 10.0}
    mmlu = table.of("mmlu")
    assert np.isnan(table.cost[mmlu]).all()
    assert np.isnan(table.quality[mmlu, table.models.index(YI)]).all()


def test_bad_rows_and_missing_data_are_named(tmp_path: Path) -> None:
    with pytest.raises(RoutingError, match="no routing data"):
        load_table(tmp_path)
    path = tmp_path / "arena_chat.jsonl"
    path.write_text(json.dumps({"id": 1, "prompt": "x", "models": {"m": {"score": 11}}}) + "\n")
    with pytest.raises(RoutingError, match=f"{path}:1:"):
        load_table(tmp_path)


def test_groups_ignore_whitespace_and_case() -> None:
    assert prompt_group("Which  planet\nis BIG?") == prompt_group("which planet is big?")
    assert prompt_group("which planet is big?") != prompt_group("which planet is small?")


def test_a_prompt_in_two_datasets_stays_on_one_side(table: QualityTable) -> None:
    twins = [i for i, p in enumerate(table.prompts) if p.strip() == SHARED]
    assert len(twins) == 2 and len({table.datasets[i] for i in twins}) == 2
    pool, final = final_split(table)
    assert len(set(twins) & set(final.tolist())) in (0, 2)
    for outer_train, test in outer_folds(table, pool):
        assert len(set(twins) & set(test.tolist())) in (0, 2)
        for inner_train, inner_test in inner_folds(table, outer_train):
            assert len(set(twins) & set(inner_test.tolist())) in (0, 2)
            assert set(inner_train.tolist()) | set(inner_test.tolist()) == set(outer_train.tolist())


def test_folds_partition_rows_and_never_share_a_prompt(table: QualityTable) -> None:
    pool, final = final_split(table)
    assert len(final) and not set(pool.tolist()) & set(final.tolist())
    assert sorted([*pool.tolist(), *final.tolist()]) == list(range(len(table)))
    groups = np.array(table.groups)
    tests = []
    for outer_train, test in outer_folds(table, pool):
        assert not set(groups[outer_train]) & set(groups[test])
        assert not set(groups[test]) & set(groups[final])
        tests += test.tolist()
        inner = list(inner_folds(table, outer_train))
        assert len(inner) == INNER_FOLDS
        for inner_train, inner_test in inner:
            assert not set(groups[inner_train]) & set(groups[inner_test])
    assert sorted(tests) == sorted(pool.tolist())
    assert len(list(outer_folds(table, pool))) == OUTER_FOLDS


def test_a_split_never_reads_its_test_labels(table: QualityTable, dense: np.ndarray) -> None:
    """The recipe choice and the fit see the training rows only: the test rows' labels
    can change without changing the model."""
    pool, final = final_split(table)
    first, _ = evaluate_split(table, pool, final, dense, "final", QUICK)
    changed = table.quality.copy()
    changed[final] = np.where(np.isnan(changed[final]), np.nan, 1.0 - changed[final])
    other = QualityTable(
        table.models, table.ids, table.datasets, table.prompts, table.groups, changed, table.cost
    )
    second, _ = evaluate_split(other, pool, final, dense, "final", QUICK)
    assert second.to_dict() == first.to_dict()


def test_training_is_deterministic_and_predicts_qualities(
    table: QualityTable, dense: np.ndarray, tmp_path: Path
) -> None:
    one, folds, final = train(table, dense, QUICK)
    two, _, _ = train(table, dense, QUICK)
    one.save(tmp_path / "one.json")
    two.save(tmp_path / "two.json")
    assert (tmp_path / "one.json").read_bytes() == (tmp_path / "two.json").read_bytes()
    assert len(folds) == OUTER_FOLDS and final.results
    quality = QualityPredictor.load(tmp_path / "one.json").predict_dense(dense)
    assert ((quality >= 0) & (quality <= 1)).all()


@pytest.mark.parametrize("recipe", QUICK)
def test_every_family_gives_qualities(
    table: QualityTable, dense: np.ndarray, recipe: Recipe
) -> None:
    basis = fit_basis(table, np.arange(len(table)), dense)
    predictor = fit(table, basis, recipe)
    quality = predictor.predict_dense(dense)
    assert quality.shape == (len(table), len(table.models))
    assert ((quality >= 0) & (quality <= 1)).all()
    assert basis.tasks == ("arc_challenge", "arena_chat", "mbpp", "mmlu")


def test_sweep_oracle_and_single_model() -> None:
    # Two rows, two models: the cheap one is right on the first row only.
    quality = np.array([[1.0, 1.0], [1.0, 0.0]])
    cost = np.array([[1.0, 0.1], [1.0, 0.1]])
    mean_cost = cost.mean(axis=0)
    oracle = sweep(quality, quality, cost, mean_cost, strong=0)
    assert oracle.saving_at(1.0) == pytest.approx(0.45)  # cheap on row 1 only
    assert oracle.saving_at(0.5) == pytest.approx(0.9)
    assert np.isnan(sweep(quality[:, ::-1], quality, cost, mean_cost, 0).saving_at(1.0))
    assert best_single(quality, cost, strong=0, target=0.5) == 1
    assert best_single(quality, cost, strong=0) == 0
    assert single_point(quality, cost, 1, 0) == pytest.approx((0.5, 0.9))


def test_hindsight_single_is_chosen_on_the_test_rows() -> None:
    """The best single model from the training rows is the honest reference; the one in
    hindsight (the issue's "for scale" figure) may qualify on the test rows alone."""
    cost = np.array([[1.0, 0.1]] * 4)
    train_quality = np.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    test_quality = np.array([[1.0, 1.0]] * 4)
    result = judge("quiz", test_quality, test_quality, cost, train_quality, cost, ("s", "c"), 0)
    assert (result.single, result.single_saving) == ("s", 0.0)
    assert result.hindsight == "c"
    assert (result.hindsight_quality, result.hindsight_saving) == pytest.approx((1.0, 0.9))


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cascade-gateway")
    add_router_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def test_train_and_eval_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_data(tmp_path / "data", rows=20)
    out = tmp_path / "quality.json"
    assert run(["router", "train-quality", "--data", str(data), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Nested cross-validation" in printed and "| arc_challenge |" in printed
    assert "best single in hindsight" in printed
    card = out.with_suffix(".card.md").read_text()
    assert "## Final split (judged once)" in card and "mean ± sd" in card
    assert QualityPredictor.load(out).training["datasets"]
    assert run(["router", "eval-quality", "--data", str(data), "--plot", str(tmp_path)]) == 0
    assert (tmp_path / "quality-arc_challenge.png").stat().st_size > 0
    assert run(["router", "eval-quality", "--data", str(tmp_path / "none")]) == 1
