"""What a request needs of a deployment (its capabilities), read from endpoint and body.

    endpoint chat / completions / embeddings      chat / completions / embeddings
    tools, functions, tool_choice, function_call  tools
    an image part in a message                    vision
    response_format json_schema or json_object    json_schema
    mcp_servers, a tool of type mcp or url        remote_mcp (granted by the policy only)

    needs = required(endpoint, body)   # {"chat": "model", "tools": "tools"}

A bridged request (/v1/responses, /v1/messages) needs what its chat form needs, unless
it uses state only a native deployment keeps: then `responses` alone
(`gateway.native.NativeCall.needs`).

Each capability maps to the request field that asks for it, named in `param` when no
deployment of the route serves it (`unserved`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.errors import CapabilityUnavailable
from gateway.request import remote_mcp_field
from gateway.runtime import DeploymentRuntime, RouteRuntime, Runtime
from gateway.upstreams.base import EndpointType
from local_engine.sentence_model import missing as embeddings_missing

TOOL_FIELDS = ("tools", "functions", "tool_choice", "function_call")
IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
JSON_FORMATS = frozenset({"json_schema", "json_object"})


def required(endpoint: EndpointType, body: Mapping[str, Any]) -> dict[str, str]:
    """Capability -> the request field that needs it (`model` for the endpoint itself)."""
    needs: dict[str, str] = {endpoint: "model"}
    if endpoint != "chat":
        return needs
    tool_field = next((name for name in TOOL_FIELDS if _asks_tools(body.get(name))), None)
    if tool_field is not None:
        needs["tools"] = tool_field
    if _has_image(body.get("messages")):
        needs["vision"] = "messages"
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and _kind(response_format) in JSON_FORMATS:
        needs["json_schema"] = "response_format"
    if mcp := remote_mcp_field(body):  # litellm makes Anthropic's `mcp_servers` of these
        needs["remote_mcp"] = mcp
    return needs


def unserved(
    runtime: Runtime, route: RouteRuntime, needs: Mapping[str, str]
) -> CapabilityUnavailable:
    """The error for a request none of whose route's deployments may serve: what it
    needs, and which deployments would serve it once configured (or where they are)."""
    wanted = frozenset(needs)
    own = [runtime.deployments[name] for name in route.deployments]
    lacking = sorted({c for d in own for c in wanted - d.capabilities} or wanted)
    capability = lacking[0] if len(lacking) == 1 else " and ".join(lacking)
    message = f"route '{route.name}' has no deployment that serves {capability}"
    if would := [d for d in own if d.serves(wanted)]:
        message += f": {_configured_by(would)} would"
    elif elsewhere := [d.name for d in runtime.deployments.values() if d.serves(wanted)]:
        message += f"; deployments that do, not on this route: {', '.join(elsewhere)}"
    else:
        message += (
            "; no deployment in the policy does: add one, or declare what a deployment "
            "serves with its `capabilities`"
        )
    if "embeddings" in lacking and (why := embeddings_missing()) is not None:
        message += f"; the embedded CPU engine would serve embeddings, but {why}"
    return CapabilityUnavailable(message, param=needs[lacking[0]], lacking=tuple(lacking))


def _configured_by(deployments: Sequence[DeploymentRuntime]) -> str:
    """`a, b (set OPENAI_API_KEY), c (set ANTHROPIC_API_KEY)`: names grouped by what
    makes them available, in route order."""
    groups: dict[str, list[str]] = {}
    for deployment in deployments:
        groups.setdefault(_setup(deployment), []).append(deployment.name)
    return ", ".join(
        ", ".join(names) + (f" ({setup})" if setup else "") for setup, names in groups.items()
    )


def _setup(deployment: DeploymentRuntime) -> str:
    if deployment.unset_env:
        return "set " + " and ".join(deployment.unset_env)
    return deployment.unavailable_reason or ""


def _asks_tools(value: object) -> bool:
    if isinstance(value, (list, dict)):
        return bool(value)
    return isinstance(value, str) and value != "none"


def _has_image(messages: object) -> bool:
    if not isinstance(messages, list):
        return False
    return any(_image_part(part) for m in messages if isinstance(m, Mapping) for part in _parts(m))


def _parts(message: Mapping[str, Any]) -> Iterable[object]:
    content = message.get("content")
    return content if isinstance(content, list) else ()


def _image_part(part: object) -> bool:
    return isinstance(part, Mapping) and _kind(part) in IMAGE_PARTS


def _kind(value: Mapping[str, Any]) -> str | None:
    """A part's or format's `type`, when it is a string (a client may send anything)."""
    kind = value.get("type")
    return kind if isinstance(kind, str) else None
