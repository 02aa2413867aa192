"""Capability-aware routing: what a request needs, what a deployment serves (declared or
by default), the planner skipping deployments that lack it, and the gateway's own 400
when no deployment of the route may serve it."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from gateway.cli import main
from gateway.pipeline.capabilities import required
from gateway.pipeline.proxy import DECISIONS_LOGGER
from gateway.runtime import build_runtime
from policies import DEFAULT_POLICY_PATH, load_policy
from policies.capabilities import CAPABILITIES, default_capabilities
from policies.engines import EngineSpec
from policies.schema import Deployment
from router import DeploymentView, RouteSpec, plan_route
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import StartGateway

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
HELLO = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("endpoint", "body", "needs"),
    [
        ("chat", {"messages": HELLO}, {"chat": "model"}),
        ("chat", {"messages": HELLO, "tools": [TOOL]}, {"chat": "model", "tools": "tools"}),
        ("chat", {"messages": HELLO, "tools": []}, {"chat": "model"}),
        (
            "chat",
            {"messages": HELLO, "functions": [{"name": "f"}]},
            {"chat": "model", "tools": "functions"},
        ),
        (
            "chat",
            {"messages": HELLO, "tool_choice": "required"},
            {"chat": "model", "tools": "tool_choice"},
        ),
        ("chat", {"messages": HELLO, "tool_choice": "none"}, {"chat": "model"}),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "?"}, IMAGE]}]},
            {"chat": "model", "vision": "messages"},
        ),
        (
            "chat",
            {"messages": HELLO, "response_format": SCHEMA},
            {"chat": "model", "json_schema": "response_format"},
        ),
        ("chat", {"messages": HELLO, "response_format": {"type": "text"}}, {"chat": "model"}),
        # Types that are not strings (found by the fuzzer: a 500 before) need nothing.
        ("chat", {"messages": HELLO, "response_format": {"type": {}}}, {"chat": "model"}),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": ["image_url"]}]}]},
            {"chat": "model"},
        ),
        ("completions", {"prompt": "x", "tools": [TOOL]}, {"completions": "model"}),
        ("embeddings", {"input": "x"}, {"embeddings": "model"}),
    ],
)
def test_what_a_request_needs(endpoint: Any, body: dict[str, Any], needs: dict[str, str]) -> None:
    assert required(endpoint, body) == needs


def test_capabilities_are_validated_with_the_field_named() -> None:
    with pytest.raises(ValidationError, match="unknown capability 'tool'; did you mean 'tools'"):
        Deployment.model_validate({"model": "m", "capabilities": ["chat", "tool"]})
    with pytest.raises(ValidationError, match="has tools but not chat"):
        Deployment.model_validate({"model": "m", "capabilities": ["tools"]})
    with pytest.raises(ValidationError, match="capabilities is empty"):
        Deployment.model_validate({"model": "m", "capabilities": []})
    with pytest.raises(ValidationError, match="name chat more than once"):
        Deployment.model_validate({"model": "m", "capabilities": ["chat", "chat"]})
    assert Deployment.model_validate(
        {"model": "m", "capabilities": ["embeddings"]}
    ).capabilities == ["embeddings"]


def test_defaults_per_provider_and_engine_kind() -> None:
    cpu = EngineSpec.model_validate({"kind": "cpu", "port": 8001})
    vllm = EngineSpec.model_validate({"kind": "vllm", "model": "m", "port": 8100})
    tools_vllm = EngineSpec.model_validate(
        {
            "kind": "vllm",
            "model": "m",
            "port": 8100,
            "extra_args": ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        }
    )
    assert default_capabilities("openai", cpu, embeddings_installed=False) == {
        "chat",
        "completions",
    }
    assert "embeddings" in default_capabilities("openai", cpu, embeddings_installed=True)
    assert default_capabilities("openai", vllm, embeddings_installed=True) == {
        "chat",
        "completions",
        "json_schema",
    }
    assert "tools" in default_capabilities("openai", tools_vllm, embeddings_installed=False)
    # Every endpoint and feature, no other API's wire format, nor remote MCP servers
    # (those the policy grants).
    assert default_capabilities("openai", None, embeddings_installed=False) == set(CAPABILITIES) - {
        "responses",
        "messages",
        "remote_mcp",
    }
    assert default_capabilities("anthropic", None, embeddings_installed=False) == {
        "chat",
        "tools",
        "vision",
        "json_schema",
        "messages",  # Anthropic's own Messages API, served natively
    }
    assert default_capabilities("bedrock", None, embeddings_installed=False) == {
        "chat",
        "tools",
        "vision",
        "json_schema",
    }


def test_the_planner_skips_what_does_not_serve_the_request_in_every_strategy() -> None:
    local = DeploymentView("local", "cheap", None, frozenset({"chat", "completions"}))
    paid = DeploymentView("paid", "premium", None, frozenset({"chat", "tools"}))
    for strategy in ("fallback", "cascade"):
        spec = RouteSpec("auto", strategy, [local, paid], needs=frozenset({"chat", "tools"}))
        plan = plan_route(spec)
        assert [s.deployment for s in plan.steps] == ["paid"]
        assert ("local", "does not serve tools") in plan.skipped
        assert "the request needs chat, tools" in plan.reasons()
    untyped = DeploymentView("any", "cheap")  # no capabilities known: serves anything
    spec = RouteSpec("r", "fixed", [untyped], needs=frozenset({"vision"}))
    assert [s.deployment for s in plan_route(spec).steps] == ["any"]


def test_the_default_policy_declares_what_its_deployments_serve() -> None:
    deployments = build_runtime(load_policy(DEFAULT_POLICY_PATH, env={})).deployments
    assert deployments["openai-gpt-4o-mini"].capabilities == {
        "chat",
        "tools",
        "vision",
        "json_schema",
    }
    assert "tools" not in deployments["local-cpu"].capabilities
    assert "embeddings" in deployments["local-cpu"].capabilities  # the embeddings extra is here
    assert deployments["openai-gpt-4o"].unset_env == ("OPENAI_API_KEY",)


def test_no_keys_a_tools_request_gets_the_gateways_own_400(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    base = start_gateway(
        DEFAULT_POLICY_PATH, LOCAL_ENGINE_URL=fake_openai.url, LOCAL_ENGINE_AUTOSTART="false"
    ).url
    caplog.set_level(logging.INFO, logger=DECISIONS_LOGGER)
    body = {"model": "auto", "messages": HELLO, "tools": [TOOL]}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "capability_unavailable"
    assert error["param"] == "tools"
    assert error["message"] == (
        "route 'auto' has no deployment that serves tools: openai-gpt-4o-mini, openai-gpt-4o "
        "(set OPENAI_API_KEY), anthropic-claude-sonnet (set ANTHROPIC_API_KEY) would"
    )
    assert fake_openai.requests == []  # the engine was never asked
    image = [{"role": "user", "content": [IMAGE]}]
    response = httpx.post(
        f"{base}/v1/chat/completions", json={"model": "auto", "messages": image}, timeout=30
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"
    assert "serves vision" in response.json()["error"]["message"]
    assert any("skip 'local-cpu': does not serve tools" in r.message for r in caplog.records)


def test_with_a_key_tools_go_to_the_paid_tier(
    start_gateway: StartGateway, fake_openai: FakeOpenAI
) -> None:
    with FakeOpenAI() as paid:
        base = start_gateway(
            DEFAULT_POLICY_PATH,
            LOCAL_ENGINE_URL=fake_openai.url,
            LOCAL_ENGINE_AUTOSTART="false",
            OPENAI_API_KEY="fake-openai-key",
            OPENAI_BASE_URL=paid.url,
        ).url
        body = {"model": "auto", "messages": HELLO, "tools": [TOOL], "tool_choice": "required"}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert response.headers["x-cascade-tier"] == "premium-small"
        assert fake_openai.requests == []
        assert paid.requests[0]["body"]["model"] == "gpt-4o-mini"
        assert paid.requests[0]["body"]["tools"] == [TOOL]
        # A tool call has no text to verify: the cascade takes its tiers in order and
        # keeps the first answer rather than paying every tier for it.
        assert response.json()["choices"][0]["message"]["tool_calls"]
        assert response.headers["x-cascade-escalations"] == "0"
        assert len(paid.requests) == 1


def test_policy_explain_says_what_each_deployment_serves_and_what_it_skips(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["policy", "explain", str(DEFAULT_POLICY_PATH), "--prompt", "hi", "--needs", "tools"]
    assert main(args) == 0
    reasons = json.loads(capsys.readouterr().out)["reasons"]
    assert "the request needs chat, tools" in reasons
    assert "skip 'local-cpu': does not serve tools" in reasons
    assert "'anthropic-claude-sonnet' serves chat, json_schema, messages, tools, vision" in reasons
    with pytest.raises(SystemExit):
        main([*args[:-1], "tool"])
    assert "unknown capability tool" in capsys.readouterr().err


def test_without_the_embeddings_extra_the_400_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the defaults installed with `[engine]` only, nothing serves embeddings: the
    gateway's answer says the embedded engine would, with the extra."""
    import gateway.runtime
    from gateway.pipeline import capabilities as module

    def missing() -> str:
        return "it needs the extra (pip install x)"

    monkeypatch.setattr(gateway.runtime, "embeddings_missing", missing)
    monkeypatch.setattr(module, "embeddings_missing", missing)
    runtime = build_runtime(load_policy(DEFAULT_POLICY_PATH, env={}))
    route = runtime.routes["auto"]
    error = module.unserved(runtime, route, {"embeddings": "model"})
    assert error.status == 400 and error.param == "model"
    assert error.message.endswith(
        "the embedded CPU engine would serve embeddings, but it needs the extra (pip install x)"
    )
