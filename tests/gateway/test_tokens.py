"""Prompt token counting for limits: every prompt form counts (budgets reserve from
it), and long prompts are counted off the event loop."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from gateway.billing import tokens

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


MODEL = "gpt-4o"


def test_token_id_prompts_count_one_token_per_id() -> None:
    """Before, a prompt of token ids counted nothing, and a budget reserved nothing."""
    assert tokens.count_prompt(MODEL, "completions", {"prompt": list(range(2_000))}) == 2_000
    lists = {"prompt": [[1] * 300, [2] * 500]}
    assert tokens.count_prompt(MODEL, "completions", lists) == 800
    assert tokens.count_prompt(MODEL, "embeddings", {"input": [[5] * 40, [6] * 2]}) == 42


def test_every_prompt_of_a_list_counts() -> None:
    one = tokens.count_prompt(MODEL, "completions", {"prompt": "tell me a story"})
    assert tokens.count_prompt(MODEL, "completions", {"prompt": ["tell me a story"] * 4}) == 4 * one


def test_tools_schemas_and_tool_calls_count() -> None:
    """What the model reads besides the messages: tools, tool_choice, response formats,
    the tool calls in the history; each at least its JSON size at 4 characters a token."""
    plain = {"messages": [{"role": "user", "content": "where is order 7?"}]}
    base = tokens.count_prompt(MODEL, "chat", plain)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    for field, value in (("tools", [tool] * 5), ("response_format", schema), ("tool_choice", tool)):
        counted = tokens.count_prompt(MODEL, "chat", {**plain, field: value})
        assert counted - base >= len(json.dumps(value)) / 4, field
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    history = {"messages": [*plain["messages"], {"role": "assistant", "tool_calls": [call]}]}
    assert tokens.count_prompt(MODEL, "chat", history) > base + len(json.dumps([call])) / 4


def test_images_count_at_their_billed_size() -> None:
    def chat(*parts: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": list(parts)}]}

    text = {"type": "text", "text": "what is this?"}
    base = tokens.count_text(MODEL, "what is this?")
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    low = {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}
    inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 40_000}}
    assert (
        tokens.count_prompt(MODEL, "chat", chat(text, remote)) >= base + tokens.IMAGE_TOKENS["high"]
    )
    assert tokens.count_prompt(MODEL, "chat", chat(text, low)) >= base + tokens.IMAGE_TOKENS["low"]
    assert tokens.count_prompt(MODEL, "chat", chat(text, inline)) >= base + 10_000  # by size
    audio = {"type": "input_audio", "input_audio": {"data": "B" * 8_000, "format": "wav"}}
    assert tokens.count_prompt(MODEL, "chat", chat(text, audio)) >= base + 2_000
