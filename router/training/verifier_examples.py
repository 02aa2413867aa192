"""The verifier's training rows: labelled answers read from the routing data
(``router/data``: GSM8K's weak and strong answers, every RouterBench model's), the
held-out split, and their feature matrix with the optional signals masked or kept.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from router import sandbox
from router.code_examples import ExampleRun
from router.errors import RoutingError
from router.rows import unwrap_response
from router.training.dataset import DATASETS, PromptScores, data_file, open_data
from router.verifier import code_job
from router.verifier_code_features import CODE_RUN_FEATURES
from router.verifier_features import FEATURE_NAMES, Signals, extract_features

GSM8K_STEM = "gsm8k"  # data file stems (``dataset.data_file``)
ROUTERBENCH_STEMS = (
    "routerbench_arc_challenge",
    "routerbench_mbpp",
    "routerbench_winogrande",
)
HELD_OUT_TASK = "routerbench_winogrande"
TEST_FRACTION_BUCKETS = 5  # one bucket in five of each other source is held out
# Signals a route may or may not ask for, unknown (NaN) without: second opinions, and
# the answer's code run against its own examples (`router.sandbox`).
OPTIONAL_SIGNALS: dict[str, tuple[str, ...]] = {
    "opinion": ("sample_agreement", "code_agreement"),
    "code_run": CODE_RUN_FEATURES,
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
    from router.training.classifier_train import FeatureCache, fit_folds, held_out_scores
    from router.training.dataset import load_examples

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


def is_held_out(example: Example) -> bool:
    """Held out of the shipped verifier: the held-out task, and bucket 0 of the rest."""
    return example.source == HELD_OUT_TASK or bucket(example) == 0


def bucket(example: Example) -> int:
    """The example's prompt's split bucket; bucket 0 is held out."""
    return _hash(f"{example.source}:{example.prompt_id}") % TEST_FRACTION_BUCKETS


def _hash(text: str) -> int:
    """A stable small hash (the first byte of SHA-256): splits and pairings by name."""
    return hashlib.sha256(text.encode()).digest()[0]


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
