"""The labelled routing data and its fixed train / held-out split.

Each row of `router/data/*.jsonl.gz` (the data the package ships, gzip-compressed; a
directory given instead may hold plain `*.jsonl`) is a prompt with whether the weak model
(Mixtral-8x7B) and the strong model (GPT-4) answered it correctly. The label is 1 when
only the strong model was right: that is the only case where paying for the strong
model changes the answer. "Weak right, strong wrong" is 0 (the weak model suffices).
"Both wrong" rows have no label: either choice gives the same quality, and labelling
them 1 would teach "hard" rather than "worth escalating" (spending on prompts nobody
answers); the classifier's gain regression counts them as a gain of 0. Every row stays
in the evaluation, which measures quality, not labels.

The split never lets a model see a prompt it is judged on:
- MMLU: ~30% of the subjects (by a fixed hash of the subject name) are held out;
- every other dataset (GSM8K and the RouterBench tasks) is evaluated leave-one-out:
  the model judged on it was trained on everything else in the training pool;
- choices made while training (`selection_folds`) split a training set further, so
  they never see the rows the model is judged on.

    examples = load_examples()
    for fold in evaluation_folds(examples): ...
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from router.errors import RoutingError

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1] / "data"  # router/data, package data
COMPRESSED = ".gz"  # a data file `STEM.jsonl` may be stored as `STEM.jsonl.gz`

# The pair the labels compare (RouterBench rows name every model they carry).
WEAK_MODEL = "mistralai/mixtral-8x7b-chat"
STRONG_MODEL = "gpt-4-1106-preview"

# File stem -> dataset name used in reports.
DATASETS = {
    "mmlu": "mmlu",
    "gsm8k": "gsm8k",
    "routerbench_arc_challenge": "arc_challenge",
    "routerbench_winogrande": "winogrande",
    "routerbench_mbpp": "mbpp",
}
# (dataset name, prompt id) -> the classifier's score from a model that never saw it
PromptScores = Mapping[tuple[str, str], float]
MMLU_HELD_OUT_BUCKETS = 3  # of 10: subjects whose hash bucket is below this are held out
MMLU_SELECTION_GROUPS = 3  # model selection: MMLU training subjects in this many groups


@dataclass(frozen=True, slots=True)
class Example:
    """One labelled prompt."""

    id: str
    dataset: str
    subject: str
    prompt: str
    weak_correct: bool
    strong_correct: bool
    # How much the prompt gains from the strong model: strong - weak correctness, or,
    # where the data has a pool of cheaper models' answers (RouterBench), strong minus
    # the pool's mean (``pooled_gains``): a graded, far less noisy figure than one pair.
    gain: float = 0.0

    @property
    def label(self) -> int | None:
        """1: needs the strong model; 0: the weak one suffices; None: both wrong."""
        if not self.weak_correct and not self.strong_correct:
            return None
        return int(self.strong_correct and not self.weak_correct)


@dataclass(frozen=True, slots=True)
class Fold:
    """Train on `train`, judge on `test`; the two never share a prompt."""

    name: str
    train: tuple[Example, ...]
    test: tuple[Example, ...]


def load_examples(data_dir: Path | None = None) -> list[Example]:
    """All rows of the known datasets under `data_dir`, in file order."""
    directory = data_dir or DEFAULT_DATA_DIR
    examples: list[Example] = []
    for stem, name in DATASETS.items():
        path = data_file(directory, stem)
        if not path.is_file():
            raise RoutingError(
                f"routing data file {path} is missing; expected {stem}.jsonl or {stem}.jsonl.gz"
            )
        examples += _read(path, name)
    return examples


def data_file(directory: Path, stem: str) -> Path:
    """One dataset's file under ``directory``: ``STEM.jsonl``, else ``STEM.jsonl.gz``
    (as shipped); the plain name when neither is there, for the caller's message."""
    plain = directory / f"{stem}.jsonl"
    packed = plain.with_name(plain.name + COMPRESSED)
    return packed if not plain.is_file() and packed.is_file() else plain


def open_data(path: Path) -> IO[str]:
    """A data file's lines as text, a gzip one decompressed on the way."""
    if path.suffix == COMPRESSED:
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def data_bytes(path: Path) -> bytes:
    """A data file's content, decompressed: what digests are taken over, so a digest
    does not depend on how the file is stored."""
    raw = path.read_bytes()
    return gzip.decompress(raw) if path.suffix == COMPRESSED else raw


def data_fingerprint(data_dir: Path | None = None) -> str:
    """SHA-256 over the dataset files' content (hex): what derived caches are keyed on."""
    directory = data_dir or DEFAULT_DATA_DIR
    digest = hashlib.sha256()
    for stem in DATASETS:
        digest.update(data_bytes(data_file(directory, stem)))
    return digest.hexdigest()


DATA_DIGEST_DIGITS = 12


