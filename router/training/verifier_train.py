"""Training for the cascade verifier (``router.verifier``).

Rows come from the routing data (``router/data``, read by ``router.training.verifier_examples``):
each GSM8K prompt gives two answers (the weak and the strong model's, labelled by
correctness) and each RouterBench prompt gives eleven (every model's response,
acceptable when ``correct >= 0.5``). The model is a logistic regression on
``FEATURE_NAMES``; features the data cannot teach (logprobs, ``finish_reason``,
requested JSON) get fixed prior weights instead.

Held out, never trained on: one whole RouterBench task (``HELD_OUT_TASK``) and a fixed
fifth of every other source's prompts, chosen by a hash of the prompt id. All answers
to a prompt land on the same side.

The open-ended model (``router.open_verifier``, the artifact's ``open_ended`` section)
is trained by ``router.training.open_verifier_train`` on the graded arena chat answers; ``main``
with ``open_only`` retrains that section alone, keeping the closed-form part.

Rebuild with ``cascade-gateway router train-verifier`` (which calls ``main``).
"""

from __future__ import annotations

import itertools
import json
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from router import sandbox
from router.artifacts import read_artifact
from router.errors import RoutingError
from router.training import open_evaluation, open_verifier_train
from router.training.dataset import DEFAULT_DATA_DIR, PromptScores, data_file
from router.training.verifier_examples import (
    HELD_OUT_TASK,
    OPTIONAL_SIGNALS,
    TEST_FRACTION_BUCKETS,
    bucket,
    has_signal,
    held_out_prompt_scores,
    is_held_out,
    with_signals,
)
from router.training.verifier_examples import Example as Example  # re-exported: cascade_evaluation
from router.training.verifier_examples import build_examples as build_examples  # re-exported
from router.training.verifier_examples import feature_matrix as feature_matrix  # re-exported
from router.training.verifier_examples import run_code_examples as run_code_examples  # re-exported
from router.training.verifier_examples import second_opinion as second_opinion  # re-exported
from router.training.verifier_report import built_date, card_path, evaluate, model_card, rounded
from router.verifier import ARTIFACT_FORMAT, DEFAULT_PATH, Verifier
from router.verifier_features import FEATURE_NAMES

log = logging.getLogger(__name__)

ACCEPT_THRESHOLD = 0.5
REGULARISATION_C = 1.0

# Features the training data never shows (no logprobs, no finish_reason, no JSON
# requests), so their weights are set by hand, in logits per unit of the raw feature.
PROMPT_PRIOR = "prompt_difficulty"
PRIOR_COEFFICIENTS: dict[str, float] = {
    "finish_length": -2.0,
    "json_requested": 0.0,
    "json_invalid": -4.0,
    "json_schema_mismatch": -3.0,
    "no_logprobs": 0.0,
    "logprob_mean": 1.5,
    "logprob_min": 0.1,
    "logprob_low_share": -4.0,
    # The classifier's prior, per standard deviation inside a task: a prompt the router
    # thinks needs the strong model needs more evidence from the answer. Small, so the
    # answer's own signals lead and the prior orders answers whose text says nothing
    # (bare option letters score all alike without it). Not learned:
    # the acceptability of 11 models' answers is not the label the classifier predicts
    # (the strong model's gain over the weak one), and the pooled fit's sign flips.
    PROMPT_PRIOR: -0.25,
}


def fold_verifiers(examples: Sequence[Example], features: NDArray[np.float64]) -> list[Verifier]:
    """Verifiers of the shipped recipe, the k-th trained on every bucket but k (never on
    the held-out task): ``cross_fitted_scores`` judges each prompt by one that never saw it."""
    buckets = np.array([bucket(e) for e in examples])
    task = np.array([e.source == HELD_OUT_TASK for e in examples])
    verifiers = []
    for k in range(TEST_FRACTION_BUCKETS):
        train_mask = ~task & (buckets != k)
        verifiers.append(
            fit([e for e, t in zip(examples, train_mask, strict=True) if t], features[train_mask])
        )
    return verifiers


def task_verifiers(
    examples: Sequence[Example], features: NDArray[np.float64]
) -> dict[str, Verifier]:
    """Per source, a verifier of the shipped recipe trained on every other source: how
    the recipe does on a task it never saw (its kind's own signals, maths or code, then
    learned from no example of that kind)."""
    sources = np.array([e.source for e in examples])
    return {
        source: fit(
            [e for e, other in zip(examples, sources != source, strict=True) if other],
            features[sources != source],
        )
        for source in sorted({e.source for e in examples})
    }


