"""Train the complexity classifier and judge it on prompts it has not seen.

Deterministic: the same data gives a byte-identical model file (fixed solver, no
randomness in the features or the fit, coefficients rounded on save).

    classifier, reports = train(data_dir, out=Path("router/models/classifier.json"))
"""

from __future__ import annotations

import datetime
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse

from router.classifier import Classifier
from router.dataset import Example, Fold, data_fingerprint, evaluation_folds, training_pool
from router.evaluation import (
    Curve,
    Metrics,
    apgr,
    cascade_curve,
    cpt,
    evaluate,
    length_scores,
    random_curve,
    random_metrics,
    route_curve,
)
from router.features import HASH_FEATURES, RequestFeatures, extract

REGULARISATION_C = 1.0
ROUTERS = ("classifier", "random", "length")

# The cascade evaluation: which data files carry the cheap model's answers, and prices.
CASCADE_FILES = {
    "gsm8k": "gsm8k",
    "routerbench_arc_challenge": "arc_challenge",
    "routerbench_mbpp": "mbpp",
    "routerbench_winogrande": "winogrande",
}
WEAK_MODEL = "mistralai/mixtral-8x7b-chat"
STRONG_MODEL = "gpt-4-1106-preview"
# GSM8K rows carry no prices: the cheap call is counted at this fixed fraction of the
# strong one (roughly Mixtral-8x7B vs GPT-4-1106 per-token list prices).
GSM8K_WEAK_COST_RATIO = 1 / 20


@dataclass(frozen=True, slots=True)
class FoldReport:
    """One held-out dataset: its size, the two models' quality, each router's result."""

    name: str
    rows: int
    weak_quality: float
    strong_quality: float
    metrics: Mapping[str, Metrics]
    curves: Mapping[str, Curve]


class FeatureCache:
    """Features of each training prompt, extracted once and shared by all folds."""

    def __init__(self, examples: Sequence[Example]) -> None:
        self._features = {e.id: extract([{"role": "user", "content": e.prompt}]) for e in examples}

    def get(self, example: Example) -> RequestFeatures:
        return self._features[example.id]


def fit(examples: Sequence[Example], cache: FeatureCache) -> Classifier:
    """Logistic regression on the labelled rows (both-wrong rows are left out)."""
    from sklearn.linear_model import LogisticRegression  # only training needs sklearn

    rows = [e for e in examples if e.label is not None]
    features = [cache.get(e) for e in rows]
    dense = np.vstack([f.dense for f in features])
    mean, scale = dense.mean(axis=0), dense.std(axis=0)
    scale[scale < 1e-9] = 1.0  # constant in training (e.g. tools): weight stays 0
    matrix = sparse.hstack([sparse.csr_matrix((dense - mean) / scale), _hashed(features)])
    model = LogisticRegression(C=REGULARISATION_C, solver="lbfgs", max_iter=5000, tol=1e-8)
    model.fit(matrix.tocsr(), [e.label for e in rows], sample_weight=_dataset_weights(rows))
    coef = model.coef_[0]
    fitted = Classifier(
        dense_mean=mean,
        dense_scale=scale,
        dense_coef=coef[: dense.shape[1]],
        hash_coef=coef[dense.shape[1] :],
        intercept=float(model.intercept_[0]),
        training=_summary(rows),
    )
    # What ships is the rounded JSON, so judge and return exactly that.
    return Classifier.from_dict(fitted.to_dict())


def run_evaluation(examples: Sequence[Example], cache: FeatureCache) -> list[FoldReport]:
    return [_judge(fold, fit(fold.train, cache)) for fold in evaluation_folds(examples)]


def train(data_dir: Path | None, out: Path, examples: Sequence[Example]) -> list[FoldReport]:
    """Fit the shipped model on the training pool, evaluate the recipe, write both files."""
    cache = FeatureCache(examples)
    classifier = fit(training_pool(examples), cache)
    training = {**classifier.training, "data_sha256": data_fingerprint(data_dir)}
    classifier = Classifier.from_dict({**classifier.to_dict(), "training": training})
    classifier.save(out)
    reports = run_evaluation(examples, cache)
    out.with_suffix(".card.md").write_text(model_card(classifier, reports), encoding="utf-8")
    return reports


