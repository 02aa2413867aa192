"""The provider names litellm serves, for a deployment's `provider` (besides `openai`).

A provider other than `openai` (spoken natively) is sent to litellm as
`<provider>/<model>`, which accepts the names of its `LlmProviders` enum and of the
OpenAI-compatible providers it configures from `llms/openai_like/providers.json`; any
other name fails every request.
Both are read from the installed package's files, not imported (importing litellm's
types costs seconds): the enum's string values are taken from its source with `ast`.

    litellm_providers()  # frozenset({"anthropic", "bedrock", "vertex_ai", ...}), or None
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

from policies.prices import litellm_root

ENUM_FILE = Path("types") / "utils.py"
ENUM_CLASS = "LlmProviders"
JSON_PROVIDERS_FILE = Path("llms") / "openai_like" / "providers.json"


@functools.cache
def litellm_providers() -> frozenset[str] | None:
    """Every provider name litellm can serve, or None when that cannot be told
    (litellm not installed, or its files not laid out as this version's are): a
    caller then accepts any name rather than refuse a good one."""
    root = litellm_root()
    if root is None:
        return None
    try:
        names = _enum_values(root / ENUM_FILE) | _json_providers(root / JSON_PROVIDERS_FILE)
    except (OSError, SyntaxError, ValueError):
        return None
    return frozenset(names) if names else None


def _enum_values(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == ENUM_CLASS:
            return {
                statement.value.value
                for statement in node.body
                if isinstance(statement, ast.Assign)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            }
    raise ValueError(f"{path} defines no {ENUM_CLASS}")


def _json_providers(path: Path) -> set[str]:
    if not path.exists():
        return set()
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name for name in data if isinstance(name, str)} if isinstance(data, dict) else set()
