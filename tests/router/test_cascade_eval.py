"""The cascade curve and its cost, checked against a hand-computed example."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from router import cli
from router.training import training_commands, verifier_train
from router.training.cascade_evaluation import (
    CascadeReport,
    _cascade_metrics,
    choose_opinions,
    format_cascade_table,
    run_cascade_evaluation,
)
from router.training.classifier_train import FeatureCache, fit_folds, held_out_scores
from router.training.dataset import (
    DATASETS,
    DEFAULT_DATA_DIR,
    STRONG_MODEL,
    WEAK_MODEL,
    load_examples,
    open_data,
)
from router.training.evaluation import Intervals, Metrics, apgr, cascade_curve, cpt
from router.verifier_features import FEATURE_NAMES

# Four rows; the verifier trusts the cheap answer in ascending order of score.
SCORES = [0.1, 0.2, 0.3, 0.4]
WEAK = [False, False, True, True]
STRONG = [True, True, True, False]
WEAK_COST = [1.0, 1.0, 1.0, 1.0]
STRONG_COST = [10.0, 10.0, 10.0, 10.0]


def test_cascade_curve_by_hand() -> None:
    cascade = cascade_curve(SCORES, WEAK, STRONG, WEAK_COST, STRONG_COST)
    curve = cascade.curve
    # Deciles of [.1, .2, .3, .4] at 0, .1, ..., 1 are .1, .13, .16, .19, .22, .25, .28,
    # .31, .34, .37, .4; escalate = score < threshold, so the escalated counts are
    # 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3.
    np.testing.assert_allclose(
        curve.share, [0, 0.25, 0.25, 0.25, 0.5, 0.5, 0.5, 0.75, 0.75, 0.75, 0.75]
    )
    # Quality: 0 escalated -> weak [0,0,1,1] = .5; 1 -> [1,0,1,1] = .75; 2 or 3 -> 1.0.
    np.testing.assert_allclose(curve.quality, [0.5, 0.75, 0.75, 0.75, 1, 1, 1, 1, 1, 1, 1])
    assert curve.weak_quality == 0.5
    assert curve.strong_quality == 0.75
    # Cost: 4 cheap calls (4) + 10 per escalation, over always-strong (40).
    np.testing.assert_allclose(
        cascade.cost, [0.1, 0.35, 0.35, 0.35, 0.6, 0.6, 0.6, 0.85, 0.85, 0.85, 0.85]
    )


def test_cascade_metrics_by_hand() -> None:
    curve = cascade_curve(SCORES, WEAK, STRONG, WEAK_COST, STRONG_COST).curve
    # Trapezoid over x in [0, .75]: (.5+.75)/2*.25 + (.75+1)/2*.25 + 1*.25 = .625;
    # weak area .375, strong area .5625 -> APGR = .25 / .1875 = 4/3
    # (above 1: the cascade beats always-strong, which is wrong on row 4).
    assert apgr(curve) == pytest.approx(4 / 3)
    # 50% of the gap: quality .625, reached halfway from (0, .5) to (.25, .75).
    assert cpt(curve, 0.5) == pytest.approx(0.125)
    assert cpt(curve, 0.8) == pytest.approx(0.2)


def test_cascade_table_reports_cost_at_cpt_and_ties() -> None:
    cascade = cascade_curve(SCORES, WEAK, STRONG, WEAK_COST, STRONG_COST)
    curve = cascade.curve
    report = CascadeReport(
        "tiny", 4, 0.5, 0.75, _cascade_metrics(curve), curve, cascade.cost, "test"
    )
    table = format_cascade_table([report])
    # cost at CPT(50%) = 12.5% escalation: .1 + .125 * 10 / 10 = 22.5%.
    assert (
        "| tiny | 4 | 0.500 | 0.750 | cascade (verifier) | 1.333 | 12.5% | 20.0% | 22.5% |" in table
    )
    assert "75.0% (85.0%)" in table
    assert table.endswith("| test |  |  |  |  |  |  |")  # built without intervals: empty cells
    nan = float("nan")
    with_intervals = replace(
        report,
        intervals=Intervals((0.9, 1.4), (0.1, 0.25)),
        task_unseen=Metrics(0.612, 0.333, 0.9),
        # Folds' mean ± sd; a fold whose scores all tie (nan) is left out.
        folds=(Metrics(0.6, 0.2, 0.5), Metrics(0.8, 0.4, 0.7), Metrics(nan, nan, nan)),
    )
    assert format_cascade_table([with_intervals]).endswith(
        "| test | 0.900-1.400 | 10.0%-25.0% | 0.612 | 33.3% | 0.700 ± 0.100 | 30.0% ± 10.0% |"
    )

    tied = cascade_curve([0.5] * 4, WEAK, STRONG, WEAK_COST, STRONG_COST)
    assert np.all(tied.curve.share == 0)
    assert np.isnan(_cascade_metrics(tied.curve).apgr)


def _sample_data(source: Path, target: Path, every: int) -> None:
    """Every `every`-th row of each shipped data file (MMLU keeps many subjects), written
    as plain `.jsonl`, the form a user's own `--data` directory has."""
    target.mkdir()
    for path in source.glob("*.jsonl.gz"):
        with open_data(path) as text:
            lines = text.read().splitlines()
        name = path.name.removesuffix(".gz")
        step = every * 10 if name == "mmlu.jsonl" else every
        (target / name).write_text("\n".join(lines[::step]) + "\n", encoding="utf-8")