def cross_fitted_scores(
    verifiers: Sequence[Verifier], examples: Sequence[Example], features: NDArray[np.float64]
) -> dict[tuple[str, str], float]:
    """Each answer in ``examples`` (one per prompt) scored by a verifier of
    ``fold_verifiers`` that never saw its prompt: bucket k by the k-th, the held-out task
    by the first (bucket 0's, which like the shipped one never saw that task). Every
    answer gets an honest score, so the cascade is judged on all rows, not a fifth."""
    return _scored_by(
        lambda e: verifiers[0 if e.source == HELD_OUT_TASK else bucket(e)], examples, features
    )


def task_unseen_scores(
    verifiers: Mapping[str, Verifier], examples: Sequence[Example], features: NDArray[np.float64]
) -> dict[tuple[str, str], float]:
    """Each answer in ``examples`` scored by the ``task_verifiers`` one that never saw its
    task."""
    return _scored_by(lambda e: verifiers[e.source], examples, features)


def _scored_by(
    judge: Callable[[Example], Verifier],
    examples: Sequence[Example],
    features: NDArray[np.float64],
) -> dict[tuple[str, str], float]:
    """(source, prompt id) -> the score ``judge(example)`` gives the example's features."""
    return {
        (e.source, e.prompt_id): judge(e).score_features(dict(zip(FEATURE_NAMES, row, strict=True)))
        for e, row in zip(examples, features, strict=True)
    }


def signal_variants(
    features: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.float64]]:
    """Each row once per mix of the optional signals it carries (with a second opinion
    and a code run: four rows, from neither to both), so that one set of weights serves
    routes that ask for any of them. Returns the rows, the index of the row each came
    from, and its share of that row's weight."""
    present = {signal: has_signal(features, signal) for signal in OPTIONAL_SIGNALS}
    mixes = [
        set(itertools.compress(OPTIONAL_SIGNALS, keep))
        for keep in itertools.product((True, False), repeat=len(OPTIONAL_SIGNALS))
    ]
    variants = 2.0 ** np.sum(list(present.values()), axis=0)
    rows, origin, share = [], [], []
    for mix in mixes:
        carried = [present[signal] for signal in mix]
        index = np.flatnonzero(np.all(carried, axis=0)) if mix else np.arange(len(features))
        rows.append(with_signals(features[index], mix))
        origin.append(index)
        share.append(1.0 / variants[index])
    return np.vstack(rows), np.concatenate(origin), np.concatenate(share)


def fit(examples: Sequence[Example], features: NDArray[np.float64]) -> Verifier:
    """Logistic regression on the learnable columns, each source weighted equally.

    An answer is fitted once per mix of the optional signals it carries, its weight
    shared between them (``signal_variants``), so the weights serve cascades that ask
    for second opinions or code runs and those that do not (without, those columns are
    unknown: NaN, standardised to 0)."""
    from sklearn.linear_model import LogisticRegression

    learned = [i for i, name in enumerate(FEATURE_NAMES) if name not in PRIOR_COEFFICIENTS]
    rows, origin, share = signal_variants(features)
    weights = _source_weights(examples)[origin] * share
    labels = np.array([e.label for e in examples], dtype=np.int64)[origin]

    columns = rows[:, learned]
    with warnings.catch_warnings():  # a column no answer has (no code trained on): NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(columns, axis=0)
        scales = np.nanstd(columns, axis=0)
    scales[~(scales > 0)] = 1.0
    means[np.isnan(means)] = 0.0
    standardised = np.nan_to_num((columns - means) / scales, nan=0.0)
    model = LogisticRegression(C=REGULARISATION_C, max_iter=2000)
    model.fit(standardised, labels, sample_weight=weights)

    coefficients = dict(PRIOR_COEFFICIENTS)
    stats = {name: (0.0, 1.0) for name in PRIOR_COEFFICIENTS}
    stats[PROMPT_PRIOR] = _within_source_stats(
        examples, features[:, FEATURE_NAMES.index(PROMPT_PRIOR)]
    )
    for j, i in enumerate(learned):
        coefficients[FEATURE_NAMES[i]] = float(model.coef_[0][j])
        stats[FEATURE_NAMES[i]] = (float(means[j]), float(scales[j]))
    return Verifier(
        feature_names=FEATURE_NAMES,
        coefficients=tuple(rounded(coefficients[n]) for n in FEATURE_NAMES),
        intercept=rounded(float(model.intercept_[0])),
        means=tuple(rounded(stats[n][0]) for n in FEATURE_NAMES),
        scales=tuple(rounded(stats[n][1]) for n in FEATURE_NAMES),
        threshold=ACCEPT_THRESHOLD,
    )


def _within_source_stats(
    examples: Sequence[Example], values: NDArray[np.float64]
) -> tuple[float, float]:
    """Mean, and the spread inside one source averaged over sources: the classifier's
    scores differ little between prompts of one task next to between tasks, and it is
    the order inside a task that the prior's weight is meant to act on."""
    known = ~np.isnan(values)  # prompts without a score take no part
    if not known.any():
        return 0.0, 1.0
    sources = np.array([e.source for e in examples])[known]
    values = values[known]
    spread = float(np.mean([values[sources == s].std() for s in np.unique(sources)]))
    return float(values.mean()), spread if spread > 1e-9 else 1.0


