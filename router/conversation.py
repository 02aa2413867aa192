"""A conversation's text as the verifier reads it: the whole of it (the prompt) and its
user turns (the question). The gateway reads a request's messages so, and `router
verify` a row's, so that a row scores as its request did:

    verifier.score(prompt_text(messages), answer, question=question_text(messages))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation as one text: each message's text, blank-line separated."""
    return _joined(messages)


def question_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The user's turns as one text: what kind of question a request asks is read from
    them, not from the route's system prompt every request on it shares; the whole
    conversation when no user turn says anything."""
    users = _joined(m for m in messages if m.get("role") == "user")
    return users or prompt_text(messages)


def _joined(messages: Iterable[Mapping[str, Any]]) -> str:
    """The messages' texts: a string content, or its parts' `text` joined by spaces; a
    message without any is skipped."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        if content:
            parts.append(str(content))
    return "\n\n".join(parts)
