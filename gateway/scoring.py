"""The router's complexity score for a request body, for routes that route by score.

The classifier is loaded on first use (routes without scoring never pay for it) and
then kept; scoring is numpy-only and sub-millisecond, so it runs inline.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from gateway.upstreams.base import EndpointType


class ClassifierType(Protocol):
    def score(self, messages: list[dict[str, Any]], **request_fields: Any) -> float: ...


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
        return classifier.score(
            request_messages(endpoint, body),
            tools=body.get("tools"),
            response_format=body.get("response_format"),
            max_tokens=body.get("max_tokens") or body.get("max_completion_tokens"),
        )

    def _load(self) -> ClassifierType:
        with self._lock:
            if self._classifier is None:
                from router.classifier import Classifier

                self._classifier = Classifier.load()
            return self._classifier
