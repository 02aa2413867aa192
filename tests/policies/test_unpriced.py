"""A zero price is no price: as a route's reference it is refused like any unpriced
reference, and a `select` route, which ranks its deployments by price, refuses any
deployment it could not price (it would rank as free and take the route's traffic).
Through `policy check`, the loader and a hot reload, each located FILE:LINE:COL."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.runtime import build_runtime
from policies import LoadedPolicy, PolicyError, PolicyReloader, load_policy
from policies.errors import Problem

POLICY = """\
deployments:
  cheap:
    model: small-model
    api_base: http://127.0.0.1:9/v1
    tier: cheap
    price: {input_per_mtok: 0.1, output_per_mtok: 0.2}
  premium:
    model: big-model
    api_base: http://127.0.0.1:9/v1
    tier: premium
    price: {input_per_mtok: 5, output_per_mtok: 15}
  known: {model: gpt-4o-mini, api_base: "http://127.0.0.1:9/v1"}
  local:
    model: qwen
    api_base: http://127.0.0.1:9/v1
    tier: local
    price: {input_per_mtok: 0.01, output_per_mtok: 0.01}
  gpu:
    model: qwen-b
    api_base: http://127.0.0.1:9/v1
    self_hosted: {gpu_hour_usd: 2, tokens_per_second: 500}
routes:
  auto:
    deployments: [cheap, premium]
    reference_model: premium
  pick:
    strategy: select
    deployments: [local, gpu, known, cheap, premium]
    reference_model: premium
"""
ZERO = "price: {input_per_mtok: 0, output_per_mtok: 0}"


def write(directory: Path, text: str) -> Path:
    path = directory / "policy.yaml"
    path.write_text(text)
    return path


def position(text: str, needle: str, after: str = "") -> tuple[int, int]:
    """The 1-based line and column of `needle`, first found after `after`."""
    start = text.index(after) if after else 0
    at = text.index(needle, start)
    line = text.count("\n", 0, at) + 1
    return line, at - text.rfind("\n", 0, at)


def problems(path: Path) -> list[Problem]:
    with pytest.raises(PolicyError) as caught:
        load_policy(path, env={})
    return caught.value.problems


def test_priced_select_candidates_and_reference_pass(tmp_path: Path) -> None:
    """A local engine with an explicit positive price, a self-hosted GPU cost and a
    model litellm prices all rank by what they cost."""
    assert load_policy(write(tmp_path, POLICY), env={}).policy.routes["pick"]


def test_a_zero_priced_reference_fails_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = POLICY.replace("price: {input_per_mtok: 5, output_per_mtok: 15}", ZERO)
    path = write(tmp_path, text)
    assert main(["policy", "check", str(path)]) == 1
    err = capsys.readouterr().err
    line, column = position(text, "premium", after="reference_model: ")
    assert f"{path}:{line}:{column}: routes.auto.reference_model: " in err
    assert "route 'auto' has reference_model 'premium', a deployment with no price" in err
    assert "a zero price is no price" in err


LOCAL_PRICE = "    price: {input_per_mtok: 0.01, output_per_mtok: 0.01}\n"
UNPRICED_LOCAL = {
    "zero": ((LOCAL_PRICE, f"    {ZERO}\n"), "its price is zero, and a zero price is no price"),
    "none": ((LOCAL_PRICE, ""), "litellm's price map does not know 'qwen'"),
    "unknown": ((LOCAL_PRICE, "    pricing_model: qwen-typo\n"), "does not know 'qwen-typo'"),
}


@pytest.mark.parametrize(("edit", "why"), UNPRICED_LOCAL.values(), ids=UNPRICED_LOCAL)
def test_an_unpriced_select_candidate_is_a_located_error(
    tmp_path: Path, edit: tuple[str, str], why: str
) -> None:
    text = POLICY.replace(*edit)
    [problem] = problems(write(tmp_path, text))
    line, column = position(text, "local", after="strategy: select")
    assert (problem.line, problem.column) == (line, column)
    assert problem.field == "routes.pick.deployments.0"
    assert "route 'pick' (strategy select) ranks its deployments by price" in problem.message
    assert "'local' has none" in problem.message and why in problem.message


def test_an_unpriced_deployment_outside_select_routes_still_loads(tmp_path: Path) -> None:
    """Only a select route ranks by price: elsewhere an unpriced model serves, costed 0
    and counted as unpriced."""
    text = POLICY.replace("price: {input_per_mtok: 0.1, output_per_mtok: 0.2}", ZERO)
    text = text.replace("deployments: [local, gpu, known, cheap, premium]", "deployments: [local]")
    loaded = load_policy(write(tmp_path, text), env={})
    runtime = build_runtime(loaded)
    assert not runtime.deployments["cheap"].price.priced  # zero: unpriced, not free
    assert any("'cheap' has a zero price" in message for _, message in runtime.warnings)


async def test_a_reload_with_an_unpriced_select_candidate_keeps_the_last_good_policy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, POLICY)
    applied: list[LoadedPolicy] = []
    initial = load_policy(path, env={})
    reloader = PolicyReloader(path, applied.append, env={}, initial=initial)
    # A zero price wins over its GPU cost, as any policy price does: it is unpriced.
    gpu_cost = "self_hosted: {gpu_hour_usd: 2, tokens_per_second: 500}"
    text = POLICY.replace(gpu_cost, f"{gpu_cost}\n    {ZERO}")
    write(tmp_path, text)
    with caplog.at_level(logging.ERROR, logger="policies.reloader"):
        assert await reloader.check_now() is False
    assert applied == [] and reloader.current is initial
    line, column = position(text, "gpu", after="strategy: select")
    error = str(reloader.last_error)
    assert f"{path}:{line}:{column}: routes.pick.deployments.1: " in error
    assert "'gpu' has none (its price is zero" in error
