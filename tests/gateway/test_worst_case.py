"""A budget's hold is the most a request can cost: every token at its dearest class
rate (a cache write can cost more than plain input), and a verified `select` route's
climb through its dearest candidates."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.billing.pricing import ClassRates, TokenPrice
from gateway.billing.usage import TokenClasses
from gateway.limits.budgets import Output, worst_case_nanos
from gateway.runtime import build_runtime
from policies import LoadedPolicy, Policy

rates = st.floats(0, 1e-4, allow_nan=False)
optional_rates = st.none() | rates


@given(
    st.builds(
        TokenPrice, rates, rates, st.just("policy"), st.builds(ClassRates, *[optional_rates] * 7)
    ),
    st.lists(st.integers(0, 10_000), min_size=7, max_size=7),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
)
def test_no_mix_of_token_classes_costs_more_than_the_hold(
    price: TokenPrice, parts: list[int], plain_prompt: int, plain_completion: int
) -> None:
    classes = TokenClasses(*parts)
    prompt, completion = plain_prompt + classes.prompt, plain_completion + classes.completion
    assert price.cost_nanos(prompt, completion, classes) <= price.worst_case_nanos(
        prompt, completion
    )


def test_a_cache_write_dearer_than_input_is_held_at_its_rate() -> None:
    price = TokenPrice(3e-6, 15e-6, "policy", ClassRates(cache_read=0.3e-6, cache_write=3.75e-6))
    assert price.worst_case_nanos(1000, 0) == 3_750_000  # not 3,000,000
    assert price.cost_nanos(1000, 0, TokenClasses(cache_write=1000)) == 3_750_000


def test_a_verified_select_route_holds_its_dearest_climb() -> None:
    deployments = {
        name: {
            "model": name,
            "api_base": "http://127.0.0.1:9/v1",
            "price": {"input_per_mtok": usd, "output_per_mtok": usd},
        }
        for name, usd in (("a", 1), ("b", 2), ("c", 4), ("d", 8))
    }
    route = {"strategy": "select", "deployments": list(deployments), "max_escalations": 1}
    policy = Policy.model_validate(
        {
            "deployments": deployments,
            "routes": {
                "plain": route,
                "verified": {**route, "verify": True, "explore": 0},
                "exploring": {**route, "verify": True},
            },
        }
    )
    runtime = build_runtime(LoadedPolicy(policy, (), {}, "digest"))
    candidates = list(runtime.deployments.values())
    output = Output(per_choice=100, choices=1)

    def hold(name: str) -> int:
        return worst_case_nanos(candidates, "select", runtime.routes[name], 900, output, 1)

    assert hold("plain") == 8_000_000  # one answer, the dearest: 1,000 tokens at $8/Mtok
    assert hold("verified") == 12_000_000  # two answers, the two dearest
    assert hold("exploring") == 14_000_000  # and one tried first on its explore share
