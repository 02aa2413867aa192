"""Every number in a policy is finite and bounded, so what `policy check`, `serve` and a
reload accept also works where it is used (nano-dollars, milliseconds, a request's JSON)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from gateway.billing.pricing import policy_price, self_hosted_price
from gateway.ledger.record import to_nanos
from gateway.limits.limiter import HOLD_GRACE_S
from gateway.limits.rules import RuleBook
from policies import LoadedPolicy, PolicyError, PolicyReloader, load_policy
from policies.access import Budget
from policies.schema import Deployment, GatewaySection, Policy, Price, Route, SelfHosted
from policies.section import MAX_COUNT, MAX_SECONDS

INT64_MAX = 2**63 - 1
MINIMAL = """\
deployments:
  a:
    model: m
    api_base: http://127.0.0.1:9/v1
routes:
  auto:
    deployments: [a]
"""
# A number nobody means: infinite, not a number, past any real setting, or too small.
BUDGET = "budgets: [{scope: team, name: default, period: day, limit_usd: %s}]"
REFUSED = [
    (BUDGET % "1e300", "budgets.0.limit_usd"),
    (BUDGET % ".inf", "budgets.0.limit_usd"),
    (BUDGET % ".nan", "budgets.0.limit_usd"),
    ("gateway: {request_timeout_s: .inf}", "gateway.request_timeout_s"),
    ("gateway: {reload_interval_s: .inf}", "gateway.reload_interval_s"),
    ("gateway: {reload_interval_s: 0.0001}", "gateway.reload_interval_s"),
    ("gateway: {load_scrape_interval_s: 0.001}", "gateway.load_scrape_interval_s"),
    ("gateway: {circuit_breaker: {cooldown_s: 1e9}}", "gateway.circuit_breaker.cooldown_s"),
    ("gateway: {max_body_bytes: 100000000000}", "gateway.max_body_bytes"),
    ("keys: {k: {hash: '${H}', rate_limit: {tokens_per_minute: 10000000000000000}}}",
     "keys.k.rate_limit.tokens_per_minute"),
    ("engines: {e: {model: m, port: 8100, health_interval_s: 0.0001}}",
     "engines.e.health_interval_s"),
    ("engines: {e: {model: m, port: 8100, max_model_len: 10000000000}}",
     "engines.e.max_model_len"),
]  # fmt: skip
# The same in a deployment or a route: (field, YAML value).
REFUSED_INSIDE = [
    ("deployments.a", "timeout_s", ".inf"),
    ("deployments.a", "price", "{input_per_mtok: .inf, output_per_mtok: 1}"),
    ("deployments.a", "self_hosted", "{gpu_hour_usd: 2, tokens_per_second: 1e-300}"),
    ("deployments.a", "max_output_tokens", str(10**40)),
    ("routes.auto", "max_output_tokens", str(10**40)),
    ("routes.auto", "sla", "{ttft_ms: .nan}"),
]
# The most (or least) each kind of number may be: a real setting is never refused.
EXTREMES = """\
deployments:
  a:
    model: m
    api_base: http://127.0.0.1:9/v1
    timeout_s: 2592000
    max_output_tokens: 1000000000
    price: {input_per_mtok: 1000000, output_per_mtok: 1000000, cache_write_per_mtok: 1000000}
  b:
    model: m
    api_base: http://127.0.0.1:9/v1
    self_hosted: {gpu_hour_usd: 1000000, tokens_per_second: 0.01}
routes:
  auto:
    deployments: [a, b]
    max_output_tokens: 1000000000
    max_body_bytes: 1073741824
    sla: {timeout_ms: 2592000000, hedge_after_ms: 2592000000}
budgets:
  - {scope: team, name: default, period: month, limit_usd: 1000000000, soft_limit_usd: 1000000000}
keys:
  k:
    hash: '${H}'
    rate_limit: {requests_per_minute: 1000000000000000, tokens_per_minute: 1000000000000000}
