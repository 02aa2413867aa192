"""Training the embedding classifier (`router.embedding_classifier`):
``cascade-gateway router train --embeddings``.

Logistic regression on the standardised dense features and MiniLM embedding of each
prompt, datasets weighted equally and "both wrong" rows left out, as in the experiment
that measured it (`router/models/embedding-experiment.md`). ``C`` is fixed at 0.01, what
that experiment's grouped cross-validation chose on most folds. The model card judges
the recipe on the same held-out folds as the default classifier, both side by side.

Embedding every prompt takes minutes on a CPU, so the vectors are kept in a cache
directory keyed by the data's fingerprint: a rerun only fits.
"""

from __future__ import annotations

import datetime
import hashlib
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from router import embeddings
from router.embedding_classifier import EmbeddingClassifier
from router.features import DENSE_NAMES
from router.training.classifier_train import (
    ROUTERS,
    FeatureCache,
    FoldReport,
    _dataset_weights,
    format_table,
    run_evaluation,
)
from router.training.dataset import (
    Example,
    data_digest,
    data_fingerprint,
    evaluation_folds,
    training_pool,
)
from router.training.evaluation import evaluate, route_curve, route_intervals

C = 0.01
CACHE_DIR = Path(tempfile.gettempdir()) / "cascade-gateway-embeddings"
EMBEDDING_ROUTERS = (ROUTERS[0], "minilm", *ROUTERS[1:])
Vectors = dict[str, npt.NDArray[np.float32]]

CARD = """# Embedding classifier (all-MiniLM-L6-v2 + the dense features)

Built {date} by `cascade-gateway router train --embeddings`
(`router/training/embedding_classifier_train.py`). A route uses it with `classifier: minilm`;
the default (`features`) is the classifier in `classifier.card.md`.

## Model
Logistic regression (C={c}) on the {dense} standardised dense features of
`router.features` and the 384-d L2-normalised MiniLM embedding of the conversation (its
last {tail} characters, the tokenizer cutting from the left to {tokens} tokens). Datasets
weigh the same in total; rows where neither model is right are left out. Trained on
{rows} prompts ({datasets}); data SHA-256 (first 12 hex digits) `{sha}`.

## Held-out evaluation (same folds as the default classifier)
MMLU: 12 subjects never seen in training; every other dataset: left out entirely.
`classifier` is the default classifier's recipe, `minilm` this one, in the same run.

{table}

## Reading
On these data the embedding does not help: topics and surface form do not tell apart
"only the strong model is right" from "the weak one is right too" on unseen subjects and
tasks. It costs tens of milliseconds per request on a CPU (`python -m
tests.benchmarks.router_latency` reports it next to the default's decision), and about
1 GB of dependencies. Use it when it is retrained on your own labelled traffic and its
card shows a gain there.
"""


def cached_embeddings(
    examples: Sequence[Example], data_dir: Path | None = None, cache_dir: Path = CACHE_DIR
) -> Vectors:
    """Each example's prompt embedding by id (the examples of ``data_dir``), computed once
    per data set and kept under ``cache_dir`` with the ids they belong to (a cache file
    for other rows, or in another order, is recomputed, never trusted)."""
    key = hashlib.sha256(
        f"{data_fingerprint(data_dir)}|{embeddings.TAIL_CHARS}|{embeddings.MAX_TOKENS}".encode()
    ).hexdigest()[:16]
    path = cache_dir / f"minilm-{key}.npz"
    ids = np.array([e.id for e in examples])
    vectors = None
    if path.is_file():
        with np.load(path, allow_pickle=False) as cached:
            if np.array_equal(cached["ids"], ids):
                vectors = cached["vectors"]
    if vectors is None:
        vectors = embeddings.embed([e.prompt for e in examples], batch_size=64)
        cache_dir.mkdir(parents=True, exist_ok=True)
        np.savez(path, ids=ids, vectors=vectors)
    return dict(zip(ids.tolist(), vectors, strict=True))


def design(
    examples: Sequence[Example], cache: FeatureCache, vectors: Vectors
) -> npt.NDArray[np.float64]:
    """One row per example: its dense features, then its embedding."""
    dense = np.vstack([cache.get(e).dense for e in examples])
    emb = np.vstack([vectors[e.id] for e in examples]).astype(np.float64)
    return np.hstack([dense, emb])


def fit(
    examples: Sequence[Example], cache: FeatureCache, vectors: Vectors, c: float = C
) -> EmbeddingClassifier:
    from sklearn.linear_model import LogisticRegression

    rows = [e for e in examples if e.label is not None]
    x = design(rows, cache, vectors)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    model = LogisticRegression(C=c, solver="lbfgs", max_iter=5000, tol=1e-6)
    model.fit((x - mean) / scale, [e.label for e in rows], sample_weight=_dataset_weights(rows))
    fitted = EmbeddingClassifier(
        mean,
        scale,
        model.coef_[0],
        float(model.intercept_[0]),
        {"rows": len(rows), "datasets": _counts(rows), "C": c},
    )
    # What ships is the rounded JSON, so judge and return exactly that.
    return EmbeddingClassifier.from_dict(fitted.to_dict())


def held_out_reports(
    examples: Sequence[Example], cache: FeatureCache, vectors: Vectors
) -> list[FoldReport]:
    """The default classifier's fold reports with this recipe's result added."""
    base = {r.name: r for r in run_evaluation(examples, cache)}
    reports = []
    for fold in evaluation_folds(examples):
        model = fit(fold.train, cache, vectors)
        x = design(fold.test, cache, vectors)
        dense_width = x.shape[1] - embeddings.DIMENSIONS
        scores = [model.score_vectors(row[:dense_width], row[dense_width:]) for row in x]
        weak = [e.weak_correct for e in fold.test]
        strong = [e.strong_correct for e in fold.test]
        b = base[fold.name]
        metrics = {**b.metrics, "minilm": evaluate(scores, weak, strong)}
        curves = {**b.curves, "minilm": route_curve(scores, weak, strong)}
        intervals = {**b.intervals, "minilm": route_intervals(scores, weak, strong)}
        reports.append(replace(b, metrics=metrics, curves=curves, intervals=intervals))
    return reports


def train(
    data_dir: Path | None, out: Path, examples: Sequence[Example], cache_dir: Path = CACHE_DIR
) -> list[FoldReport]:
    """Fit the shipped model on the training pool, judge the recipe, write both files."""
    vectors = cached_embeddings(examples, data_dir, cache_dir)
    cache = FeatureCache(examples)
    pool = training_pool(examples)
    model = fit(pool, cache, vectors)
    training = {**model.training, "data_sha256_12": data_digest(data_dir)}
    model = EmbeddingClassifier.from_dict({**model.to_dict(), "training": training})
    model.save(out)
    reports = held_out_reports(examples, cache, vectors)
    out.with_suffix(".card.md").write_text(
        CARD.format(
            date=datetime.date.today().isoformat(),
            c=C,
            dense=len(DENSE_NAMES),
            tail=embeddings.TAIL_CHARS,
            tokens=embeddings.MAX_TOKENS,
            rows=training["rows"],
            datasets=", ".join(f"{k} {v}" for k, v in training["datasets"].items()),
            sha=training["data_sha256_12"],
            table=format_table(reports, EMBEDDING_ROUTERS),
        ),
        encoding="utf-8",
    )
    return reports


def _counts(rows: Sequence[Example]) -> dict[str, int]:
    return dict(sorted(Counter(e.dataset for e in rows).items()))
