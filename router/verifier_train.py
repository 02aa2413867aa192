"""Training for the cascade verifier (``router.verifier``).

Rows come from the routing data (``router/data``): each GSM8K prompt gives two answers (the weak
and the strong model's, labelled by correctness) and each RouterBench prompt gives
eleven (every model's response, acceptable when ``correct >= 0.5``). The model is a
logistic regression on ``FEATURE_NAMES``; features the data cannot teach (logprobs,
``finish_reason``, requested JSON) get fixed prior weights instead.

Held out, never trained on: one whole RouterBench task (``HELD_OUT_TASK``) and a fixed
fifth of every other source's prompts, chosen by a hash of the prompt id. All answers
to a prompt land on the same side.

The open-ended model (``router.open_verifier``, the artifact's ``open_ended`` section)
is trained by ``router.open_verifier_train`` on the graded arena chat answers; ``main``
with ``open_only`` retrains that section alone, keeping the closed-form part.

Rebuild with ``cascade-gateway router train-verifier`` (which calls ``main``).
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import itertools
import json
import logging
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from router import open_evaluation, open_verifier_train, sandbox
from router.artifacts import DEFAULTS_LINK, read_artifact
from router.code_examples import ExampleRun
from router.dataset import DATASETS, DEFAULT_DATA_DIR, PromptScores, data_file, open_data
from router.errors import RoutingError
from router.verifier import (
    ARTIFACT_FORMAT,
    CODE_RUN_FEATURES,
    DEFAULT_PATH,
    FEATURE_NAMES,
    Signals,
    Verifier,
    code_job,
    extract_features,
)

log = logging.getLogger(__name__)

_BUILT = re.compile(r"Built (\d{4}-\d\d-\d\d) by")  # the card's date of the closed-form part
GSM8K_STEM = "gsm8k"  # data file stems (``dataset.data_file``)
ROUTERBENCH_STEMS = (
    "routerbench_arc_challenge",
    "routerbench_mbpp",
    "routerbench_winogrande",
)
HELD_OUT_TASK = "routerbench_winogrande"
TEST_FRACTION_BUCKETS = 5  # one bucket in five of each other source is held out
ACCEPT_THRESHOLD = 0.5
REPORT_THRESHOLDS = (0.5, 0.7)
REGULARISATION_C = 1.0
SIGNIFICANT_DIGITS = 6

# Features the training data never shows (no logprobs, no finish_reason, no JSON
# requests), so their weights are set by hand, in logits per unit of the raw feature.
PROMPT_PRIOR = "prompt_difficulty"
# Signals a route may or may not ask for, unknown (NaN) without: second opinions, and
# the answer's code run against its own examples (`router.sandbox`).
OPTIONAL_SIGNALS: dict[str, tuple[str, ...]] = {
    "opinion": ("sample_agreement", "code_agreement"),
    "code_run": CODE_RUN_FEATURES,
}
# How ``evaluate`` names the rows that carry each optional signal, without and with it.
EVALUATED_SIGNALS = {"opinion": ("comparable", "+opinion"), "code_run": ("ran", "+examples")}
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


@dataclass(frozen=True)
class Example:
    """One labelled answer; ``prompt_id`` keeps a prompt's answers on one side of the split."""

    source: str
    prompt_id: str
    prompt: str
    response: str
    label: bool
    model: str = ""  # who answered: "weak" / "strong" (GSM8K) or the RouterBench model
    prompt_score: float | None = None  # the classifier's, from a model that never saw it
    # A second opinion: another RouterBench model's answer to the same prompt.
    samples: tuple[str, ...] = ()
    code_run: ExampleRun | None = None  # its code run against its own examples


def run_code_examples(examples: Sequence[Example]) -> list[Example]:
    """``examples`` with their code run against its own claims (``verifier.code_job``)
    in the sandbox, one per CPU: about 50 s for the shipped data's 3,000 on 12 cores."""
    runs = sandbox.run_all([code_job(e.prompt, e.response) for e in examples])
    return [replace(e, code_run=run) for e, run in zip(examples, runs, strict=True)]


def build_examples(
    data_dir: Path, *, limit: int | None = None, prompt_scores: PromptScores | None = None
) -> list[Example]:
    """Labelled answers from the data, in a fixed order (``limit`` prompts per file),
    each with its prompt's held-out classifier score when ``prompt_scores`` has it."""
    examples = list(_gsm8k_examples(data_file(data_dir, GSM8K_STEM), limit))
    for stem in ROUTERBENCH_STEMS:
        examples += _routerbench_examples(data_file(data_dir, stem), stem, limit)
    scores = prompt_scores or {}
    return [
        replace(e, prompt_score=scores.get((DATASETS[e.source], e.prompt_id))) for e in examples
    ]


