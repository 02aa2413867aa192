"""What a cascade calls a broken answer, which it does not deliver when its escalation
fails (`gateway.pipeline.scoring.unusable_answer`): nothing at all, or JSON that breaks
a format the API would have guaranteed. Anything a client can read or act on is an
answer, however doubtful."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.pipeline.scoring import unusable_answer

SCHEMA = {
    "name": "person",
    "schema": {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]},
}
STRICT = {"type": "json_schema", "json_schema": {**SCHEMA, "strict": True}}
LOOSE = {"type": "json_schema", "json_schema": SCHEMA}  # the API does not guarantee it
JSON_MODE = {"type": "json_object"}


def reply(content: str | None = None, **message: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": content, **message}}]}


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        ({}, reply("")),
        ({}, reply("   \n")),
        ({}, reply(None)),
        ({"response_format": JSON_MODE}, reply("Sure! Bob is 30.")),
        ({"response_format": STRICT}, reply('{"name": "Bob"}')),  # misses `age`
        ({"response_format": STRICT}, reply('{"age": 3')),  # cut short
    ],
    ids=["empty", "blank", "null", "json-mode-prose", "strict-schema-mismatch", "strict-cut"],
)
def test_broken_answers(body: dict[str, Any], answer: dict[str, Any]) -> None:
    assert unusable_answer(body, answer)


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        ({}, reply("I'm sorry, I can't help with that.")),
        ({}, reply(None, tool_calls=[{"id": "c1", "type": "function"}])),
        ({}, reply(None, function_call={"name": "f", "arguments": "{}"})),
        ({"response_format": STRICT}, reply(None, refusal="I can't help with that.")),
        ({}, reply(None, audio={"id": "a1", "data": "UklGRg=="})),
        ({"response_format": LOOSE}, reply('{"name": "Bob"}')),  # not guaranteed: doubtful
        ({"response_format": STRICT}, reply('{"age": 30}')),
    ],
    ids=["refusal-text", "tool-call", "function-call", "refusal", "audio", "loose", "fits"],
)
def test_answers_however_doubtful(body: dict[str, Any], answer: dict[str, Any]) -> None:
    assert not unusable_answer(body, answer)
