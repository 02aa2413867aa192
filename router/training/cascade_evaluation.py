"""Judge the verifier cascade on answers it has not seen: the cheap model's answer to
every prompt scored by a verifier that never saw the prompt, the escalation curve that
follows (quality and cost over the escalation share), with and without a second opinion.

    reports = run_cascade_evaluation(data_dir, prompt_scores)
    print(format_cascade_table(reports))
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from router import sandbox
from router.answers import comparable
from router.rows import unwrap_response
from router.training import verifier_train
from router.training.dataset import (
    DEFAULT_DATA_DIR,
    STRONG_MODEL,
    WEAK_MODEL,
    PromptScores,
    cheap_pool,
    data_file,
    open_data,
)
from router.training.evaluation import (
    INTERVAL_HEADERS,
    Curve,
    Intervals,
    Metrics,
    apgr,
    bootstrap_intervals,
    cascade_curve,
    cpt,
    format_intervals,
)
from router.training.open_evaluation import summary
from router.training.verifier_examples import bucket
from router.verifier import Verifier

# Which data files carry the cheap model's answers, and prices.
CASCADE_FILES = {
    "gsm8k": "gsm8k",
    "routerbench_arc_challenge": "arc_challenge",
    "routerbench_mbpp": "mbpp",
    "routerbench_winogrande": "winogrande",
}
# GSM8K rows carry no prices: the cheap call is counted at this fixed fraction of the
# strong one (roughly Mixtral-8x7B vs GPT-4-1106 per-token list prices).
GSM8K_WEAK_COST_RATIO = 1 / 20


@dataclass(frozen=True, slots=True)
class CascadeReport:
    """The verifier cascade on one dataset's rows the verifier did not train on."""

    name: str
    rows: int
    weak_quality: float
    strong_quality: float
    metrics: Metrics
    curve: Curve
    cost: np.ndarray  # relative to always-strong, aligned with curve.share
    cost_source: str
    second_opinion: str = ""  # the model asked for a second opinion, if any
    # The second opinion this dataset would be given without looking at it: the best
    # by mean APGR on the other datasets (``choose_opinions``).
    chosen_elsewhere: bool = False
    intervals: Intervals | None = None
    # The same cascade, each answer scored by a verifier trained on the other tasks only
    # (``verifier_train.task_verifiers``): what to expect on a task nobody labelled.
    task_unseen: Metrics | None = None
    code_run: bool = False  # the cheap answers' code run against their own examples
    # The same cascade on each prompt fold's rows alone (the cross-fit's folds, each
    # judged by a verifier that never saw them; Winogrande's all by one that never saw
    # the task): the spread between folds.
    folds: tuple[Metrics, ...] = ()


@dataclass(frozen=True, slots=True)
class JudgingVerifiers:
    """The verifiers that judge the held-out answers: one per prompt fold, and one per
    task trained on the other tasks."""

    by_prompt: Sequence[Verifier]
    by_task: Mapping[str, Verifier]


def run_cascade_evaluation(
    data_dir: Path | None = None,
    prompt_scores: PromptScores | None = None,
    *,
    second_opinions: bool = True,
    run_code: bool = True,
) -> list[CascadeReport]:
    """The cheap model's answer to every prompt, scored by a verifier that never saw the
    prompt (``verifier_train.cross_fitted_scores``), and the cascade that follows; then,
    where the data has other models' answers (RouterBench) and ``second_opinions``, the
    same cascade with each such model asked as a second opinion (its cost counted).

    ``prompt_scores`` are the classifier's held-out scores (``held_out_scores``), the
    verifier's prompt-difficulty signal; without them that signal is left neutral.
    ``run_code``: run the code answers' examples in the sandbox (where the host has
    one), and judge those datasets' cascades a second time with the runs."""
    directory = data_dir or DEFAULT_DATA_DIR
    answers = verifier_train.build_examples(directory, prompt_scores=prompt_scores)
    if run_code and sandbox.available() is None:  # else no such rows are shown
        answers = verifier_train.run_code_examples(answers)
    features = verifier_train.feature_matrix(answers)
    verifiers = JudgingVerifiers(
        verifier_train.fold_verifiers(answers, features),
        verifier_train.task_verifiers(answers, features),
    )
    reports = []
    for stem, name in CASCADE_FILES.items():
        path = data_file(directory, stem)
        if not path.is_file():
            continue
        cheap_model = "weak" if stem == "gsm8k" else WEAK_MODEL
        cheap = {e.prompt_id: e for e in answers if e.source == stem and e.model == cheap_model}
        rows = [row for row in _jsonl(path) if row["id"] in cheap]
        if not rows:
            continue
        first = [cheap[row["id"]] for row in rows]
        # Each cascade as a route without code runs, then, where code answers' examples
        # were run, as one with them.
        for code_run in (False, True) if any(a.code_run for a in first) else (False,):
            base = first if code_run else [replace(a, code_run=None) for a in first]
            alone = [verifier_train.second_opinion(a, None) for a in base]
            reports.append(_cascade_report(name, rows, alone, verifiers, None, code_run))
            if stem == "gsm8k" or not second_opinions:
                continue  # GSM8K has no third model's answers
            for opinion in _second_opinion_models(rows):
                judged = [
                    verifier_train.second_opinion(a, _response_of(row, opinion))
                    for a, row in zip(base, rows, strict=True)
                ]
                reports.append(_cascade_report(name, rows, judged, verifiers, opinion, code_run))
    return choose_opinions(reports)