def held_out_prompt_scores(data_dir: Path) -> dict[tuple[str, str], float]:
    """The classifier's score of every prompt by a classifier trained without its dataset
    (as ``router eval`` judges it), so the verifier learns how much to trust a score it
    will meet on unseen tasks, not one that memorised these."""
    from router.classifier_train import FeatureCache, fit_folds, held_out_scores
    from router.dataset import load_examples

    examples = load_examples(data_dir)
    return held_out_scores(fit_folds(examples, FeatureCache(examples)))


def _read_rows(path: Path, limit: int | None) -> list[dict[str, Any]]:
    try:
        with open_data(path) as text:
            lines = text.read().splitlines()
    except OSError as exc:
        raise RoutingError(f"cannot read training data {path}: {exc}") from exc
    rows = sorted((json.loads(line) for line in lines if line.strip()), key=lambda r: r["id"])
    return rows[:limit] if limit is not None else rows


def _gsm8k_examples(path: Path, limit: int | None) -> Iterator[Example]:
    for row in _read_rows(path, limit):
        for side in ("weak", "strong"):
            response = row[f"{side}_response"]
            label = bool(row[f"{side}_correct"])
            yield Example("gsm8k", row["id"], row["prompt"], response, label, side)


def _routerbench_examples(path: Path, source: str, limit: int | None) -> Iterator[Example]:
    """Every model's answer, each with one other model's answer as its second opinion
    (picked by a hash of the prompt and the model: fixed from run to run, and spread
    over the other models about evenly)."""
    for row in _read_rows(path, limit):
        names = sorted(row["models"])
        responses = {name: unwrap_response(row["models"][name]["response"]) for name in names}
        for name in names:
            others = [other for other in names if other != name]
            second = others[_hash(f"{source}:{row['id']}:{name}") % len(others)] if others else None
            yield Example(
                source,
                row["id"],
                row["prompt"],
                responses[name],
                row["models"][name]["correct"] >= 0.5,
                name,
                samples=(responses[second],) if second else (),
            )


def second_opinion(example: Example, response: str | None) -> Example:
    """``example`` with ``response`` (another model's answer, or None: no opinion) as
    its only second opinion."""
    return replace(example, samples=(response,) if response is not None else ())


def unwrap_response(raw: str) -> str:
    """RouterBench stores each response as the repr of a one-string list."""
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw
    if isinstance(value, list):
        return "".join(str(part) for part in value)
    return str(value)


def is_held_out(example: Example) -> bool:
    """Held out of the shipped verifier: the held-out task, and bucket 0 of the rest."""
    return example.source == HELD_OUT_TASK or _bucket(example) == 0


def _bucket(example: Example) -> int:
    return _hash(f"{example.source}:{example.prompt_id}") % TEST_FRACTION_BUCKETS


def _hash(text: str) -> int:
    """A stable small hash (the first byte of SHA-256): splits and pairings by name."""
    return hashlib.sha256(text.encode()).digest()[0]


def fold_verifiers(examples: Sequence[Example], features: NDArray[np.float64]) -> list[Verifier]:
    """Verifiers of the shipped recipe, the k-th trained on every bucket but k (never on
    the held-out task): ``cross_fitted_scores`` judges each prompt by one that never saw it."""
    buckets = np.array([_bucket(e) for e in examples])
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
        lambda e: verifiers[0 if e.source == HELD_OUT_TASK else _bucket(e)], examples, features
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


def feature_matrix(examples: Sequence[Example]) -> NDArray[np.float64]:
    rows = [list(extract_features(e.prompt, e.response, _signals(e)).values()) for e in examples]
    # NaN where a prompt has no classifier score, or an answer no second opinion to
    # compare with: neutral, as in serving (score_features).
    return np.asarray(rows, dtype=np.float64).reshape(len(examples), len(FEATURE_NAMES))


def _signals(example: Example) -> Signals:
    return Signals(
        prompt_score=example.prompt_score, samples=example.samples, code_run=example.code_run
    )


def has_signal(features: NDArray[np.float64], signal: str) -> NDArray[np.bool_]:
    """Which rows carry the optional ``signal`` (``OPTIONAL_SIGNALS``)."""
    columns = [FEATURE_NAMES.index(name) for name in OPTIONAL_SIGNALS[signal]]
    return np.asarray(~np.isnan(features[:, columns]).all(axis=1), dtype=np.bool_)


