"""Reading long untrusted text in bounded time."""

from __future__ import annotations


def head_and_tail(text: str, limit: int) -> str:
    """``text`` itself when it has at most ``limit`` characters, else its first and last
    ``limit // 2`` joined by a newline: where a conversation's system prompt and its
    question are, read in bounded time."""
    if len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return f"{text[:half]}\n{text[len(text) - half :]}"