def test_cascade_evaluation_scores_every_row_out_of_fold(tmp_path: Path) -> None:
    """The eval pipeline end to end on a sample: held-out classifier priors, then every
    cheap answer scored by a verifier trained without its prompt."""
    data = tmp_path / "data"
    _sample_data(DEFAULT_DATA_DIR, data, every=8)
    examples = load_examples(data)
    priors = held_out_scores(fit_folds(examples, FeatureCache(examples)))
    assert {dataset for dataset, _ in priors} == set(DATASETS.values())

    answers = verifier_train.build_examples(data, prompt_scores=priors)
    assert all(a.prompt_score is not None for a in answers)
    assert all(a.samples for a in answers if a.source != "gsm8k")  # a second opinion each
    features = verifier_train.feature_matrix(answers)
    verifiers = verifier_train.fold_verifiers(answers, features)
    judged = [a for a in answers if a.source == "gsm8k" and a.model == "weak"]
    scored = verifier_train.cross_fitted_scores(
        verifiers, judged, verifier_train.feature_matrix(judged)
    )
    assert set(scored) == {("gsm8k", a.prompt_id) for a in judged}
    assert all(0.0 <= s <= 1.0 for s in scored.values())

    reports = run_cascade_evaluation(data, priors)
    plain = {r.name: r for r in reports if not r.second_opinion}
    rows = {p.stem: len(p.read_text().splitlines()) for p in data.glob("*.jsonl")}
    assert plain["gsm8k"].rows == rows["gsm8k"]
    assert plain["winogrande"].rows == rows["routerbench_winogrande"]
    assert all(0.0 <= r.curve.share[0] <= r.curve.share[-1] <= 1.0 for r in reports)
    # Second opinions on RouterBench only, never the cheap or the strong model itself,
    # and their cost on top of the cheap call's.
    opinions = [r for r in reports if r.second_opinion]
    assert {r.name for r in opinions} == {"arc_challenge", "mbpp", "winogrande"}
    assert not {r.second_opinion for r in opinions} & {WEAK_MODEL, STRONG_MODEL}
    for report in opinions:
        assert report.cost[0] > plain[report.name].cost[0]
    # Each cascade's bootstrap interval holds its figure (where the figure is defined),
    # and each is judged a second time by a verifier that never saw the task.
    # And each is judged fold by fold: one figure per prompt fold of the cross-fit.
    for report in reports:
        assert report.task_unseen is not None
        assert report.intervals is not None
        assert len(report.folds) == verifier_train.TEST_FRACTION_BUCKETS
        low, high = report.intervals.apgr
        assert np.isnan(report.metrics.apgr) or low <= report.metrics.apgr <= high