def with_signals(features: NDArray[np.float64], kept: Iterable[str] = ()) -> NDArray[np.float64]:
    """``features`` as a route asking only for the optional signals ``kept``: the other
    optional columns unknown (NaN)."""
    rows = features.copy()
    for signal, names in OPTIONAL_SIGNALS.items():
        if signal not in kept:
            rows[:, [FEATURE_NAMES.index(name) for name in names]] = np.nan
    return rows


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
        coefficients=tuple(_round(coefficients[n]) for n in FEATURE_NAMES),
        intercept=_round(float(model.intercept_[0])),
        means=tuple(_round(stats[n][0]) for n in FEATURE_NAMES),
        scales=tuple(_round(stats[n][1]) for n in FEATURE_NAMES),
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


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def evaluate(
    verifier: Verifier, examples: Sequence[Example], features: NDArray[np.float64]
) -> dict[str, dict[str, float]]:
    """Held-out ROC-AUC and accept precision, per source and pooled: without second
    opinions (as a cascade that asks for none), then, on the answers whose second
    opinion can be compared (final answers or code on both sides), without and with it
    (groups suffixed ``comparable`` and ``comparable +opinion``: the same rows)."""
    alone = with_signals(features)
    report = _metrics(verifier, examples, alone)
    for signal, (suffix, added) in EVALUATED_SIGNALS.items():
        carried = has_signal(features, signal)
        if not carried.any():
            continue
        subset = [e for e, c in zip(examples, carried, strict=True) if c]
        for label, rows in (
            (suffix, alone),
            (f"{suffix} {added}", with_signals(features, [signal])),
        ):
            for group, metrics in _metrics(verifier, subset, rows[carried]).items():
                report[f"{group} {label}"] = metrics
    return report


def _metrics(
    verifier: Verifier, examples: Sequence[Example], features: NDArray[np.float64]
) -> dict[str, dict[str, float]]:
    from sklearn.metrics import roc_auc_score

    scores = np.array(
        [verifier.score_features(dict(zip(FEATURE_NAMES, row, strict=True))) for row in features]
    )
    labels = np.array([e.label for e in examples], dtype=np.int64)
    sources = np.array([e.source for e in examples])
    report: dict[str, dict[str, float]] = {}
    for group in [*sorted(set(sources.tolist())), "all"]:
        mask = np.ones(len(labels), dtype=bool) if group == "all" else sources == group
        y, s = labels[mask], scores[mask]
        metrics = {"n": float(mask.sum()), "positive_rate": _round(float(y.mean()))}
        metrics["roc_auc"] = _round(float(roc_auc_score(y, s))) if 0 < y.sum() < len(y) else 0.5
        for threshold in REPORT_THRESHOLDS:
            accepted = s >= threshold
            metrics[f"accept_share@{threshold}"] = _round(float(accepted.mean()))
            precision = float(y[accepted].mean()) if accepted.any() else 0.0
            metrics[f"accept_precision@{threshold}"] = _round(precision)
        report[group] = metrics
    return report


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
    built = (
        _BUILT.search(card_path(out).read_text(encoding="utf-8"))
        if card_path(out).is_file()
        else None
    )
    _write(artifact, out, built.group(1) if built else None)
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


def card_path(out: Path) -> Path:
    return out.with_name(f"{out.stem}.card.md")


def model_card(artifact: dict[str, Any], built: str | None = None) -> str:
    """The Markdown model card for an artifact returned by ``train``; ``built``: the date
    its closed-form part was built (default today)."""
    training = artifact["training"]
    metrics = artifact["held_out_metrics"]
    header = "| held out | rows | positive rate | ROC-AUC | accept share @0.5 | precision @0.5 | "
    header += "accept share @0.7 | precision @0.7 |\n|---|---|---|---|---|---|---|---|\n"
    table = "".join(
        f"| {group} | {m['n']:.0f} | {m['positive_rate']:.3f} | {m['roc_auc']:.3f} | "
        f"{m['accept_share@0.5']:.3f} | {m['accept_precision@0.5']:.3f} | "
        f"{m['accept_share@0.7']:.3f} | {m['accept_precision@0.7']:.3f} |\n"
        for group, m in sorted(metrics.items(), key=lambda item: _card_order(item[0]))
    )
    weights = "".join(
        f"| {name} | {coef:+.3f} |\n"
        for name, coef in zip(artifact["feature_names"], artifact["coefficients"], strict=True)
    )
    opened = artifact.get("open_ended")
    return (
        CARD_TEMPLATE.format(
            date=built or datetime.date.today().isoformat(),
            open_ended=open_evaluation.card_section(opened) + "\n" if opened else "",
            held_out_task=training["held_out_task"],
            buckets=TEST_FRACTION_BUCKETS,
            train_rows=json.dumps(training["train_rows"]),
            test_rows=json.dumps(training["test_rows"]),
            priors=", ".join(training["prior_coefficients"]),
            table=header + table,
            weights=weights,
        )
        + DEFAULTS_LINK
    )


def _card_order(group: str) -> tuple[int, bool, str]:
    """``evaluate``'s order of its groups (sources, then "all"; rows without the optional
    signals first), which a round trip through the sorted JSON loses."""
    suffixes = [""] + [
        f"{s}{extra}" for s, a in EVALUATED_SIGNALS.values() for extra in ("", f" {a}")
    ]
    source, _, suffix = group.partition(" ")
    rank = suffixes.index(suffix) if suffix in suffixes else len(suffixes)
    return rank, source == "all", source


