"""The quality predictor: how well each known model is expected to answer a request.

For a chat request and a set of known models it gives each model's expected quality in
[0, 1] (on the labelled data: the share of correct answers, or a 1-10 grade read as
(grade - 1) / 9). A selection strategy pays for the cheapest model whose predicted
quality meets a target.

    predictor = QualityPredictor.load()       # the model shipped in router/models/
    predictor.predict([{"role": "user", "content": "Write a function ..."}],
                      models=["gpt-4-1106-preview", "gpt-3.5-turbo-1106"])
    # -> {"gpt-4-1106-preview": 0.69, "gpt-3.5-turbo-1106": 0.64}

The model, over the dense features of `router.features` (standardised, each clipped
into the range training saw):

    task   = softmax(x @ task_weights)                 # which kind of labelled prompt
    q      = task @ task_quality + x @ deviation       # per model, clipped to [0, 1]

`task_quality` is each model's mean quality on each kind of prompt; `deviation` moves a
prompt's qualities from that prior (what `router.training.quality_train` fits there, and why, is
in the model card). Scoring needs numpy only; the file is plain JSON, never a pickle.

Names: a model the data lists under two names is one model (`ALIASES`); lookups ignore
case. Alike but distinct, and kept apart: gpt-4-1106-preview and gpt-4-0314,
gpt-3.5-turbo-1106 and gpt-3.5-turbo (the 0613 snapshot), claude-v2 (Claude 2.0) and
claude-2.1. A name the predictor does not know raises `UnknownModelError`, listing the
known ones and the aliases it accepts.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from router.artifacts import read_artifact
from router.classifier import check_spec, rounded, write_artifact
from router.errors import RoutingError
from router.features import DENSE_NAMES, FEATURE_VERSION, FloatArray, extract, extract_body

FORMAT = "cascade-gateway/quality"
DEFAULT_PATH = Path(__file__).resolve().parent / "models" / "quality.json"
STRONG_MODEL = "gpt-4-1106-preview"  # the reference the targets are relative to
# Another name -> the canonical one, for each model the data lists under two names
# (RouterBench's name is canonical; the other is arena chat's).
ALIASES: Mapping[str, str] = {
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/mixtral-8x7b-chat",
    "claude-1": "claude-v1",
    "claude-instant-1": "claude-instant-v1",
    "Llama-2-70b-chat": "meta/llama-2-70b-chat",
}
_CANONICAL = {alias.casefold(): name for alias, name in ALIASES.items()}


class UnknownModelError(RoutingError):
    """A model name the quality predictor has no profile for (a `RoutingError`)."""


@functools.cache
def shipped() -> QualityPredictor:
    """The shipped model, read once per process (a select route, the policy's install
    check and `policy explain` share it)."""
    return QualityPredictor.load()


def canonical(name: str) -> str:
    """The model's canonical name: `ALIASES` applied, ignoring case."""
    return _CANONICAL.get(name.casefold(), name)


