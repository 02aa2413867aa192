"""Token counting for upstreams that report no usage (or streams cut short).

Uses tiktoken's encodings from the copy litellm ships (no download at run time):
o200k_base for the gpt-4o/o-series family, cl100k_base for everything else, which
is an estimate for non-OpenAI models and is recorded as such (usage_source=counted).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tiktoken

# OpenAI's chat format adds a few tokens per message and for the reply's priming.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3
# Longer prompts are counted in a worker thread: tiktoken releases the GIL while it
# encodes, and a 1 MB prompt takes ~130 ms, which the event loop would otherwise wait.
THREADED_PROMPT_CHARS = 64_000
_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4", "chatgpt-4o")


def _bundled_cache_dir() -> str | None:
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"
    return str(path) if path.is_dir() else None


@functools.cache
def encoding_for(model: str) -> tiktoken.Encoding:
    # tiktoken only looks for its files in TIKTOKEN_CACHE_DIR; point it at the bundled copy.
    cache_dir = _bundled_cache_dir()
    if cache_dir is not None:
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", cache_dir)
    name = "o200k_base" if model.lower().startswith(_O200K_PREFIXES) else "cl100k_base"
    return tiktoken.get_encoding(name)


def count_text(model: str, text: str) -> int:
    return len(encoding_for(model).encode(text, disallowed_special=())) if text else 0


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multi-part content: count the text parts
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def count_messages(model: str, messages: Iterable[Mapping[str, Any]]) -> int:
    total = TOKENS_PER_REPLY
    for message in messages:
        total += TOKENS_PER_MESSAGE + count_text(model, _content_text(message.get("content")))
        if message.get("name"):
            total += 1 + count_text(model, str(message["name"]))
    return total


def count_prompt(model: str, endpoint: str, body: Mapping[str, Any]) -> int:
    """Prompt tokens of a request body for any endpoint."""
    if endpoint == "chat":
        return count_messages(model, body.get("messages") or [])
    prompt = body.get("prompt") if endpoint == "completions" else body.get("input")
    if isinstance(prompt, list):
        return sum(count_text(model, p) for p in prompt if isinstance(p, str))
    return count_text(model, prompt) if isinstance(prompt, str) else 0


async def count_prompt_off_loop(model: str, endpoint: str, body: Mapping[str, Any]) -> int:
    """``count_prompt``, in a worker thread when the prompt is long."""
    if _prompt_chars(endpoint, body) <= THREADED_PROMPT_CHARS:
        return count_prompt(model, endpoint, body)
    return await asyncio.to_thread(count_prompt, model, endpoint, body)


def _prompt_chars(endpoint: str, body: Mapping[str, Any]) -> int:
    if endpoint == "chat":
        messages = body.get("messages") or []
        return sum(len(_content_text(m.get("content"))) for m in messages)
    prompt = body.get("prompt") if endpoint == "completions" else body.get("input")
    if isinstance(prompt, list):
        return sum(len(p) for p in prompt if isinstance(p, str))
    return len(prompt) if isinstance(prompt, str) else 0


def preload() -> None:
    """Load both encodings now (at start-up) rather than inside the first request."""
    encoding_for("gpt-4o")
    encoding_for("cl100k")
