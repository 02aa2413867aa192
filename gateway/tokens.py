"""Token counting for upstreams that report no usage (or streams cut short).

Uses tiktoken's encodings from the copy litellm ships (no download at run time):
o200k_base for the gpt-4o/o-series family, cl100k_base for everything else, which
is an estimate for non-OpenAI models and is recorded as such (usage_source=counted).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any

import tiktoken

from policies.prices import litellm_root

# OpenAI's chat format adds a few tokens per message and for the reply's priming.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3
# Longer prompts are counted in a worker thread: tiktoken releases the GIL while it
# encodes, and a 1 MB prompt takes ~130 ms, which the event loop would otherwise wait.
THREADED_PROMPT_CHARS = 64_000
_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4", "chatgpt-4o")


def _bundled_cache_dir() -> str | None:
    root = litellm_root()
    if root is None:
        return None
    path = root / "litellm_core_utils" / "tokenizers"
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
    return sum(count_text(model, text) for text in _prompt_texts(endpoint, body))


def _prompt_texts(endpoint: str, body: Mapping[str, Any]) -> list[str]:
    """A completion's `prompt` or an embedding's `input`: one string or a list of them."""
    prompt = body.get("prompt") if endpoint == "completions" else body.get("input")
    if isinstance(prompt, list):
        return [p for p in prompt if isinstance(p, str)]
    return [prompt] if isinstance(prompt, str) else []


async def count_prompt_off_loop(model: str, endpoint: str, body: Mapping[str, Any]) -> int:
    """``count_prompt``, in a worker thread when the prompt is long."""
    if _prompt_chars(endpoint, body) <= THREADED_PROMPT_CHARS:
        return count_prompt(model, endpoint, body)
    return await asyncio.to_thread(count_prompt, model, endpoint, body)


class PromptCounts:
    """One request's prompt tokens, counted at most once per tiktoken encoding: by
    admission (for its first planned model), then reused by every attempt whose
    upstream reports no usage.

        prompt = PromptCounts()
        await prompt.count("gpt-4o", "chat", body)  # a long prompt: in a worker thread
        prompt.get("gpt-4o", "chat", body)  # known now: nothing counted on the loop
    """

    __slots__ = ("_by_encoding",)

    def __init__(self) -> None:
        self._by_encoding: dict[str, int] = {}

    async def count(self, model: str, endpoint: str, body: Mapping[str, Any]) -> int:
        """The prompt's tokens for `model`: known, else counted (off the loop if long)."""
        name = encoding_for(model).name
        known = self._by_encoding.get(name)
        if known is None:
            known = self._by_encoding[name] = await count_prompt_off_loop(model, endpoint, body)
        return known

    async def prepare(self, models: Iterable[str], endpoint: str, body: Mapping[str, Any]) -> None:
        """Count for each of `models` now, so that code which must not await finds it."""
        for model in models:
            await self.count(model, endpoint, body)

    def get(self, model: str, endpoint: str, body: Mapping[str, Any]) -> int:
        """The prompt's tokens for `model`: known, else counted on the calling thread
        (the fallback of a request cancelled before `prepare` finished)."""
        name = encoding_for(model).name
        known = self._by_encoding.get(name)
        if known is None:
            known = self._by_encoding[name] = count_prompt(model, endpoint, body)
        return known


def _prompt_chars(endpoint: str, body: Mapping[str, Any]) -> int:
    if endpoint == "chat":
        messages = body.get("messages") or []
        return sum(len(_content_text(m.get("content"))) for m in messages)
    return sum(map(len, _prompt_texts(endpoint, body)))


def preload() -> None:
    """Load both encodings now (at start-up) rather than inside the first request."""
    encoding_for("gpt-4o")
    encoding_for("cl100k")
