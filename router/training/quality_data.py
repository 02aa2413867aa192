"""The multi-model labelled data the quality predictor learns from, and its splits.

Each row is a prompt with, for each model that answered it, that answer's quality in
[0, 1] and (where the data has it) its cost:

- RouterBench ARC-Challenge / Winogrande / MBPP: 11 models, ``correct`` and ``cost_usd``;
- arena chat: about 13 models, a GPT-4 grade ``score`` of 1-10 read as (score - 1) / 9;
- MMLU and GSM8K: the Mixtral / GPT-4 pair (``weak_correct`` / ``strong_correct``), no cost.

Model names are made canonical (`router.quality.canonical`): the same model under two
names in two files is one column.

The splits group rows by their prompt text (whitespace collapsed, case folded), so a
prompt that appears twice, in one file or in two, is always on one side:

- ``final``: a fixed share of the prompt groups, held out and judged once at the end;
- ``outer_folds`` split the rest for the reported cross-validation;
- ``inner_folds`` split an outer fold's training rows to choose the recipe.

    table = load_table()                 # the shipped router/data by default
    pool, final = final_split(table)
    for train, test in outer_folds(pool): ...
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router.errors import RoutingError
from router.quality import STRONG_MODEL, canonical
from router.training.dataset import (
    DATA_DIGEST_DIGITS,
    DEFAULT_DATA_DIR,
    data_bytes,
    data_file,
    open_data,
)

# File stem -> dataset name used in reports (the RouterBench names as in router.training.dataset).
DATASETS = {
    "routerbench_arc_challenge": "arc_challenge",
    "routerbench_winogrande": "winogrande",
    "routerbench_mbpp": "mbpp",
    "arena_chat": "arena_chat",
    "mmlu": "mmlu",
    "gsm8k": "gsm8k",
}
PAIR_MODELS = ("mistralai/mixtral-8x7b-chat", STRONG_MODEL)  # weak_ / strong_correct
SCORE_RANGE = (1.0, 10.0)  # arena grades; quality = (score - low) / (high - low)
FINAL_BUCKETS = 5  # 1 of this many prompt groups is the final held-out split
OUTER_FOLDS = 5
INNER_FOLDS = 3

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class QualityTable:
    """Rows x models: quality (NaN where a model did not answer) and cost (NaN where the
    data has none), with each row's id, dataset, prompt and prompt group."""

    models: tuple[str, ...]
    ids: tuple[str, ...]
    datasets: tuple[str, ...]
    prompts: tuple[str, ...]
    groups: tuple[str, ...]
    quality: FloatArray
    cost: FloatArray

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, rows: IntArray) -> QualityTable:
        """The rows at these indices (same models)."""
        pick = rows.tolist()
        return QualityTable(
            self.models,
            tuple(self.ids[i] for i in pick),
            tuple(self.datasets[i] for i in pick),
            tuple(self.prompts[i] for i in pick),
            tuple(self.groups[i] for i in pick),
            self.quality[rows],
            self.cost[rows],
        )

    def of(self, dataset: str) -> IntArray:
        """Indices of one dataset's rows."""
        return np.flatnonzero(np.array(self.datasets) == dataset)


def load_table(data_dir: Path | None = None) -> QualityTable:
    """Every known file under `data_dir` (the shipped data by default; each `STEM.jsonl`
    or `STEM.jsonl.gz`); a file that is absent is skipped, but at least one must be there."""
    directory = data_dir or DEFAULT_DATA_DIR
    records: list[tuple[str, str, str, dict[str, tuple[float, float]]]] = []
    for stem, name in DATASETS.items():
        path = data_file(directory, stem)
        if path.is_file():
            records += [(name, *record) for record in _read(path)]
    if not records:
        raise RoutingError(
            f"no routing data under {directory}; expected some of "
            + ", ".join(f"{stem}.jsonl" for stem in DATASETS)
            + " (or .jsonl.gz)"
        )
    return _tabulate(records)


