"""What this install can run, checked without importing the models or numpy (policy
validation and `serve` ask before any request): the embedding classifier needs its
artefact and the `embeddings` extra."""

from __future__ import annotations

from pathlib import Path

from local_engine.sentence_model import missing as embeddings_missing

MINILM_CLASSIFIER_PATH = Path(__file__).resolve().parent / "models" / "classifier-minilm.json"


def minilm_classifier_missing() -> str | None:
    """Why the shipped embedding classifier cannot run here (the file, the extra, the
    weights), or None."""
    if not MINILM_CLASSIFIER_PATH.is_file():
        return f"the embedding classifier {MINILM_CLASSIFIER_PATH} is missing"
    return embeddings_missing()