def format_table(reports: Sequence[FoldReport]) -> str:
    lines = [
        "| held-out dataset | rows | weak | strong | router | APGR | CPT(50%) | CPT(80%) |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in reports:
        for router in ROUTERS:
            m = r.metrics[router]
            lines.append(
                f"| {r.name} | {r.rows} | {r.weak_quality:.3f} | {r.strong_quality:.3f} | "
                f"{router} | {m.apgr:.3f} | {m.cpt50:.1%} | {m.cpt80:.1%} |"
            )
    return "\n".join(lines)


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


def run_cascade_evaluation(data_dir: Path | None = None) -> list[CascadeReport]:
    """Score each cheap answer with the shipped verifier, on its held-out rows only."""
    from router.dataset import DEFAULT_DATA_DIR
    from router.verifier import Verifier
    from router.verifier_train import Example as AnswerExample
    from router.verifier_train import is_held_out, unwrap_response

    verifier = Verifier.load()
    directory = data_dir or DEFAULT_DATA_DIR
    reports = []
    for stem, name in CASCADE_FILES.items():
        path = directory / f"{stem}.jsonl"
        if not path.is_file():
            continue
        scores, weak, strong, weak_cost, strong_cost = [], [], [], [], []
        priced = stem != "gsm8k"
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if not line.strip():
                    continue
                row = json.loads(line)
                if priced:
                    cheap, dear = row["models"][WEAK_MODEL], row["models"][STRONG_MODEL]
                    response = unwrap_response(cheap["response"])
                    costs = (float(cheap["cost_usd"]), float(dear["cost_usd"]))
                else:
                    response = row["weak_response"]
                    costs = (GSM8K_WEAK_COST_RATIO, 1.0)
                answer = AnswerExample(stem, row["id"], row["prompt"], response, False)
                if not is_held_out(answer):
                    continue
                scores.append(verifier.score(row["prompt"], response))
                weak.append(bool(row["weak_correct"]))
                strong.append(bool(row["strong_correct"]))
                weak_cost.append(costs[0])
                strong_cost.append(costs[1])
        if not scores:
            continue
        cascade = cascade_curve(scores, weak, strong, weak_cost, strong_cost)
        curve = cascade.curve
        source = "cost_usd" if priced else f"weak = {GSM8K_WEAK_COST_RATIO:.2g} x strong"
        reports.append(
            CascadeReport(
                name,
                len(scores),
                curve.weak_quality,
                curve.strong_quality,
                _cascade_metrics(curve),
                curve,
                cascade.cost,
                source,
            )
        )
    return reports


def format_cascade_table(reports: Sequence[CascadeReport]) -> str:
    """APGR / CPT over escalation share, and the cost at 50% / 80% of the gap recovered."""
    lines = [
        "cascade (verifier): cheap model first, escalate when the shipped verifier scores "
        "its answer below a threshold (11 thresholds at the score deciles); x = escalation "
        "share; only rows the verifier did not train on (verifier_train.is_held_out); cost = "
        "mean cost per query relative to always-strong, cheap call on every row plus strong "
        f"call when escalated (RouterBench: per-row cost_usd of {WEAK_MODEL} / "
        f"{STRONG_MODEL}; GSM8K: no prices, weak = {GSM8K_WEAK_COST_RATIO:.2g} x strong); "
        "nan = the verifier's scores are (nearly) all tied, so the thresholds cannot "
        "spread the escalation share",
        "",
        "| held-out dataset | rows | weak | strong | router | APGR | CPT(50%) | CPT(80%) "
        "| cost@CPT(50%) | cost@CPT(80%) | max escalation (cost) | cost basis |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in reports:
        m = r.metrics
        at50, at80 = (_cost_at(r, share) for share in (m.cpt50, m.cpt80))
        lines.append(
            f"| {r.name} | {r.rows} | {r.weak_quality:.3f} | {r.strong_quality:.3f} | "
            f"cascade (verifier) | {m.apgr:.3f} | {m.cpt50:.1%} | {m.cpt80:.1%} | "
            f"{at50:.1%} | {at80:.1%} | {r.curve.share[-1]:.1%} ({r.cost[-1]:.1%}) | "
            f"{r.cost_source} |"
        )
    return "\n".join(lines)


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


def _judge(fold: Fold, classifier: Classifier) -> FoldReport:
    weak = [e.weak_correct for e in fold.test]
    strong = [e.strong_correct for e in fold.test]
    scores = {
        "classifier": [
            classifier.score([{"role": "user", "content": e.prompt}]) for e in fold.test
        ],
        "length": length_scores([e.prompt for e in fold.test]).tolist(),
    }
    metrics = {name: evaluate(s, weak, strong) for name, s in scores.items()}
    curves = {name: route_curve(s, weak, strong) for name, s in scores.items()}
    metrics["random"] = random_metrics(weak, strong)
    curves["random"] = random_curve(weak, strong)
    quality = curves["random"]
    return FoldReport(
        fold.name, len(fold.test), quality.weak_quality, quality.strong_quality, metrics, curves
    )


def _hashed(features: Sequence[RequestFeatures]) -> sparse.csr_matrix:
    indptr = np.cumsum([0] + [len(f.hash_index) for f in features])
    index = np.concatenate([f.hash_index for f in features])
    value = np.concatenate([f.hash_value for f in features])
    return sparse.csr_matrix((value, index, indptr), shape=(len(features), HASH_FEATURES))


def _dataset_weights(rows: Sequence[Example]) -> np.ndarray:
    """Each dataset weighs the same in total, so MMLU's 10k rows do not drown the rest."""
    sizes = Counter(e.dataset for e in rows)
    return np.array([len(rows) / (len(sizes) * sizes[e.dataset]) for e in rows])


def _summary(rows: Sequence[Example]) -> dict[str, object]:
    return {
        "rows": len(rows),
        "positives": sum(e.label or 0 for e in rows),
        "datasets": dict(sorted(Counter(e.dataset for e in rows).items())),
        "model": f"LogisticRegression(C={REGULARISATION_C}, lbfgs), dataset-balanced weights",
    }


def model_card(classifier: Classifier, reports: Sequence[FoldReport]) -> str:
    today = datetime.date.today().isoformat()
    t = classifier.training
    return CARD.format(
        date=today,
        rows=t.get("rows"),
        positives=t.get("positives"),
        datasets=", ".join(f"{k} {v}" for k, v in dict(t.get("datasets", {})).items()),
        model=t.get("model"),
        sha=t.get("data_sha256"),
        table=format_table(reports),
    )


CARD = """# Complexity classifier: model card

Trained {date} by `cascade-gateway router train` (rebuild: the same command; the same
data gives a byte-identical `classifier.json`). Data SHA-256: `{sha}`.

## What it is
{model} over `router/features.py` (feature version in the JSON): ~30 dense
structural features (lengths, turns, system prompt, code / maths / reasoning markers,
multiple-choice shape, non-ASCII share, requested output length, tools, JSON output),
standardised, plus word unigrams and bigrams hashed into 4096 buckets (CRC-32, L2
normalised). The score is P(the request needs the strong model). No embeddings yet.

## Data and label
`../shared/data/routing/` (MMLU, GSM8K, RouterBench ARC-Challenge, Winogrande, MBPP;
weak = Mixtral-8x7B, strong = GPT-4). Label 1 when only the strong model answered
correctly, 0 when the weak one did. Rows both models got wrong are left out of
training: routing them either way gives the same quality, so they say nothing about
when escalating pays, and calling them 1 would teach the model to spend on prompts
nobody answers. They stay in the evaluation. Training rows: {rows} ({positives}
positive): {datasets}.

## Split
- MMLU: 12 of the 40 subjects (those whose SHA-256 first byte mod 10 < 3) are held
  out; the shipped model never saw them. The `mmlu` row below is the shipped model.
- GSM8K, ARC-Challenge, Winogrande, MBPP: leave-one-dataset-out. The row for each is a
  model of the same recipe trained on the pool without that dataset (the shipped model
  trains on all four, so those rows estimate how it does on an unseen kind of task).
- Metrics as RouteLLM's evaluate.py: 11 decile thresholds, trapezoid AUC over the
  strong-call share, CPT by linear interpolation along the curve. Random = mean of 10
  seeds; length = longer prompt first.

## Held-out results
{table}

## Limits
System prompt, tools, `response_format` and `max_tokens` features are constant in this
data (single user prompts), so their weights are 0 until traffic data exists. Prompt
length largely identifies the dataset here; the per-dataset curves are what to trust.
"""
