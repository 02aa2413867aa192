"""What the client is told when upstreams fail: a client fault with the upstream's own
error `type`, `code` and `param` (short strings only, nothing else of its body), or
one error for a run in which every deployment failed, by what they had in common
(a 400 naming the field when none supported a parameter the request sets)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import (
    GatewayError,
    InvalidRequest,
    RateLimited,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnavailable,
)
from gateway.runtime import DeploymentRuntime
from gateway.upstreams.base import (
    UpstreamConnectFailed,
    UpstreamFailure,
    UpstreamStatus,
    UpstreamTimedOut,
    UpstreamUnsupported,
)

# What of an upstream's error body reaches the client on a client fault, and how long.
UPSTREAM_ERROR_FIELDS = ("type", "code", "param")
MAX_ERROR_FIELD_CHARS = 128


def client_fault(failure: UpstreamStatus) -> GatewayError:
    error_type = UpstreamTooLarge if failure.status == 413 else UpstreamRejected
    fields = upstream_error_fields(failure.body)
    return error_type(
        f"upstream rejected the request: {failure.message}",
        upstream_type=fields.get("type"),
        param=fields.get("param"),
        code=fields.get("code"),
    )


def upstream_error_fields(body: Any) -> dict[str, str]:
    """`type`, `code` and `param` of an upstream's OpenAI-style error body (raw bytes or
    parsed; vLLM's older flat `{"object": "error", ...}` too), those that are short
    strings; nothing else of the body is ever kept."""
    if isinstance(body, bytes | str):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError:
            return {}
    error = body.get("error") if isinstance(body, dict) else None
    if error is None and isinstance(body, dict) and body.get("object") == "error":
        error = body
    if not isinstance(error, dict):
        return {}
    return {
        name: value
        for name in UPSTREAM_ERROR_FIELDS
        if isinstance(value := error.get(name), str) and 0 < len(value) <= MAX_ERROR_FIELD_CHARS
    }


def final_error(
    candidates: list[DeploymentRuntime], failures: list[UpstreamFailure]
) -> GatewayError:
    """The error for a run whose every attempt failed; what the transports said besides
    (`UpstreamFailure.detail`: hosts, resolver errors) is kept for the log line only."""
    error = _final_error(candidates, failures)
    if any(f.detail for f in failures):
        error.detail = "; ".join(dict.fromkeys(f.logged for f in failures[-3:]))
    return error


def _final_error(
    candidates: list[DeploymentRuntime], failures: list[UpstreamFailure]
) -> GatewayError:
    if not candidates:
        return UpstreamUnavailable("no deployment is available for this route")
    summary = "; ".join(dict.fromkeys(f.message for f in failures[-3:]))  # no repeats
    names = ", ".join(d.name for d in candidates)
    unsupported = [f for f in failures if isinstance(f, UpstreamUnsupported)]
    if unsupported and len(unsupported) == len(failures):
        return unsupported_parameters(unsupported)
    # The deployments that could serve it say what happened: busy (429 and its wait),
    # timed out, down; the ones that could not are in the summary only.
    failures = [f for f in failures if not isinstance(f, UpstreamUnsupported)]
    if failures and all(f.status == 429 for f in failures):
        waits = [f.retry_after_s for f in failures if f.retry_after_s is not None]
        return RateLimited(
            f"every deployment is rate limited ({names}): {summary}",
            retry_after_s=min(waits) if waits else 1.0,
            code="upstream_rate_limited",
        )
    if failures and all(isinstance(f, UpstreamTimedOut) for f in failures):
        return UpstreamTimeout(f"every deployment timed out ({names}): {summary}")
    if failures and all(_is_unavailable(f) for f in failures):
        waits = [f.retry_after_s for f in failures if f.retry_after_s is not None]
        return UpstreamUnavailable(
            f"no deployment could take the request ({names}): {summary}",
            retry_after_s=min(waits) if waits else None,
        )
    return UpstreamError(f"every deployment failed ({names}): {summary}")


def unsupported_parameters(failures: list[UpstreamUnsupported]) -> InvalidRequest:
    """Every deployment tried lacks a parameter the request sets: the client's 400,
    naming the first such field (as OpenAI's own `unsupported_parameter` does) and who
    lacks what. Removing the field, or another route, would serve it."""
    params = list(dict.fromkeys(p for f in failures for p in f.params))
    reasons = "; ".join(dict.fromkeys(f.message for f in failures))
    if not params:
        what = "the request is not supported"
    elif len(params) == 1:
        what = f"parameter '{params[0]}' is not supported"
    else:
        named = ", ".join(f"'{p}'" for p in params)
        what = f"parameters {named} are not supported"
    return InvalidRequest(
        f"{what} by the deployments tried: {reasons}",
        param=params[0] if params else None,
        code="unsupported_parameter",
    )


def _is_unavailable(failure: UpstreamFailure) -> bool:
    return isinstance(failure, UpstreamConnectFailed) or failure.status in (429, 503, 529)