gateway: {request_timeout_s: 2592000, reload_interval_s: 0.1, load_scrape_interval_s: 0.05}
"""  # fmt: skip


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def inside(section: str, field: str, value: str) -> str:
    """MINIMAL with `field: value` added to the deployment or route `section` names."""
    anchor = "    model: m\n" if section.startswith("deployments") else "    deployments: [a]\n"
    return MINIMAL.replace(anchor, f"{anchor}    {field}: {value}\n")


@pytest.mark.parametrize(("text", "field"), REFUSED, ids=[field for _, field in REFUSED])
def test_check_refuses_a_number_nobody_means_naming_its_place(
    tmp_path: Path, text: str, field: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(write(tmp_path, MINIMAL + text + "\n"), env={})
    [problem] = caught.value.problems
    assert problem.field == field
    assert (problem.line, problem.column) != (None, None)


@pytest.mark.parametrize(
    ("section", "field", "value"), REFUSED_INSIDE, ids=[f"{s}.{f}" for s, f, _ in REFUSED_INSIDE]
)
def test_check_refuses_an_unbounded_number_in_a_deployment_or_route(
    tmp_path: Path, section: str, field: str, value: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(write(tmp_path, inside(section, field, value)), env={})
    [problem] = caught.value.problems
    assert problem.field.startswith(f"{section}.{field}")
    assert problem.line is not None


def test_the_extremes_load_and_serve(tmp_path: Path) -> None:
    """At every bound the gateway starts: prices, budgets and limits convert."""
    from gateway.runtime import build_runtime

    loaded = load_policy(write(tmp_path, EXTREMES), env={"H": "sha256:" + "0" * 64})
    runtime = build_runtime(loaded)
    [[rule]] = RuleBook.build(loaded.policy).budgets.values()
    assert rule.limit_nanos == 10**18
    priced, hosted = (d.price for d in runtime.deployments.values())
    assert priced.worst_case_nanos(MAX_COUNT, MAX_COUNT) == 2 * 10**18  # within int64
    assert hosted.worst_case_nanos(MAX_COUNT, MAX_COUNT) > 0  # finite


async def test_a_reload_refuses_an_infinite_number_and_the_last_good_policy_serves(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, MINIMAL)
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(path, applied.append, env={}, initial=load_policy(path, env={}))
    path.write_text(MINIMAL + "gateway: {reload_interval_s: .inf}\n")
    assert await reloader.check_now() is False
    assert applied == []
    assert reloader.last_error is not None
    assert "gateway.reload_interval_s" in str(reloader.last_error)


def test_every_number_in_the_schema_has_an_upper_bound() -> None:
    """A new numeric field needs a bound too (and gets `.inf` refused by `Section`)."""
    unbounded = [
        f"{model}.{name}"
        for model, name, spec in numeric_properties(Policy.model_json_schema())
        if "maximum" not in spec and "exclusiveMaximum" not in spec
    ]
    assert unbounded == []


def numeric_properties(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for model, definition in schema["$defs"].items():
        for name, spec in definition.get("properties", {}).items():
            for option in spec.get("anyOf", [spec]):
                if option.get("type") in ("number", "integer"):
                    yield model, name, option


NUMBERS = (
    st.floats()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.sampled_from([1e300, -0.0, 5e-324, 2**63, 10**9, 10**9 + 1, MAX_SECONDS + 1e-4])
)


def accepted(model: type[BaseModel], data: dict[str, Any]) -> Any:
    """`model` validated from `data`, or None when the schema refuses it."""
    try:
        return model.model_validate(data)
    except ValidationError:
        return None


@settings(max_examples=300, deadline=None)
@given(first=NUMBERS, second=NUMBERS)
def test_what_the_schema_accepts_converts_where_it_is_used(first: Any, second: Any) -> None:
    """Dollars to nano-dollars (a budget's limit, a request's worst case), seconds to
    milliseconds, token counts into a request's JSON: none overflows."""
    if budget := accepted(
        Budget, {"scope": "team", "name": "t", "period": "day", "limit_usd": first}
    ):
        assert 0 <= to_nanos(budget.limit_usd) <= INT64_MAX
    if price := accepted(Price, {"input_per_mtok": first, "output_per_mtok": second}):
        assert 0 <= policy_price(price).worst_case_nanos(MAX_COUNT, MAX_COUNT) <= INT64_MAX
    if hosted := accepted(SelfHosted, {"gpu_hour_usd": first, "tokens_per_second": second}):
        rate = self_hosted_price(hosted.gpu_hour_usd, hosted.tokens_per_second)
        assert isinstance(rate.worst_case_nanos(MAX_COUNT, MAX_COUNT), int)
    if deployment := accepted(Deployment, {"model": "m", "timeout_s": first}):
        assert int(deployment.timeout_s * 1000) >= 0
    if gateway := accepted(GatewaySection, {"request_timeout_s": first}):
        assert int((gateway.request_timeout_s + HOLD_GRACE_S) * 1000) > 0
    if gateway := accepted(GatewaySection, {"reload_interval_s": first}):
        assert 0.1 <= gateway.reload_interval_s <= MAX_SECONDS
    if route := accepted(Route, {"deployments": ["a"], "max_output_tokens": first}):
        assert orjson.dumps({"max_tokens": route.max_output_tokens})
    for number in (first, second):
        if isinstance(number, float) and not math.isfinite(number):
            assert accepted(Deployment, {"model": "m", "retry_backoff_s": number}) is None
