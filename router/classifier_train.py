"""Train the complexity classifier and judge it on prompts it has not seen.

Deterministic: the same data gives a byte-identical model file (fixed solver, no
randomness in the features or the fit, coefficients rounded on save).

    classifier, reports = train(data_dir, out=Path("router/models/classifier.json"))
"""

from __future__ import annotations

import datetime
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
    evaluate,
    length_scores,
    random_curve,
    random_metrics,
    route_curve,
)
from router.features import HASH_FEATURES, RequestFeatures, extract

REGULARISATION_C = 1.0
ROUTERS = ("classifier", "random", "length")


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
