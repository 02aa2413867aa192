"""Experiment: do MiniLM sentence embeddings help the complexity classifier on held-out data?

    python -m router.training.embedding_experiment            # prints the table and the timings

Same held-out folds and metrics as `router.training.classifier_train` (MMLU: unseen subjects;
the others: leave-one-dataset-out). Compared routers, all logistic regression with the
shipped recipe's dataset-balanced weights and "both wrong" rows left out of training:

- classifier: the current recipe (dense + hashed n-grams, C=1), as in the model card;
- dense+emb: the ~30 standardised dense features plus the 384-d embedding (standardised);
- emb: the embedding alone;
- length: longer prompt first; random: mean of 10 seeds.

C for dense+emb and emb is chosen per evaluation fold by grouped 3-fold CV inside that
fold's training rows only (groups: MMLU subject, or the whole dataset for the others;
criterion: APGR per dataset in the validation part, averaged). The held-out rows are
never used for any choice. Embeddings are cached (the trainer's `cached_embeddings`,
keyed by the data fingerprint and the truncation settings), so they are computed once.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from router import embeddings
from router.training.classifier_train import (
    FeatureCache,
    FoldReport,
    _dataset_weights,
    format_table,
    run_evaluation,
)
from router.training.dataset import Example, Fold, evaluation_folds, load_examples
from router.training.embedding_classifier_train import CACHE_DIR, cached_embeddings
from router.training.evaluation import Curve, Metrics, evaluate, route_curve

C_GRID = (0.01, 0.1, 1.0)
CV_SPLITS = 3
THREADS = 2
ROUTERS = ("classifier", "dense+emb", "emb", "random", "length")
Matrix = npt.NDArray[np.float64]


class Design:
    """Builds the feature matrix of a feature set ("dense+emb" or "emb") for examples."""

    def __init__(self, cache: FeatureCache, vectors: dict[str, npt.NDArray[np.float32]]):
        self._cache = cache
        self._vectors = vectors

    def matrix(self, examples: Sequence[Example], kind: str) -> Matrix:
        emb = np.vstack([self._vectors[e.id] for e in examples]).astype(np.float64)
        if kind == "emb":
            return emb
        dense = np.vstack([self._cache.get(e).dense for e in examples])
        return np.hstack([dense, emb])


def fit_scores(
    train: Sequence[Example], test: Sequence[Example], design: Design, kind: str, c: float
) -> Matrix:
    """P(needs strong) for `test` from a model fitted on the labelled rows of `train`."""
    from sklearn.linear_model import LogisticRegression

    rows = [e for e in train if e.label is not None]
    x = design.matrix(rows, kind)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    model = LogisticRegression(C=c, solver="lbfgs", max_iter=5000, tol=1e-4)
    model.fit((x - mean) / scale, [e.label for e in rows], sample_weight=_dataset_weights(rows))
    probabilities: Matrix = model.predict_proba((design.matrix(test, kind) - mean) / scale)[:, 1]
    return probabilities


def choose_c(train: Sequence[Example], design: Design, kind: str) -> tuple[float, dict[str, float]]:
    """C with the best grouped-CV APGR inside `train` (per dataset, then averaged)."""
    from sklearn.model_selection import GroupKFold

    groups = [e.subject if e.dataset == "mmlu" else e.dataset for e in train]
    splits = list(GroupKFold(n_splits=CV_SPLITS).split(np.zeros(len(train)), groups=groups))
    results: dict[str, float] = {}
    for c in C_GRID:
        fold_scores = []
        for fit_index, val_index in splits:
            fit_rows = [train[i] for i in fit_index]
            val_rows = [train[i] for i in val_index]
            scores = fit_scores(fit_rows, val_rows, design, kind, c)
            per_dataset = []
            for name in sorted({e.dataset for e in val_rows}):
                mask = np.array([e.dataset == name for e in val_rows])
                weak = [e.weak_correct for e, m in zip(val_rows, mask, strict=True) if m]
                strong = [e.strong_correct for e, m in zip(val_rows, mask, strict=True) if m]
                if len(weak) >= 20 and sum(weak) != sum(strong):
                    per_dataset.append(evaluate(scores[mask], weak, strong).apgr)
            if per_dataset:
                fold_scores.append(float(np.mean(per_dataset)))
        results[str(c)] = float(np.mean(fold_scores))
    best = max(C_GRID, key=lambda c: results[str(c)])
    return best, results


def judge(fold: Fold, design: Design, kind: str) -> tuple[dict[str, float], float, Metrics, Curve]:
    """CV-chosen C, then fit on the fold's training rows and score its held-out rows."""
    c, cv = choose_c(fold.train, design, kind)
    scores = fit_scores(fold.train, fold.test, design, kind, c)
    weak = [e.weak_correct for e in fold.test]
    strong = [e.strong_correct for e in fold.test]
    return cv, c, evaluate(scores, weak, strong), route_curve(scores, weak, strong)


def single_request_timing(examples: Sequence[Example], count: int = 200) -> dict[str, float]:
    """Milliseconds to embed one prompt (batch of 1), over `count` sampled prompts."""
    rng = np.random.default_rng(0)
    sample = [examples[i].prompt for i in rng.choice(len(examples), size=count, replace=False)]
    embeddings.embed(sample[:5], batch_size=1)  # warm-up
    times = []
    for prompt in sample:
        start = time.perf_counter()
        embeddings.embed([prompt], batch_size=1)
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {
        "p50_ms": statistics.median(times),
        "p99_ms": times[int(0.99 * (len(times) - 1))],
        "mean_ms": statistics.fmean(times),
    }


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    examples = load_examples()
    vectors = cached_embeddings(examples)
    cache = FeatureCache(examples)
    design = Design(cache, vectors)
    base = {r.name: r for r in run_evaluation(examples, cache)}
    reports: list[FoldReport] = []
    chosen: dict[str, dict[str, object]] = {}
    for fold in evaluation_folds(examples):
        b = base[fold.name]
        metrics, curves = dict(b.metrics), dict(b.curves)
        for kind in ("dense+emb", "emb"):
            cv, c, m, curve = judge(fold, design, kind)
            metrics[kind], curves[kind] = m, curve
            chosen.setdefault(fold.name, {})[kind] = {"C": c, "cv_apgr": cv}
        reports.append(replace(b, metrics=metrics, curves=curves))
    print(_table(reports))
    print(json.dumps(chosen, indent=1))
    embeddings.load(THREADS)
    timing = single_request_timing(examples)
    print(f"single-request embedding (threads={THREADS}): {timing}")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    (CACHE_DIR / "results.json").write_text(
        json.dumps(
            {
                "apgr": {r.name: {k: r.metrics[k].apgr for k in ROUTERS} for r in reports},
                "chosen": chosen,
                "timing": timing,
            },
            indent=1,
        ),
        encoding="utf-8",
    )


def _table(reports: Sequence[FoldReport]) -> str:
    return format_table(reports, ROUTERS)


if __name__ == "__main__":
    main()