def test_task_verifiers_never_see_their_task() -> None:
    """A task's verifier is the same whatever that task's answers and labels are (it
    trained on the others only); without any code answer, the code signals carry no
    weight; and every answer is scored by its own task's verifier."""
    answers = verifier_train.build_examples(DEFAULT_DATA_DIR, limit=40)
    features = verifier_train.feature_matrix(answers)
    verifiers = verifier_train.task_verifiers(answers, features)
    assert set(verifiers) == {a.source for a in answers}
    mbpp = "routerbench_mbpp"
    flipped = [replace(a, label=not a.label) if a.source == mbpp else a for a in answers]
    again = verifier_train.task_verifiers(flipped, features)
    assert again[mbpp] == verifiers[mbpp]
    assert again["gsm8k"] != verifiers["gsm8k"]  # it did learn from mbpp's labels
    weights = dict(zip(FEATURE_NAMES, verifiers[mbpp].coefficients, strict=True))
    assert weights["code_agreement"] == 0.0 and weights["code_no_function"] == 0.0

    last = {a.source: i for i, a in enumerate(answers)}.values()  # one answer per task
    judged = [answers[i] for i in last]
    scores = verifier_train.task_unseen_scores(verifiers, judged, features[list(last)])
    for i in last:
        row = dict(zip(FEATURE_NAMES, features[i], strict=True))
        expected = verifiers[answers[i].source].score_features(row)
        assert scores[answers[i].source, answers[i].prompt_id] == expected
    assert len(set(scores.values())) == len(scores)


def test_router_eval_prints_the_tables_and_draws_every_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`router eval --plot`: the tables, and a PNG per dataset with the cascades drawn
    (the best second opinion labelled as picked on those rows)."""
    data, plots = tmp_path / "data", tmp_path / "plots"
    _sample_data(DEFAULT_DATA_DIR, data, every=8)
    assert cli.main(["eval", "--data", str(data), "--plot", str(plots)]) == 0
    printed = capsys.readouterr().out
    assert "| mmlu |" in printed and "| classifier |" in printed
    assert "cascade + 2nd opinion" in printed
    # the held-out table, the unseen MMLU subject groups' and the cascades'
    assert printed.count("| APGR 90% CI | CPT(50%) 90% CI |") == 3
    assert "| mmlu-subjects-0 |" in printed and "| mmlu-subjects-2 |" in printed
    for name in DATASETS.values():
        assert (plots / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    reports = run_cascade_evaluation(data)
    [plain, chosen] = training_commands._cascade_lines(reports, "arc_challenge")
    assert plain.startswith("cascade (verifier, ")
    assert chosen.startswith("cascade + ") and chosen.endswith("(chosen on other tasks)")
    # No answers in the data: no cascade.
    assert training_commands._cascade_lines(reports, "mmlu") == {}


def _opinion(name: str, model: str, value: float) -> CascadeReport:
    cascade = cascade_curve(SCORES, WEAK, STRONG, WEAK_COST, STRONG_COST)
    metrics = Metrics(value, 0.1, 0.2)
    return CascadeReport(name, 4, 0.5, 0.75, metrics, cascade.curve, cascade.cost, "t", model)


def test_each_dataset_gets_the_opinion_best_on_the_other_datasets() -> None:
    """Not the best on its own rows: "x" wins on arc but loses on the others, so the
    held-out choice for arc is "y"; for the others, arc's and the third's mean decides."""
    reports = [
        _opinion("arc", "x", 0.9),
        _opinion("arc", "y", 0.6),
        _opinion("wino", "x", 0.5),
        _opinion("wino", "y", 0.7),
        _opinion("mbpp", "x", 0.5),
        _opinion("mbpp", "y", 0.6),
    ]
    chosen = {(r.name, r.second_opinion) for r in choose_opinions(reports) if r.chosen_elsewhere}
    # wino: x on the others 0.70, y 0.60 -> x; mbpp: x 0.70, y 0.65 -> x; arc: x 0.5, y 0.65 -> y
    assert chosen == {("arc", "y"), ("wino", "x"), ("mbpp", "x")}
    assert "(chosen on the other tasks)" in format_cascade_table(choose_opinions(reports))
