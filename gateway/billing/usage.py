"""Token classes: the parts of a usage that providers price apart.

Upstream answers reach the gateway OpenAI-shaped (litellm translates other providers),
so one reader covers them all:

    prompt_tokens_details.cached_tokens        cache reads (OpenAI; litellm's Anthropic,
                                               also top-level `cache_read_input_tokens`;
                                               DeepSeek's `prompt_cache_hit_tokens`)
    prompt_tokens_details.cache_creation_tokens
                                               cache writes (litellm's Anthropic, also
                                               top-level `cache_creation_input_tokens`)
    prompt_tokens_details.audio_tokens / image_tokens
    completion_tokens_details.reasoning_tokens / audio_tokens / image_tokens

Every class is a part of `prompt_tokens` or `completion_tokens`, never on top of them:
OpenAI counts cached and reasoning tokens inside the totals, and litellm adds
Anthropic's cache reads and writes (which Anthropic's `input_tokens` leaves out) into
`prompt_tokens`. So the reader clamps the classes to fit their total: malformed usage
can make a class smaller, never a token counted twice or a count negative.

    >>> token_classes({"prompt_tokens": 2000, "prompt_tokens_details": {"cached_tokens": 1536}})
    TokenClasses(cache_read=1536, ...)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

# (class, where it is read in `usage`, in order of preference), per side of the usage.
PROMPT_SOURCES: dict[str, tuple[tuple[str, ...], ...]] = {
    "cache_read": (
        ("prompt_tokens_details", "cached_tokens"),
        ("cache_read_input_tokens",),
        ("prompt_cache_hit_tokens",),
    ),
    "cache_write": (
        ("prompt_tokens_details", "cache_creation_tokens"),
        ("cache_creation_input_tokens",),
    ),
    "audio_prompt": (("prompt_tokens_details", "audio_tokens"),),
    "image_prompt": (("prompt_tokens_details", "image_tokens"),),
}
COMPLETION_SOURCES: dict[str, tuple[tuple[str, ...], ...]] = {
    "reasoning": (("completion_tokens_details", "reasoning_tokens"),),
    "audio_completion": (("completion_tokens_details", "audio_tokens"),),
    "image_completion": (("completion_tokens_details", "image_tokens"),),
}
CACHED_AUDIO = ("prompt_tokens_details", "cached_tokens_details", "audio_tokens")
# The keys under which any class is reported: a usage with none of them (most replies)
# has no classes, and is read without walking the sources.
CLASS_KEYS = frozenset(
    path[0]
    for sources in (PROMPT_SOURCES, COMPLETION_SOURCES)
    for paths in sources.values()
    for path in paths
)


@dataclass(frozen=True, slots=True)
class TokenClasses:
    """Tokens priced apart from plain input and output. The first four are parts of
    the prompt's tokens, the last three of the completion's."""

    cache_read: int = 0
    cache_write: int = 0
    audio_prompt: int = 0
    image_prompt: int = 0
    reasoning: int = 0
    audio_completion: int = 0
    image_completion: int = 0

    @property
    def prompt(self) -> int:
        return self.cache_read + self.cache_write + self.audio_prompt + self.image_prompt

    @property
    def completion(self) -> int:
        return self.reasoning + self.audio_completion + self.image_completion

    def uncached(self) -> TokenClasses:
        """The same tokens as if no cache had been read or written (plain input)."""
        return replace(self, cache_read=0, cache_write=0)


NO_CLASSES = TokenClasses()
CLASS_NAMES: tuple[str, ...] = tuple(f.name for f in fields(TokenClasses))


def token_count(value: Any) -> int:
    """A count as reported, or 0 for anything that is not a whole, positive number."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return max(int(value), 0)
    return 0


def token_classes(usage: Mapping[str, Any]) -> TokenClasses:
    """The classes in an OpenAI-shaped `usage`, each clamped to what its total leaves."""
    if CLASS_KEYS.isdisjoint(usage):
        return NO_CLASSES
    prompt = _found(usage, PROMPT_SOURCES)
    # Cached audio (OpenAI's `cached_tokens_details.audio_tokens`) is in both the cached
    # and the audio count: it is priced once, as a cache read.
    prompt["audio_prompt"] = max(
        prompt["audio_prompt"] - token_count(value_at(usage, CACHED_AUDIO)), 0
    )
    counts = _clamped(prompt, token_count(usage.get("prompt_tokens")))
    completion = _found(usage, COMPLETION_SOURCES)
    counts.update(_clamped(completion, token_count(usage.get("completion_tokens"))))
    return TokenClasses(**counts)


def _found(
    usage: Mapping[str, Any], sources: Mapping[str, tuple[tuple[str, ...], ...]]
) -> dict[str, int]:
    """Each class's count: the first of its places in `usage` with one."""
    return {
        name: next((n for path in paths if (n := token_count(value_at(usage, path)))), 0)
        for name, paths in sources.items()
    }


def _clamped(counts: Mapping[str, int], total: int) -> dict[str, int]:
    """`counts` cut, in order, to fit in `total` together."""
    left, fitted = total, {}
    for name, count in counts.items():
        fitted[name] = min(count, left)
        left -= fitted[name]
    return fitted


def value_at(usage: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The value at `path` in nested objects, or None where the path breaks."""
    value: Any = usage
    for name in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(name)
    return value