def data_digest(data_dir: Path | None = None) -> str:
    """The fingerprint's first ``DATA_DIGEST_DIGITS`` hex digits, as artifacts and cards
    record it: enough to tell data sets apart, and no 64-digit string that secret
    scanners take for a key."""
    return data_fingerprint(data_dir)[:DATA_DIGEST_DIGITS]


def is_held_out_subject(subject: str) -> bool:
    bucket = hashlib.sha256(subject.encode()).digest()[0] % 10
    return bucket < MMLU_HELD_OUT_BUCKETS


def training_pool(examples: Sequence[Example]) -> tuple[Example, ...]:
    """What the shipped model trains on: everything but the held-out MMLU subjects."""
    return tuple(
        e for e in examples if not (e.dataset == "mmlu" and is_held_out_subject(e.subject))
    )


def evaluation_folds(examples: Sequence[Example]) -> list[Fold]:
    """One fold per dataset; MMLU's tests the shipped recipe on unseen subjects."""
    pool = training_pool(examples)
    held_out = tuple(e for e in examples if e.dataset == "mmlu" and is_held_out_subject(e.subject))
    folds = [Fold("mmlu", pool, held_out)]
    for name in DATASETS.values():
        if name != "mmlu":
            train = tuple(e for e in pool if e.dataset != name)
            test = tuple(e for e in pool if e.dataset == name)
            folds.append(Fold(name, train, test))
    return folds


def selection_folds(train: Sequence[Example]) -> list[Fold]:
    """Folds inside a training set, for choosing a recipe without touching held-out rows:
    each non-MMLU dataset left out in turn, and MMLU's subjects in `MMLU_SELECTION_GROUPS`
    groups (by a second byte of the subject hash) left out in turn."""
    folds = []
    for name in DATASETS.values():
        if name == "mmlu":
            continue
        test = tuple(e for e in train if e.dataset == name)
        if test:
            folds.append(Fold(name, tuple(e for e in train if e.dataset != name), test))
    return folds + subject_folds(train)


def subject_folds(train: Sequence[Example]) -> list[Fold]:
    """MMLU's subjects in `train` in `MMLU_SELECTION_GROUPS` groups (by a second byte of
    the subject hash), each left out in turn: more draws of "subjects never seen" than
    the one held-out set, to tell a figure that one subject carries from the rule."""
    folds = []
    for group in range(MMLU_SELECTION_GROUPS):
        test = tuple(e for e in train if e.dataset == "mmlu" and _subject_group(e) == group)
        if test:
            rest = tuple(
                e for e in train if not (e.dataset == "mmlu" and _subject_group(e) == group)
            )
            folds.append(Fold(f"mmlu-subjects-{group}", rest, test))
    return folds


def _subject_group(example: Example) -> int:
    return hashlib.sha256(example.subject.encode()).digest()[1] % MMLU_SELECTION_GROUPS


def _read(path: Path, dataset: str) -> list[Example]:
    rows, examples = [], []
    with open_data(path) as lines:
        for number, line in enumerate(lines, start=1):
            try:
                row = json.loads(line)
                weak, strong = bool(row["weak_correct"]), bool(row["strong_correct"])
                examples.append(
                    Example(
                        id=str(row["id"]),
                        dataset=dataset,
                        subject=str(row.get("subject", dataset)),
                        prompt=str(row["prompt"]),
                        weak_correct=weak,
                        strong_correct=strong,
                        gain=float(strong) - float(weak),
                    )
                )
                rows.append(row)
            except (ValueError, KeyError, TypeError) as exc:
                raise RoutingError(
                    f"{path}:{number}: expected a JSON object with id, prompt, weak_correct "
                    f"and strong_correct ({exc})"
                ) from exc
    gains = pooled_gains(rows)
    return [replace(e, gain=gains.get(e.id, e.gain)) for e in examples]


def cheap_pool(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The models of a RouterBench file that cost under half the strong model over its
    rows, the strong one excluded: the cheaper alternatives a router weighs it against
    (a model as dear as the strong one is no saving)."""
    names = {name for row in rows for name in row.get("models", {})} - {STRONG_MODEL}
    if not rows or any(STRONG_MODEL not in row.get("models", {}) for row in rows):
        return []
    strong = sum(float(row["models"][STRONG_MODEL]["cost_usd"]) for row in rows)
    return sorted(
        name
        for name in names
        if sum(float(row["models"].get(name, {}).get("cost_usd", 0.0)) for row in rows) < strong / 2
    )


def pooled_gains(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """id -> the strong model's correctness minus the cheap pool's mean correctness, for
    rows that carry every model's answers; empty when the file has none."""
    pool = cheap_pool(rows)
    if not pool:
        return {}
    gains = {}
    for row in rows:
        models = row["models"]
        scores = [float(models[name]["correct"]) for name in pool if name in models]
        if scores:
            strong = float(models[STRONG_MODEL]["correct"])
            gains[str(row["id"])] = strong - sum(scores) / len(scores)
    return gains