CARD_TEMPLATE = """# Cascade verifier

Scores how likely a cheap model's answer is acceptable (0..1); the cascade escalates
below the route's threshold. Built {date} by `router/verifier_train.py`.

## Model
For closed-form prompts (open-ended ones: see "Open-ended answers" below), a
logistic regression over cheap text signals (`router.verifier.FEATURE_NAMES`), standardised
with the training means/scales stored in `verifier.json`, then hard caps
(`router.verifier.SCORE_CAPS`: empty answer, invalid requested JSON, schema mismatch,
refusal, `finish_reason == "length"`, maths answer without a number, degenerate loops,
Python whose every function is a placeholder).
Worked maths is checked step by step (`router/arithmetic.py`: every `a op b = c` link and
GSM8K `<<a*b=c>>` annotation is evaluated without `eval`; a wrong step is a strong sign
of a wrong answer); a maths answer that never uses a number of the question, whose
final number no worked step computed, or that answers "how many" with a fraction is
suspect. The training data has no logprobs, `finish_reason` or JSON requests, so these
features carry fixed prior weights, not learned ones: {priors}.

`prompt_difficulty` is the complexity classifier's score of the prompt (logit), the
router's prior: fixed at -0.25 per within-task standard deviation, so the answer's own
signals lead and the prior orders answers whose text says nothing (a bare option letter).
In training each prompt's score comes from a classifier that never saw its dataset;
`router verify` and the gateway's cascade pass the shipped classifier's score.

`sample_agreement` is the share of second opinions (other answers to the same prompt:
another model's, where the route asks for them) whose final answer (`router/answers.py`:
the option letter, the final number) equals this answer's; unknown (neutral) when there
are none or nothing to compare (free text, code). `code_agreement` is, on questions that
ask for code, how alike this answer's code is to the opinions' (mean Jaccard similarity
of token trigrams: right solutions to one task converge, wrong ones wander). Both are
learned: each RouterBench answer is paired with one other model's answer to its prompt
(fixed by a hash), and fitted with and without it, so the same weights serve cascades
with and without second opinions. Below, `comparable` rows are
the answers whose second opinion can be compared (a final answer on multiple choice and
maths, code on code), scored without it, and `comparable +opinion` the same rows scored
with it.

`code_examples_held` and `code_examples_failed_share` come from running a code answer
against the examples it claims (doctests, `print(f(2))  # Output: 4`) in the sandbox
(`router/sandbox.py`: user, network, mount and PID namespaces, read-only mounts,
rlimits, an audit hook; only pass/fail counts come back); unknown (neutral) when not
run: a route switches it on with `run_code_examples: true`, `router verify` with
`--run-code`. Training runs every code answer's examples; an answer fitted with and
without each optional signal it carries (a second opinion, a code run), its weight
shared between the mixes. `ran` rows are the answers with examples that ran, scored
without the run, and `ran +examples` the same rows scored with it.

## Data
`router/data`: GSM8K (weak and strong model answers, labelled by correctness)
and RouterBench ARC-Challenge, MBPP and Winogrande (all 11 models' responses,
acceptable when `correct >= 0.5`). Sources are weighted equally in training.

- train rows: {train_rows}
- held-out rows: {test_rows}

## Split
`{held_out_task}` is held out entirely (a task the model never saw); of every other
source, the prompts whose `sha256(source:id)` first byte is 0 mod {buckets} are held out,
with all answers to a prompt on the same side.

## Held-out metrics
{table}
Precision @t is the share of acceptable answers among those scoring >= t (the answers
the cascade would keep); compare it with the positive rate (keeping everything). The
cascade itself (APGR / CPT over escalation share, with cost, on every row of each
dataset, each scored by a verifier of this recipe trained without its prompt) is in
`cascade-gateway router eval`, and there a second time with each dataset scored by a
verifier trained on the other tasks only ("task unseen": on the only maths and the only
code task, their kind's checks then carry no weight).

## Weights (per standardised feature)
| feature | coefficient |
|---|---|
{weights}
## Limits
The signals judge form, not content: a well-formed wrong answer (a confident wrong
option letter) scores like a right one. Logprob weights are guesses until traffic with
logprobs and outcomes is available. Some checks were designed by reading these answers
(`code_no_function`, `code_lines`: the MBPP answers), so their held-out figures here
are rosier than they will be on other code.

{open_ended}## Rebuild
`cascade-gateway router train-verifier` (or `python -m router.verifier_train`);
training is deterministic and the JSON is byte-identical across runs.
`cascade-gateway router train-verifier --open-only` retrains the open-ended section
alone (a minute or two, no sandbox), keeping the closed-form part and its build date.
"""


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
