"""Prompt token counting for limits: long prompts are counted off the event loop."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gateway import tokens

SHORT = {"messages": [{"role": "user", "content": "hi there"}]}
LONG = {"messages": [{"role": "user", "content": "a long pasted report. " * 5_000}]}


async def test_a_long_prompt_is_counted_in_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real, threads = tokens.count_prompt, []

    def spy(*args: Any) -> int:
        threads.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(tokens, "count_prompt", spy)
    assert tokens._prompt_chars("chat", LONG) > tokens.THREADED_PROMPT_CHARS
    assert await tokens.count_prompt_off_loop("gpt-4o", "chat", SHORT) == real(
        "gpt-4o", "chat", SHORT
    )
    assert await tokens.count_prompt_off_loop("gpt-4o", "chat", LONG) == real(
        "gpt-4o", "chat", LONG
    )
    here = threading.get_ident()
    assert threads[0] == here and threads[1] != here


@pytest.mark.parametrize(
    ("endpoint", "body", "chars"),
    [
        ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "abc"}]}]}, 3),
        ("completions", {"prompt": ["ab", "cde", 7]}, 5),
        ("embeddings", {"input": "abcd"}, 4),
        ("embeddings", {"input": [1, 2, 3]}, 0),  # token ids: nothing to encode
    ],
)
def test_the_length_that_decides_is_the_text_to_encode(
    endpoint: str, body: dict[str, Any], chars: int
) -> None:
    assert tokens._prompt_chars(endpoint, body) == chars