def data_digest(data_dir: Path | None = None) -> str:
    """SHA-256 over the content of the known files present under `data_dir` (first 12
    hex digits, as `router.training.dataset.data_digest` records it)."""
    directory = data_dir or DEFAULT_DATA_DIR
    digest = hashlib.sha256()
    for stem in DATASETS:
        path = data_file(directory, stem)
        if path.is_file():
            digest.update(stem.encode() + b"\0" + data_bytes(path))
    return digest.hexdigest()[:DATA_DIGEST_DIGITS]


def prompt_group(prompt: str) -> str:
    """What keeps a prompt's copies together: its text, whitespace collapsed and case
    folded, hashed (hex)."""
    normal = " ".join(prompt.split()).casefold()
    return hashlib.sha256(normal.encode("utf-8")).hexdigest()[:16]


def bucket(group: str, salt: str, buckets: int) -> int:
    """A fixed bucket of a prompt group, one independent draw per `salt`."""
    digest = hashlib.sha256(f"{salt}:{group}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % buckets


def final_split(table: QualityTable) -> tuple[IntArray, IntArray]:
    """(pool, final): the rows to train and cross-validate on, and those held out."""
    held = np.array([bucket(g, "final", FINAL_BUCKETS) == 0 for g in table.groups], dtype=bool)
    return np.flatnonzero(~held), np.flatnonzero(held)


def folds(
    table: QualityTable, rows: IntArray, salt: str, k: int
) -> Iterator[tuple[IntArray, IntArray]]:
    """(train, test) index pairs over `rows`, by prompt group, `k` of them."""
    which = np.array([bucket(table.groups[i], salt, k) for i in rows.tolist()], dtype=np.int64)
    for fold in range(k):
        yield rows[which != fold], rows[which == fold]


def outer_folds(table: QualityTable, rows: IntArray) -> Iterator[tuple[IntArray, IntArray]]:
    return folds(table, rows, "outer", OUTER_FOLDS)


def inner_folds(table: QualityTable, rows: IntArray) -> Iterator[tuple[IntArray, IntArray]]:
    return folds(table, rows, "inner", INNER_FOLDS)


def _read(path: Path) -> Iterator[tuple[str, str, dict[str, tuple[float, float]]]]:
    """(id, prompt, {canonical model: (quality, cost)}) per line."""
    with open_data(path) as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                yield str(row["id"]), str(row["prompt"]), _answers(row)
            except (ValueError, KeyError, TypeError) as exc:
                raise RoutingError(
                    f"{path}:{number}: expected a JSON object with id, prompt and either "
                    f"models (each with correct or score, and cost_usd) or weak_correct and "
                    f"strong_correct ({exc!r})"
                ) from exc


def _answers(row: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    if "models" not in row:
        weak, strong = PAIR_MODELS
        return {
            weak: (float(bool(row["weak_correct"])), math.nan),
            strong: (float(bool(row["strong_correct"])), math.nan),
        }
    answers = {}
    for name, answer in row["models"].items():
        answers[canonical(name)] = (_quality(answer), float(answer.get("cost_usd", math.nan)))
    return answers


def _quality(answer: Mapping[str, Any]) -> float:
    if "correct" in answer:
        value = float(answer["correct"])
    else:
        low, high = SCORE_RANGE
        value = (float(answer["score"]) - low) / (high - low)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"quality {value} is outside [0, 1]")
    return value


def _tabulate(records: list[tuple[str, str, str, dict[str, tuple[float, float]]]]) -> QualityTable:
    models = tuple(sorted({m for *_, answers in records for m in answers}))
    column = {m: j for j, m in enumerate(models)}
    quality = np.full((len(records), len(models)), np.nan)
    cost = np.full_like(quality, np.nan)
    for i, (*_, answers) in enumerate(records):
        for model, (q, c) in answers.items():
            quality[i, column[model]], cost[i, column[model]] = q, c
    return QualityTable(
        models=models,
        ids=tuple(r[1] for r in records),
        datasets=tuple(r[0] for r in records),
        prompts=tuple(r[2] for r in records),
        groups=tuple(prompt_group(r[2]) for r in records),
        quality=quality,
        cost=cost,
    )
