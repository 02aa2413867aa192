"""The router's complexity score for a request body, for routes that route by score.

The classifier is loaded on first use (routes without scoring never pay for it) and
then kept; scoring is numpy-only and sub-millisecond, so it runs inline.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gateway.upstreams.base import EndpointType


class ClassifierType(Protocol):
    def score(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[object] | None = None,
        response_format: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> float: ...


def request_messages(endpoint: EndpointType, body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Chat messages of any request: a completion's prompt is one user message."""
    if endpoint == "chat":
        return list(body.get("messages") or [])
    prompt = body.get("prompt") if endpoint == "completions" else body.get("input")
    text = (
        prompt
        if isinstance(prompt, str)
        else " ".join(p for p in prompt or [] if isinstance(p, str))
    )
    return [{"role": "user", "content": text}]


class RequestScorer:
    """`scorer(endpoint, body) -> float` in [0, 1]: how much the request needs a strong model."""

    def __init__(self, classifier: ClassifierType | None = None) -> None:
        self._classifier = classifier
        self._lock = threading.Lock()

    def __call__(self, endpoint: EndpointType, body: Mapping[str, Any]) -> float:
        classifier = self._classifier or self._load()
        response_format = body.get("response_format")
        tools = body.get("tools")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        return classifier.score(
            request_messages(endpoint, body),
            tools=tools if isinstance(tools, list) else None,
            response_format=response_format if isinstance(response_format, Mapping) else None,
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        )

    def _load(self) -> ClassifierType:
        with self._lock:
            if self._classifier is None:
                from router.classifier import Classifier

                self._classifier = Classifier.load()
            return self._classifier


class VerifierType(Protocol):
    def score(
        self,
        prompt: str,
        response: str,
        *,
        logprobs: list[float] | None = None,
        response_format: dict[str, Any] | None = None,
        finish_reason: str | None = None,
    ) -> float: ...


def prompt_text(endpoint: EndpointType, body: Mapping[str, Any]) -> str:
    """The conversation as one text, for the verifier."""
    parts = []
    for message in request_messages(endpoint, body):
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        if content:
            parts.append(str(content))
    return "\n\n".join(parts)


def answer_parts(reply: Mapping[str, Any]) -> tuple[str, list[float] | None, str | None]:
    """The first choice's text, token logprobs (when the upstream sent them), and
    finish reason."""
    choices = reply.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], Mapping) else {}
    message = choice.get("message") or {}
    text = message.get("content") if isinstance(message, Mapping) else None
    text = text if isinstance(text, str) else str(choice.get("text") or "")
    logprobs = None
    content = (
        (choice.get("logprobs") or {}).get("content")
        if isinstance(choice.get("logprobs"), Mapping)
        else None
    )
    if isinstance(content, list):
        logprobs = [
            float(t["logprob"]) for t in content if isinstance(t, Mapping) and "logprob" in t
        ]
    return text, logprobs, choice.get("finish_reason")


class AnswerVerifier:
    """`verifier(endpoint, body, reply) -> float` in [0, 1]: how likely the answer is
    acceptable. The model is loaded on first use and kept."""

    def __init__(self, verifier: VerifierType | None = None) -> None:
        self._verifier = verifier
        self._lock = threading.Lock()

    def __call__(
        self, endpoint: EndpointType, body: Mapping[str, Any], reply: Mapping[str, Any]
    ) -> float:
        verifier = self._verifier or self._load()
        text, logprobs, finish_reason = answer_parts(reply)
        response_format = body.get("response_format")
        return verifier.score(
            prompt_text(endpoint, body),
            text,
            logprobs=logprobs,
            response_format=response_format if isinstance(response_format, dict) else None,
            finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        )

    def _load(self) -> VerifierType:
        with self._lock:
            if self._verifier is None:
                from router.verifier import Verifier

                self._verifier = Verifier.load()
            return self._verifier
