"""What a request body asks of the gateway, read the same way by validation, budgets,
the selector and the upstream calls: output tokens per answer, the answers billed, and
the fields that cap an answer's length; and the `Call`, the request object the pipeline
passes from the proxy to the cascade, the accounting and the stream it relays."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.billing.tokens import PromptCounts, prompt_list
from gateway.upstreams.base import EndpointType

if TYPE_CHECKING:  # types only: the pipeline and the native room are above this module
    from gateway.ledger import SpendRecord
    from gateway.ledger.record import SurfaceType
    from gateway.native import NativeCall
    from gateway.runtime import RouteRuntime
    from router.target_selection import Choice

# Whether the request being served was cancelled because its client hung up before its
# answer (`gateway.http.disconnects` sets it per request): the ledger records such a
# request as `cancelled`, not as the gateway's `error`.
client_left: ContextVar[Callable[[], bool]] = ContextVar("client_left", default=lambda: False)


def client_hung_up() -> bool:
    return client_left.get()()


# Tool types that name a remote MCP server: the Responses API's `mcp`, and what litellm
# turns into Anthropic's `mcp_servers` from a chat request (`mcp`, `url`).
REMOTE_MCP_TOOLS = frozenset({"mcp", "url"})


def remote_mcp_field(body: Mapping[str, Any]) -> str | None:
    """The field of a request body that names remote MCP servers (which the provider
    would connect to on the deployment's key), if any: `mcp_servers`, or `tools[i]`."""
    if body.get("mcp_servers"):
        return "mcp_servers"
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            if isinstance(tool, Mapping) and tool.get("type") in REMOTE_MCP_TOOLS:
                return f"tools[{i}]"
    return None


# The most output tokens one request may ask for: per choice, and over all its choices
# (prompts x n or best_of x max tokens). Beyond any model's context, far inside int64.
MAX_OUTPUT_TOKENS = 10_000_000
MAX_TOKEN_FIELDS = ("max_completion_tokens", "max_tokens")


def asked_tokens(body: Mapping[str, Any]) -> int | None:
    """The most output tokens per answer the client asks for (None: it sets none);
    `max_completion_tokens` first, as OpenAI reads it."""
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    return asked if isinstance(asked, int) and asked > 0 else None


def output_cap(endpoint: EndpointType, body: Mapping[str, Any], cap: int) -> dict[str, int]:
    """The max-token fields to set so that no answer runs past `cap` tokens: the
    client's own fields where they ask for more, else the endpoint's field (chat:
    `max_completion_tokens`, which every OpenAI chat model takes)."""
    if endpoint == "embeddings":
        return {}
    present = [f for f in MAX_TOKEN_FIELDS if body.get(f) is not None]
    if not present:
        return {"max_completion_tokens" if endpoint == "chat" else "max_tokens": cap}
    return {f: cap for f in present if body[f] > cap}


def choices_of(endpoint: EndpointType, body: Mapping[str, Any]) -> int:
    """How many answers a request is billed for: `n` (a completion's `best_of` when
    larger: each is generated), times a completion's prompts."""
    n = body.get("n") or 1
    if endpoint != "completions":
        return int(n)
    best_of = body.get("best_of") or 1
    return max(int(n), int(best_of)) * len(prompt_list(body.get("prompt")))


@dataclass(slots=True)
class Call:
    """One request as the pipeline carries it: who asked (`team`, `key`), what (the
    `endpoint` and its validated `body`), of which route, by when (`deadline_s`), and
    what the plan made of it. Its first fields are the fixed part of every record.

    Set once after it is built, by the proxy, in this order: `choice` (a `select`
    route's plan), `deadline_s` (the time left once the plan is made), and `body`,
    replaced by the capped copy admission returns (`admission.cap`: the upstreams are
    asked for no more output than was held). A cascade's upstreams get the body
    without its stream fields (its answer is verified whole, then replayed)."""

    request_id: str
    team: str
    key: str
    route: RouteRuntime
    stream: bool
    started: float  # time.perf_counter() at arrival
    score: float | None = None  # the router's complexity score, on scored routes
    choice: Choice | None = None  # a `select` route's predicted qualities and target
    surface: SurfaceType = "chat"  # the API the client called, for its records
    # A bridged API's request as the client sent it, for deployments serving its wire
    # format natively (`gateway.native`); None: every deployment gets the chat form.
    native: NativeCall | None = None
    endpoint: EndpointType = field(kw_only=True)
    body: dict[str, Any] = field(kw_only=True)  # what the upstreams are sent
    # Seconds the upstreams have, from when the plan was made (0.0: not set yet).
    deadline_s: float = field(default=0.0, kw_only=True)
    prompt: PromptCounts = field(default_factory=PromptCounts)  # counted once per encoding
    # Every attempt priced so far (escalations and hedges too): what budgets settle.
    records: list[SpendRecord] = field(default_factory=list)

    @property
    def cost_nanos(self) -> int:
        """What the request has paid for so far: every attempt priced (`records`)."""
        return sum(r.cost_nanos for r in self.records)
