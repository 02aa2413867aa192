"""The complexity classifier: how much a chat request needs the strong model.

A linear model over `router.features` with a logistic link, stored as plain JSON
(never a pickle, so a model file can be inspected and loading one cannot run code).
Scoring needs numpy only; training lives in `router.training.classifier_train`.

    classifier = Classifier.load()          # the model shipped in router/models/
    classifier.score([{"role": "user", "content": "Prove that ..."}])   # -> 0.83
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from router.artifacts import read_artifact
from router.errors import RoutingError
from router.features import (
    DENSE_NAMES,
    FEATURE_VERSION,
    HASH_FEATURES,
    FloatArray,
    RequestFeatures,
    extract,
    extract_body,
)

FORMAT = "cascade-gateway/classifier"
DEFAULT_PATH = Path(__file__).resolve().parent / "models" / "classifier.json"
SIGNIFICANT_DIGITS = 6  # coefficients are rounded so the file is small and reproducible
# Logit added for small talk ("hi", "thanks": `features.SMALL_TALK_CHARS`), which no
# training prompt is: read by the within-task weights alone, "Hello!" outscored a
# twin-primes proof (0.135 against 0.044). A prior, like training's PRIOR_WEIGHTS:
# "hi" 0.019 -> 0.003, "Hello!" -> 0.021, under 90% of MBPP's one-line requests.
SMALL_TALK_LOGIT = -2.0


class RequestClassifier(Protocol):
    """What scores requests: this module's `Classifier` (the default) or
    `router.embedding_classifier.EmbeddingClassifier` (a route's `classifier: minilm`)."""

    def score(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[object] | None = None,
        response_format: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> float: ...

    def score_batch(self, requests: Sequence[Mapping[str, Any]]) -> list[float]: ...


@dataclass(frozen=True, eq=False)
class Classifier:
    """Linear score on standardised dense features (plus hashed n-grams, whose weights
    may be all zero) through a sigmoid."""

    dense_mean: FloatArray
    dense_scale: FloatArray
    dense_coef: FloatArray
    hash_coef: FloatArray
    intercept: float
    training: Mapping[str, Any] = field(default_factory=dict)
    # Each dense feature is clipped into [low, high] before it is weighed: the range seen
    # in training (wider for the prior-weighted ones). A request far outside it (a prompt
    # all in Chinese where training had 0.5% non-ASCII, a 60,000-character one) then
    # weighs as the most extreme training request did, not 200 standard deviations more.
    # None: no clipping (model files written before the bounds existed).
    dense_low: FloatArray | None = None
    dense_high: FloatArray | None = None
    # The standardisation folded into the weights, so a score is two dot products.
    _dense_weights: FloatArray = field(init=False, repr=False)
    _bias: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        weights = self.dense_coef / self.dense_scale
        object.__setattr__(self, "_dense_weights", weights)
        object.__setattr__(self, "_bias", self.intercept - float(self.dense_mean @ weights))

    @classmethod
    def load(cls, path: Path | str | None = None) -> Classifier:
        """Load a model file; by default the one shipped with the package."""
        source = Path(path) if path is not None else DEFAULT_PATH
        return cls.from_dict(read_artifact(source, "classifier model"), source=str(source))

    @classmethod
    def from_dict(cls, document: Mapping[str, Any], *, source: str = "<dict>") -> Classifier:
        expected = {
            "format": FORMAT,
            "feature_version": FEATURE_VERSION,
            "hash_features": HASH_FEATURES,
            "dense_names": list(DENSE_NAMES),
        }
        check_spec(document, expected, f"classifier model {source}", "cascade-gateway router train")
        try:
            hash_coef = np.zeros(HASH_FEATURES)
            hashed = document["hash_coef"]
            hash_coef[np.asarray(hashed["index"], dtype=np.int64)] = hashed["value"]
            return cls(
                dense_mean=np.asarray(document["dense_mean"], dtype=np.float64),
                dense_scale=np.asarray(document["dense_scale"], dtype=np.float64),
                dense_coef=np.asarray(document["dense_coef"], dtype=np.float64),
                hash_coef=hash_coef,
                intercept=float(document["intercept"]),
                training=dict(document.get("training", {})),
                dense_low=_optional_array(document.get("dense_low")),
                dense_high=_optional_array(document.get("dense_high")),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise RoutingError(f"classifier model {source} is malformed: {exc!r}") from exc

    def to_dict(self) -> dict[str, Any]:
        nonzero = np.flatnonzero(self.hash_coef)
        return {
            "format": FORMAT,
            "feature_version": FEATURE_VERSION,
            "hash_features": HASH_FEATURES,
            "dense_names": list(DENSE_NAMES),
            "dense_mean": rounded(self.dense_mean),
            "dense_scale": rounded(self.dense_scale),
            "dense_coef": rounded(self.dense_coef),
            "hash_coef": {"index": nonzero.tolist(), "value": rounded(self.hash_coef[nonzero])},
            "intercept": rounded(np.array([self.intercept]))[0],
            "training": dict(self.training),
            **({} if self.dense_low is None else {"dense_low": rounded(self.dense_low, -1)}),
            **({} if self.dense_high is None else {"dense_high": rounded(self.dense_high, 1)}),
        }

    def save(self, path: Path) -> None:
        """Write the model as JSON; the same model always gives the same bytes."""
        write_artifact(path, self.to_dict())

    def score(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[object] | None = None,
        response_format: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> float:
        """Probability in [0, 1] that the request needs the strong model."""
        features = extract(
            messages, tools=tools, response_format=response_format, max_tokens=max_tokens
        )
        return self.score_features(features)

    def score_features(self, features: RequestFeatures) -> float:
        dense = features.dense
        if self.dense_low is not None and self.dense_high is not None:
            dense = np.minimum(np.maximum(dense, self.dense_low), self.dense_high)
        z = self._bias + float(dense @ self._dense_weights)
        z += float(features.hash_value @ self.hash_coef[features.hash_index])
        if features.small_talk:
            z += SMALL_TALK_LOGIT
        return _sigmoid(z)

    def score_batch(self, requests: Sequence[Mapping[str, Any]]) -> list[float]:
        """Scores for OpenAI-style request bodies (`features.extract_body`), in order."""
        return [self.score_features(extract_body(r)) for r in requests]


def check_spec(
    document: Mapping[str, Any], expected: Mapping[str, Any], what: str, rebuild: str
) -> None:
    """A model file was built for this code: each `expected` key holds its value."""
    for key, value in expected.items():
        if document.get(key) != value:
            raise RoutingError(
                f"{what} has {key}={document.get(key)!r}; this code "
                f"expects {value!r} (rebuild it with `{rebuild}`)"
            )


def write_artifact(path: Path, document: Mapping[str, Any]) -> None:
    """A model file as compact sorted JSON: the same model always gives the same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    path.write_text(text + "\n", encoding="utf-8")


def rounded(values: FloatArray, direction: int = 0) -> list[float]:
    """Coefficients rounded so that a model file is small and reproducible; `direction`
    -1 / 1 rounds down / up instead (bounds that must still hold what they bound)."""
    out = []
    for value in values.tolist():
        near = float(f"{value:.{SIGNIFICANT_DIGITS}g}")
        if direction and (near - value) * direction < 0:  # rounded the wrong way: one step
            step = 10 ** (math.floor(math.log10(abs(value))) - SIGNIFICANT_DIGITS + 1)
            near = float(f"{near + direction * step:.{SIGNIFICANT_DIGITS}g}")
        out.append(near)
    return out


def _optional_array(values: Sequence[float] | None) -> FloatArray | None:
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float64)
    if array.shape != (len(DENSE_NAMES),):
        raise ValueError(f"expected {len(DENSE_NAMES)} bounds, got shape {array.shape}")
    return array


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)
