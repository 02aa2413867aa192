"""Token counting for upstreams that report no usage (or streams cut short).

Uses tiktoken's encodings from the copy litellm ships (no download at run time):
o200k_base for the gpt-4o/o-series family, cl100k_base for everything else, which
is an estimate for non-OpenAI models and is recorded as such (usage_source=counted).

Every prompt form counts, since budgets reserve from this count: strings, token ids
(one token each), lists of prompts, content parts, tool schemas, `tool_choice`,
`response_format`, tool calls in the history. Structured values (parts, schemas) count
at the larger of their tokens and their JSON size at `CHARS_PER_TOKEN` (providers bill
some by size); an image at the most a provider bills for one (`IMAGE_TOKENS`), or its
size if larger (an inline image's bytes).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import tiktoken

from gateway.billing import encodings
from policies.prices import litellm_root

# Encodings are built off the event loop, one at a time (`warm`).
_LOADER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiktoken")
# OpenAI's chat format adds a few tokens per message and for the reply's priming.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3
# Longer prompts are counted in a worker thread: tiktoken releases the GIL while it
# encodes, and a 1 MB prompt takes ~130 ms, which the event loop would otherwise wait.
THREADED_PROMPT_CHARS = 64_000
_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4", "chatgpt-4o")
CHARS_PER_TOKEN = 4  # structured content billed by size
# The most one image is billed: OpenAI's high detail tops out at 1,445 tokens (8 tiles),
# Anthropic's at about 1,600 (1.15 megapixels); `detail: low` is 85 at OpenAI.
IMAGE_TOKENS = {"low": 85, "high": 1_600}
# Request fields that are sent to the model as part of its prompt, besides the messages.
PROMPT_FIELDS = ("tools", "tool_choice", "functions", "function_call", "response_format")
# Message fields other than `content` and `name` that the model reads.
MESSAGE_FIELDS = ("tool_calls", "function_call", "audio")


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
    return encodings.load(name)  # parsed once per machine, then from its cache


def count_text(model: str, text: str) -> int:
    return len(encoding_for(model).encode(text, disallowed_special=())) if text else 0


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multi-part content: the text parts
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def _by_size(value: Any) -> int:
    """Tokens of a structured value billed by its size (stdlib JSON, as clients send it)."""
    return math.ceil(len(json.dumps(value, default=str)) / CHARS_PER_TOKEN)


def count_structured(model: str, value: Any) -> int:
    """A JSON value the model reads (a tool schema, a tool call): its tokens or its
    size, whichever is more."""
    if value is None:
        return 0
    text = json.dumps(value, default=str)
    return max(count_text(model, text), math.ceil(len(text) / CHARS_PER_TOKEN))


def _part_tokens(model: str, part: Any) -> int:
    if not isinstance(part, Mapping):
        return count_structured(model, part)
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str):
        return count_text(model, part["text"])
    if kind in ("image_url", "image"):
        image = part.get("image_url")
        detail = image.get("detail") if isinstance(image, Mapping) else None
        return max(IMAGE_TOKENS["low" if detail == "low" else "high"], _by_size(part))
    return count_structured(model, part)


def count_content(model: str, content: Any) -> int:
    """A message's content: a string, or parts (text, images, audio, files), which
    count at least their size."""
    if isinstance(content, str):
        return count_text(model, content)
    if isinstance(content, list):
        return max(sum(_part_tokens(model, p) for p in content), _by_size(content))
    return 0 if content is None else count_structured(model, content)


def count_messages(model: str, messages: Iterable[Mapping[str, Any]]) -> int:
    total = TOKENS_PER_REPLY
    for message in messages:
        total += TOKENS_PER_MESSAGE + count_content(model, message.get("content"))
        if message.get("name"):
            total += 1 + count_text(model, str(message["name"]))
        total += sum(count_structured(model, message.get(f)) for f in MESSAGE_FIELDS)
    return total


def count_prompt(model: str, endpoint: str, body: Mapping[str, Any]) -> int:
    """Prompt tokens of a request body for any endpoint, in every form it may take."""
    if endpoint == "chat":
        messages = body.get("messages") or []
        extra = sum(count_structured(model, body.get(f)) for f in PROMPT_FIELDS)
        return count_messages(model, messages) + extra
    field = "prompt" if endpoint == "completions" else "input"
    return sum(_count_one_prompt(model, p) for p in prompt_list(body.get(field)))


def prompt_list(value: Any) -> list[Any]:
    """A completion's `prompt` or an embedding's `input` as a list of single prompts:
    a string, a list of token ids, or a list of either."""
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        return value
    return [] if value is None else [value]


def _count_one_prompt(model: str, prompt: Any) -> int:
    if isinstance(prompt, str):
        return count_text(model, prompt)
    if isinstance(prompt, list):  # token ids
        return len(prompt)
    return count_structured(model, prompt)


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


def estimate_prompt_tokens(endpoint: str, body: Mapping[str, Any]) -> int:
    """A quick size of the prompt's text, in tokens (`CHARS_PER_TOKEN`): enough to rank
    deployments by expected cost without encoding it."""
    return 1 + _prompt_chars(endpoint, body) // CHARS_PER_TOKEN


def _prompt_chars(endpoint: str, body: Mapping[str, Any]) -> int:
    if endpoint == "chat":
        messages = body.get("messages") or []
        return sum(len(_content_text(m.get("content"))) for m in messages)
    field = "prompt" if endpoint == "completions" else "input"
    return sum(len(p) for p in prompt_list(body.get(field)) if isinstance(p, str))


def preload(models: Iterable[str] = ("gpt-4o", "cl100k")) -> None:
    """Load the encodings `models` are counted with now rather than inside a request,
    on the event loop (default: both)."""
    for model in models:
        encoding_for(model)


def warm(models: Iterable[str]) -> Future[None]:
    """`preload(models)` in the loader's thread: at start-up for the policy's models, and
    on each reload for those it brings (an encoding costs ~0.2 s of CPU to build, so
    one no deployment counts with is never built)."""
    return _LOADER.submit(preload, list(models))