def choose_opinions(reports: Sequence[CascadeReport]) -> list[CascadeReport]:
    """``reports`` with, per dataset, the second opinion an operator would pick without
    its rows marked ``chosen_elsewhere``: the model with the best mean APGR as second
    opinion on the other datasets (so its figure on this one is held out, not the best
    of several picked on the very rows it is judged on)."""
    apgrs: dict[str, dict[str, float]] = {}
    for r in reports:  # chosen as for a route without code runs (every task has that)
        if r.second_opinion and not r.code_run and not np.isnan(r.metrics.apgr):
            apgrs.setdefault(r.second_opinion, {})[r.name] = r.metrics.apgr
    chosen: dict[str, str] = {}
    for name in {r.name for r in reports if r.second_opinion}:
        # Candidates: the models tried on this dataset that were tried elsewhere too.
        elsewhere = {
            model: float(np.mean([v for d, v in by_dataset.items() if d != name]))
            for model, by_dataset in apgrs.items()
            if name in by_dataset and len(by_dataset) > 1
        }
        if elsewhere:
            chosen[name] = max(sorted(elsewhere), key=lambda model: elsewhere[model])
    return [
        replace(r, chosen_elsewhere=True)
        if r.second_opinion and chosen.get(r.name) == r.second_opinion
        else r
        for r in reports
    ]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with open_data(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _second_opinion_models(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The cheap pool (``dataset.cheap_pool``: under half the strong model's cost; a
    second opinion as dear as the strong model defeats the cascade) but the cheap model."""
    return [name for name in cheap_pool(rows) if name != WEAK_MODEL]


def _response_of(row: Mapping[str, Any], model: str) -> str | None:
    answer = row["models"].get(model)
    return unwrap_response(answer["response"]) if answer else None


def _cascade_report(
    name: str,
    rows: Sequence[Mapping[str, Any]],
    judged: Sequence[verifier_train.Example],
    verifiers: JudgingVerifiers,
    opinion: str | None,
    code_run: bool = False,
) -> CascadeReport:
    """The cascade curve of one dataset's rows, each cheap answer in ``judged`` (aligned
    with ``rows``) scored by its cross-fitted verifier; a second opinion's cost is added
    to the cheap call's where the gateway would ask it (answers that can be compared)."""
    features = verifier_train.feature_matrix(judged)
    verified = verifier_train.cross_fitted_scores(verifiers.by_prompt, judged, features)
    unseen = verifier_train.task_unseen_scores(verifiers.by_task, judged, features)
    priced = "models" in rows[0]
    scores, unseen_scores, weak, strong, weak_cost, strong_cost = [], [], [], [], [], []
    for row, answer in zip(rows, judged, strict=True):
        if priced:
            models = row["models"]
            # The gateway asks opinions only where answers can be compared (worth_asking).
            asked = opinion in models and comparable(str(row["prompt"]))
            extra = float(models[opinion]["cost_usd"]) if asked else 0.0
            weak_cost.append(float(models[WEAK_MODEL]["cost_usd"]) + extra)
            strong_cost.append(float(models[STRONG_MODEL]["cost_usd"]))
        else:
            weak_cost.append(GSM8K_WEAK_COST_RATIO)
            strong_cost.append(1.0)
        scores.append(verified[answer.source, answer.prompt_id])
        unseen_scores.append(unseen[answer.source, answer.prompt_id])
        weak.append(bool(row["weak_correct"]))
        strong.append(bool(row["strong_correct"]))
    columns = [
        np.asarray(c, dtype=np.float64) for c in (scores, weak, strong, weak_cost, strong_cost)
    ]
    buckets = np.array([bucket(answer) for answer in judged])
    folds = tuple(
        _cascade_metrics(cascade_curve(*(c[buckets == k] for c in columns)).curve)
        for k in np.unique(buckets)
    )
    cascade = cascade_curve(*columns)
    curve = cascade.curve
    task_unseen = cascade_curve(np.asarray(unseen_scores), *columns[1:]).curve
    source = "cost_usd" if priced else f"weak = {GSM8K_WEAK_COST_RATIO:.2g} x strong"
    return CascadeReport(
        name,
        len(scores),
        curve.weak_quality,
        curve.strong_quality,
        _cascade_metrics(curve),
        curve,
        cascade.cost,
        source,
        opinion or "",
        intervals=bootstrap_intervals(
            lambda i: _cascade_metrics(cascade_curve(*(c[i] for c in columns)).curve), len(scores)
        ),
        task_unseen=_cascade_metrics(task_unseen),
        code_run=code_run,
        folds=folds,
    )


def format_cascade_table(reports: Sequence[CascadeReport]) -> str:
    """APGR / CPT over escalation share, and the cost at 50% / 80% of the gap recovered."""
    lines = [
        "cascade (verifier): cheap model first, escalate when the verifier scores its "
        "answer below a threshold (11 thresholds at the score deciles); x = escalation "
        "share; every row, each scored by a verifier of the shipped recipe that never saw "
        "its prompt (5-fold cross-fit by prompt; winogrande: a task no verifier trained "
        "on); prompt prior = the classifier's held-out score; cost = "
        "mean cost per query relative to always-strong, cheap call on every row plus strong "
        f"call when escalated (RouterBench: per-row cost_usd of {WEAK_MODEL} / "
        f"{STRONG_MODEL}; GSM8K: no prices, weak = {GSM8K_WEAK_COST_RATIO:.2g} x strong); "
        "a 2nd opinion: another model's answer compared on the final answer (option, "
        "number) or on how alike the code is, its cost_usd added on the prompts the "
        "gateway asks it for (multiple choice, maths, code); the one marked was chosen "
        "by its APGR on the other tasks; "
        "task unseen = the same rows scored by a verifier trained on the other tasks only "
        "(on gsm8k and mbpp it has seen no maths or code, so the signals of that kind carry "
        "no weight); "
        "+ examples run = each cheap answer's code run against the examples it claims, "
        "in the sandbox (router.sandbox), as on a route with run_code_examples; "
        "nan = the verifier's scores are (nearly) all tied, so the thresholds cannot "
        "spread the escalation share; "
        "folds = the same cascade on each of the 5 prompt folds' rows alone, mean ± sd",
        "",
        "| held-out dataset | rows | weak | strong | router | APGR | CPT(50%) | CPT(80%) "
        "| cost@CPT(50%) | cost@CPT(80%) | max escalation (cost) | cost basis "
        f"| {INTERVAL_HEADERS} | APGR, task unseen | CPT(50%), task unseen "
        "| APGR, folds | CPT(50%), folds |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in reports:
        m = r.metrics
        at50, at80 = (_cost_at(r, share) for share in (m.cpt50, m.cpt80))
        lines.append(
            f"| {r.name} | {r.rows} | {r.weak_quality:.3f} | {r.strong_quality:.3f} | "
            f"{_cascade_label(r)} | {m.apgr:.3f} | {m.cpt50:.1%} | {m.cpt80:.1%} | "
            f"{at50:.1%} | {at80:.1%} | {r.curve.share[-1]:.1%} ({r.cost[-1]:.1%}) | "
            f"{r.cost_source} | {format_intervals(r.intervals)} | {_task_unseen_cells(r)} | "
            f"{_fold_cells(r.folds)} |"
        )
    return "\n".join(lines)


def _fold_cells(folds: Sequence[Metrics]) -> str:
    """APGR and CPT(50%) over the folds, mean ± sd (a fold whose scores all tie left out)."""
    if not folds:
        return " | "
    apgr_mean, apgr_sd = summary([m.apgr for m in folds])
    cpt_mean, cpt_sd = summary([m.cpt50 for m in folds])
    return f"{apgr_mean:.3f} ± {apgr_sd:.3f} | {cpt_mean:.1%} ± {cpt_sd:.1%}"


def _task_unseen_cells(report: CascadeReport) -> str:
    m = report.task_unseen
    return " | " if m is None else f"{m.apgr:.3f} | {m.cpt50:.1%}"


def _cascade_label(report: CascadeReport) -> str:
    ran = " + examples run" if report.code_run else ""
    if not report.second_opinion:
        return f"cascade (verifier{ran})"
    label = f"cascade{ran} + 2nd opinion {report.second_opinion.split('/')[-1]}"
    return label + " (chosen on the other tasks)" if report.chosen_elsewhere else label


def _cascade_metrics(curve: Curve) -> Metrics:
    """APGR / CPT as for the routers; undefined (nan) when the verifier's scores are all
    tied, so that every threshold escalates the same rows and the curve is one point."""
    if curve.share[-1] == curve.share[0]:
        return Metrics(float("nan"), float("nan"), float("nan"))
    return Metrics(apgr(curve), cpt(curve, 0.5), cpt(curve, 0.8))


def _cost_at(report: CascadeReport, share: float) -> float:
    """Relative cost at an escalation share, interpolated linearly along the curve."""
    if np.isnan(share):
        return float("nan")
    return float(np.interp(share, report.curve.share, report.cost))