def _source_weights(examples: Sequence[Example]) -> NDArray[np.float64]:
    counts: dict[str, int] = {}
    for example in examples:
        counts[example.source] = counts.get(example.source, 0) + 1
    total = len(examples) / len(counts)
    return np.array([total / counts[e.source] for e in examples], dtype=np.float64)


def train(
    data_dir: Path,
    out: Path,
    *,
    limit: int | None = None,
    prompt_scores: PromptScores | None = None,
    run_code: bool = True,
) -> dict[str, Any]:
    """Build, evaluate and write the verifier artifact (and its model card next to it).

    Returns the artifact's contents. ``limit`` caps the prompts read per file (for tests);
    ``prompt_scores`` defaults to ``held_out_prompt_scores(data_dir)``; ``run_code``: run
    the code answers' examples in the sandbox to learn that signal's weights (without,
    they stay 0 and a route's code runs count for nothing).
    """
    if run_code and (reason := sandbox.available()) is not None:
        raise RoutingError(
            f"training runs the code answers' examples in a sandbox, which this host "
            f"cannot provide: {reason} (train without that signal: --no-run-code)"
        )
    # Arena prompts are in no classifier's training data: the shipped one scores them.
    arena_scores = None if prompt_scores is None else _arena_scores(prompt_scores)
    if prompt_scores is None:
        prompt_scores = held_out_prompt_scores(data_dir)
    examples = build_examples(data_dir, limit=limit, prompt_scores=prompt_scores)
    if run_code:
        examples = run_code_examples(examples)
    held_out = np.array([is_held_out(e) for e in examples])
    features = feature_matrix(examples)
    train_set = [e for e, h in zip(examples, held_out, strict=True) if not h]
    test_set = [e for e, h in zip(examples, held_out, strict=True) if h]
    verifier = fit(train_set, features[~held_out])
    artifact = verifier.to_dict()
    artifact["training"] = {
        "held_out_task": HELD_OUT_TASK,
        "train_rows": _counts(train_set),
        "test_rows": _counts(test_set),
        "prior_coefficients": sorted(PRIOR_COEFFICIENTS),
    }
    artifact["held_out_metrics"] = evaluate(verifier, test_set, features[held_out])
    if data_file(data_dir, open_verifier_train.ARENA_STEM).is_file():
        artifact["format"] = ARTIFACT_FORMAT
        artifact["open_ended"] = open_verifier_train.train_section(
            data_dir, verifier, limit=limit, prompt_scores=arena_scores
        )
    _write(artifact, out)
    return artifact


def train_open(data_dir: Path, out: Path) -> dict[str, Any]:
    """Retrain the open-ended section of the artifact at ``out`` (and its card), keeping
    its closed-form part as it is: a minute or two, and no sandbox needed."""
    artifact = read_artifact(out, "verifier artifact")
    closed = Verifier.from_dict(artifact)  # checks the closed-form part is this code's
    artifact["format"] = ARTIFACT_FORMAT
    artifact["open_ended"] = open_verifier_train.train_section(data_dir, closed)
    _write(artifact, out, built_date(out))
    return artifact


def _write(artifact: dict[str, Any], out: Path, built: str | None = None) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(artifact, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    card_path(out).write_text(model_card(artifact, built), encoding="utf-8")


def _arena_scores(prompt_scores: PromptScores) -> dict[str, float]:
    return {pid: s for (dataset, pid), s in prompt_scores.items() if dataset == "arena_chat"}


def _counts(examples: Sequence[Example]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for example in examples:
        counts[example.source] = counts.get(example.source, 0) + 1
    return dict(sorted(counts.items()))


def main(
    data_dir: Path | None = None,
    out: Path | None = None,
    *,
    run_code: bool = True,
    open_only: bool = False,
) -> int:
    """Train the shipped verifier (``open_only``: its open-ended section alone); returns a
    process exit code."""
    out = out or DEFAULT_PATH
    try:
        if open_only:
            artifact = train_open(data_dir or DEFAULT_DATA_DIR, out)
        else:
            artifact = train(data_dir or DEFAULT_DATA_DIR, out, run_code=run_code)
    except RoutingError as exc:
        log.error("%s", exc)
        return 1
    log.info(
        "wrote %s (held-out ROC-AUC %.3f)", out, artifact["held_out_metrics"]["all"]["roc_auc"]
    )
    if "open_ended" in artifact:
        log.info("%s", open_evaluation.format_arena_table(artifact["open_ended"]["evaluation"]))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    raise SystemExit(main())
