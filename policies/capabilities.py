"""What a deployment serves: endpoints and request features, and the defaults per kind.

A deployment's `capabilities` in the policy say what it serves; left out, the default
of its kind applies (the first row that matches):

    kind                                   default capabilities
    engine of kind cpu (embedded engine)   chat, completions (+ embeddings with the
                                           `embeddings` extra installed: MiniLM)
    engine of kind vllm                    chat, completions, json_schema (+ tools when
                                           extra_args has --enable-auto-tool-choice)
    provider openai (OpenAI, or any        chat, completions, embeddings, tools, vision,
    OpenAI-compatible server)              json_schema: the upstream decides per model
    provider anthropic                     chat, tools, vision, json_schema, messages
    any other provider (through litellm)   chat, tools, vision, json_schema

    default_capabilities(deployment.provider, engine, embeddings_installed=True)

`remote_mcp` lets requests that name remote MCP servers (`mcp_servers`, a Responses
`mcp` tool) reach a native deployment: only the policy grants it.

`responses` and `messages` say a deployment serves that API's wire format natively
(OpenAI's Responses API at `{api_base}/responses`, Anthropic's Messages API): requests
to /v1/responses or /v1/messages reach it untranslated, the others get them bridged to
chat. Only the policy grants `responses`; only Anthropic deployments default to
`messages`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

from policies.engines import EngineSpec

CapabilityType = Literal[
    "chat",
    "completions",
    "embeddings",
    "tools",
    "vision",
    "json_schema",
    "responses",
    "messages",
    "remote_mcp",
]
CAPABILITIES: tuple[CapabilityType, ...] = get_args(CapabilityType)
# Wire formats a deployment may serve natively (the gateway's bridges serve them too).
NATIVE_FORMATS = frozenset({"responses", "messages"})
# Granted by the policy only, never by default: remote MCP servers a client names (the
# Messages API's `mcp_servers`, a Responses `mcp` tool), which the provider connects to
# on the company's key: what a client could reach that way is the ops team's call.
GRANTED_ONLY = frozenset({"remote_mcp"})
# What an OpenAI-compatible server is taken to serve: every endpoint and feature, no
# other API's wire format.
OPENAI_SERVES = frozenset(CAPABILITIES) - NATIVE_FORMATS - GRANTED_ONLY
# Features of a chat request: a deployment serving them must serve chat.
CHAT_FEATURES = frozenset({"tools", "vision", "json_schema"})

OPENAI_COMPATIBLE = "openai"
ANTHROPIC = "anthropic"
AUTO_TOOL_CHOICE_FLAG = "--enable-auto-tool-choice"

# Defaults by kind: an engine's kind, `openai` for OpenAI-compatible servers, and
# `litellm` for every other provider.
DEFAULTS: dict[str, frozenset[str]] = {
    "cpu": frozenset({"chat", "completions"}),
    "vllm": frozenset({"chat", "completions", "json_schema"}),
    OPENAI_COMPATIBLE: OPENAI_SERVES,
    ANTHROPIC: frozenset({"chat", "tools", "vision", "json_schema", "messages"}),
    "litellm": frozenset({"chat", "tools", "vision", "json_schema"}),
}


def default_capabilities(
    provider: str, engine: EngineSpec | None, *, embeddings_installed: bool
) -> frozenset[str]:
    """What a deployment serves when the policy does not say; `embeddings_installed`:
    whether the embedded engine can load MiniLM (the `embeddings` extra)."""
    if engine is not None:
        served = DEFAULTS[engine.kind]
        if engine.kind == "cpu" and embeddings_installed:
            served |= {"embeddings"}
        if engine.kind == "vllm" and _flagged(engine.extra_args, AUTO_TOOL_CHOICE_FLAG):
            served |= {"tools"}
        return served
    return DEFAULTS[provider if provider in (OPENAI_COMPATIBLE, ANTHROPIC) else "litellm"]


def _flagged(args: Iterable[str], flag: str) -> bool:
    return any(arg.split("=", 1)[0] == flag for arg in args)
