"""A counted answer (no usage reported) is billed at most the output its upstream was
asked for: each answer's cap, the request's or the deployment's, times the answers."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from gateway.billing.tokens import count_text
from gateway.pipeline.accounting import counted_output
from gateway.runtime import DeploymentRuntime
from tests.gateway.scripted import deployment

TEXT = "word1 word2 word3 word4 word5 word6 word7 word8"  # more tokens than words


def capped(cap: int | None) -> DeploymentRuntime:
    return dataclasses.replace(deployment("a"), max_output_tokens=cap)


def test_without_a_cap_the_count_stands() -> None:
    assert counted_output(capped(None), "chat", {}, [TEXT]) == count_text("a-model", TEXT)


def test_the_smaller_cap_bounds_each_answer() -> None:
    assert counted_output(capped(None), "chat", {"max_tokens": 5}, [TEXT]) == 5
    assert counted_output(capped(3), "chat", {"max_tokens": 5}, [TEXT]) == 3
    assert counted_output(capped(3), "chat", {}, [TEXT]) == 3
    two = {"max_completion_tokens": 5, "n": 2}
    assert counted_output(capped(None), "chat", two, [TEXT, TEXT]) == 10


@given(
    texts=st.lists(st.text(max_size=40), max_size=3),
    asked=st.none() | st.integers(1, 50),
    cap=st.none() | st.integers(1, 50),
    n=st.integers(1, 3),
)
def test_the_count_is_the_tokenizer_s_within_the_caps(
    texts: list[str], asked: int | None, cap: int | None, n: int
) -> None:
    request = {"n": n, **({"max_tokens": asked} if asked is not None else {})}
    counted = sum(count_text("a-model", text) for text in texts)
    limits = [c * n for c in (asked, cap) if c is not None]
    assert counted_output(capped(cap), "chat", request, texts) == min([counted, *limits])
