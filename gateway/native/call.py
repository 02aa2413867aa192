"""One request of a bridged API as the deployments that serve its wire format natively
get it: the client's own body, with the deployment's model and the gateway's caps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.native.formats import OUTPUT_LIMIT_FIELD, NativeSurface
from gateway.request import MAX_TOKEN_FIELDS, remote_mcp_field

if TYPE_CHECKING:
    from gateway.runtime import DeploymentRuntime


@dataclass(frozen=True, slots=True)
class NativeCall:
    """A request to /v1/responses or /v1/messages, for the deployments that serve
    `surface` natively (the capability of that name); the others get its chat form.

    `required_by`: the request field only a native deployment can serve (the Responses
    API's stored state: `previous_response_id`, `store: true`, ...), so the request
    needs one; None when native is a preference only. `headers`: the client's headers
    passed on (`anthropic-version`, `anthropic-beta`)."""

    surface: NativeSurface
    body: Mapping[str, Any]
    required_by: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def serves(self, deployment: DeploymentRuntime) -> bool:
        """Does `deployment` get the request untranslated?"""
        return self.surface in deployment.capabilities

    def needs(self, chat_needs: dict[str, str]) -> dict[str, str]:
        """What the request needs of a deployment (capability -> the field asking for
        it): its chat form's needs, unless only a native deployment can serve it; and
        `remote_mcp` when it names remote MCP servers (the policy must grant that)."""
        if self.required_by is None:
            return chat_needs
        needs: dict[str, str] = {self.surface: self.required_by}
        if mcp := remote_mcp_field(self.body):
            needs["remote_mcp"] = mcp
        return needs

    def body_for(self, deployment: DeploymentRuntime, sent: Mapping[str, Any]) -> dict[str, Any]:
        """The client's body for `deployment`: its model, streamed as `sent` (the chat
        form the pipeline sends: a cascade buffers streams), and asking for no more
        output than `sent` or the deployment allows (budgets cap the chat form)."""
        body = {**self.body, "model": deployment.target.model}
        if sent.get("stream"):
            body["stream"] = True
        else:
            body.pop("stream", None)
        limits = [sent[f] for f in MAX_TOKEN_FIELDS if isinstance(sent.get(f), int)]
        if deployment.max_output_tokens is not None:
            limits.append(deployment.max_output_tokens)
        name = OUTPUT_LIMIT_FIELD[self.surface]
        asked = body.get(name)
        if limits and (not isinstance(asked, int) or asked > min(limits)):
            body[name] = min(limits)
        return body