@dataclass(frozen=True, eq=False)
class QualityPredictor:
    """Each known model's expected quality for a request (see the module docstring)."""

    models: tuple[str, ...]
    tasks: tuple[str, ...]
    dense_mean: FloatArray
    dense_scale: FloatArray
    dense_low: FloatArray
    dense_high: FloatArray
    task_weights: FloatArray  # (features + 1, tasks): the last row is the bias
    task_quality: FloatArray  # (tasks, models)
    deviation: FloatArray  # (features, models)
    training: Mapping[str, Any] = field(default_factory=dict)
    _index: Mapping[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        index = {m.casefold(): i for i, m in enumerate(self.models)}
        index.update({a: index[m.casefold()] for a, m in _CANONICAL.items() if m in self.models})
        object.__setattr__(self, "_index", index)

    @classmethod
    def load(cls, path: Path | str | None = None) -> QualityPredictor:
        """Load a model file; by default the one shipped with the package."""
        source = Path(path) if path is not None else DEFAULT_PATH
        return cls.from_dict(read_artifact(source, "quality model"), source=str(source))

    @classmethod
    def from_dict(cls, document: Mapping[str, Any], *, source: str = "<dict>") -> QualityPredictor:
        expected = {
            "format": FORMAT,
            "feature_version": FEATURE_VERSION,
            "dense_names": list(DENSE_NAMES),
        }
        check_spec(
            document, expected, f"quality model {source}", "cascade-gateway router train-quality"
        )
        try:
            models, tasks = tuple(document["models"]), tuple(document["tasks"])
            width = len(DENSE_NAMES)
            shapes = {
                "dense_mean": (width,),
                "dense_scale": (width,),
                "dense_low": (width,),
                "dense_high": (width,),
                "task_weights": (width + 1, len(tasks)),
                "task_quality": (len(tasks), len(models)),
                "deviation": (width, len(models)),
            }
            arrays = {k: _array(document[k], shape, k) for k, shape in shapes.items()}
            if not all(isinstance(m, str) for m in models) or len(set(models)) != len(models):
                raise ValueError("models must be distinct names")
            return cls(models, tasks, training=dict(document.get("training", {})), **arrays)
        except (KeyError, TypeError, ValueError) as exc:
            raise RoutingError(f"quality model {source} is malformed: {exc!r}") from exc

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "feature_version": FEATURE_VERSION,
            "dense_names": list(DENSE_NAMES),
            "models": list(self.models),
            "tasks": list(self.tasks),
            "dense_mean": rounded(self.dense_mean),
            "dense_scale": rounded(self.dense_scale),
            "dense_low": rounded(self.dense_low, -1),
            "dense_high": rounded(self.dense_high, 1),
            "task_weights": [rounded(row) for row in self.task_weights],
            "task_quality": [rounded(row) for row in self.task_quality],
            "deviation": [rounded(row) for row in self.deviation],
            "training": dict(self.training),
        }

    def save(self, path: Path) -> None:
        """Write the model as JSON; the same model always gives the same bytes."""
        write_artifact(path, self.to_dict())

    def resolve(self, names: Iterable[str] | None = None) -> tuple[int, ...]:
        """Column indices of these model names (all models when None), in order."""
        if names is None:
            return tuple(range(len(self.models)))
        columns = []
        for name in names:
            column = self._index.get(name.casefold())
            if column is None:
                raise UnknownModelError(
                    f"unknown model '{name}'; the quality predictor knows "
                    + ", ".join(self.models)
                    + self._aliases_known()
                )
            columns.append(column)
        return tuple(columns)

    def _aliases_known(self) -> str:
        """`ALIASES` of the models this predictor knows, for an unknown name's error."""
        known = [f"{alias} -> {name}" for alias, name in ALIASES.items() if name in self.models]
        return f" (also accepted: {', '.join(known)})" if known else ""

    def predict(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        models: Sequence[str] | None = None,
        tools: Sequence[object] | None = None,
        response_format: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> dict[str, float]:
        """Expected quality in [0, 1] of each of `models` (all known ones when None),
        keyed by the names as given."""
        columns = self.resolve(models)
        names = self.models if models is None else models
        features = extract(
            messages, tools=tools, response_format=response_format, max_tokens=max_tokens
        )
        quality = self.predict_dense(features.dense[None, :])[0]
        return {name: float(quality[c]) for name, c in zip(names, columns, strict=True)}

    def predict_batch(
        self, requests: Sequence[Mapping[str, Any]], models: Sequence[str] | None = None
    ) -> list[dict[str, float]]:
        """`predict` for OpenAI-style request bodies (`features.extract_body`), in order."""
        columns = self.resolve(models)
        names = self.models if models is None else models
        if not requests:
            return []
        quality = self.predict_dense(np.vstack([extract_body(r).dense for r in requests]))
        return [
            {name: float(row[c]) for name, c in zip(names, columns, strict=True)} for row in quality
        ]

    def predict_dense(self, dense: FloatArray) -> FloatArray:
        """Qualities (rows x models) of dense feature rows (rows x features)."""
        x = (np.clip(dense, self.dense_low, self.dense_high) - self.dense_mean) / self.dense_scale
        return np.clip(self.task_posterior(x) @ self.task_quality + x @ self.deviation, 0.0, 1.0)

    def task_posterior(self, x: FloatArray) -> FloatArray:
        """Softmax over `tasks` of standardised feature rows."""
        z = x @ self.task_weights[:-1] + self.task_weights[-1]
        z = np.exp(z - z.max(axis=1, keepdims=True))
        posterior: FloatArray = z / z.sum(axis=1, keepdims=True)
        return posterior


def _array(values: Any, shape: tuple[int, ...], name: str) -> FloatArray:
    array = np.asarray(values, dtype=np.float64)
    if array.shape != shape:
        raise ValueError(f"{name} has shape {array.shape}, expected {shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} holds a value that is not finite")
    return array
