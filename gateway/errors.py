"""Gateway exceptions, each carrying the OpenAI error shape it renders as.

    GatewayError                      500 api_error (never raised bare on purpose)
    ├── InvalidRequest                400 invalid_request_error (names the field in `param`)
    │   ├── PayloadTooLarge           413
    │   ├── CapabilityUnavailable     400 no deployment of the route serves what it needs
    │   └── UpstreamRejected          400/422 an upstream refused, with its type, code, param
    │       └── UpstreamTooLarge      413 (also a PayloadTooLarge)
    ├── AuthenticationFailed          401
    ├── PermissionDenied              403
    ├── NotFound                      404 (unknown model / route)
    ├── RateLimited                   429 with Retry-After (x-should-retry: false if no wait helps)
    │   └── BudgetExceeded            429 insufficient_quota, until the budget's period ends
    ├── LimitsUnavailable             503 (limits cannot be checked and policy says closed)
    └── UpstreamError                 502 bad gateway
        ├── UpstreamUnavailable       503 (no deployment can take it; Retry-After if one is due)
        └── UpstreamTimeout           504

Endpoints raise; one handler in `gateway.http.app` renders `{"error": {...}}`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar


class GatewayError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "api_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code
        self.headers = headers or {}
        self.attempts = 0  # upstream calls made before it, where the executor raised it
        self.hedges = 0  # of which hedges (counted as fired though none won)
        self.detail: str | None = None  # for the log only (upstreams' hosts, say)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def retry_after_header(seconds: float) -> dict[str, str]:
    """`Retry-After` for a wait of `seconds`: whole seconds, rounded up (a client told
    too early retries into the same refusal), at least 1."""
    return {"retry-after": str(max(1, math.ceil(seconds)))}


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class PayloadTooLarge(InvalidRequest):
    status = 413
    default_code = "payload_too_large"


class CapabilityUnavailable(InvalidRequest):
    """The request needs a capability (tools, vision, embeddings, ...) that no deployment
    of its route that may be called serves: the gateway answers it, not an upstream.
    `lacking`: the capabilities the route's deployments lack."""

    default_code = "capability_unavailable"

    def __init__(self, message: str, *, param: str | None, lacking: tuple[str, ...] = ()) -> None:
        super().__init__(message, param=param)
        self.lacking = lacking


class UpstreamRejected(InvalidRequest):
    """A request an upstream refused as the client's fault (400/422), rendered with the
    upstream's own error `type`, `code` and `param` where it gave them: apps branch on
    them (truncate and retry on `context_length_exceeded`). `type` is only rendered;
    the class's stays the metric label, which must not take upstream values."""

    def __init__(
        self,
        message: str,
        *,
        upstream_type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.upstream_type = upstream_type

    def body(self) -> dict[str, Any]:
        body = super().body()
        if self.upstream_type is not None:
            body["error"]["type"] = self.upstream_type
        return body


class UpstreamTooLarge(UpstreamRejected, PayloadTooLarge):
    """A 413 from an upstream (status and default code of PayloadTooLarge)."""


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    default_code = "route_not_allowed"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "model_not_found"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"

    def __init__(
        self, message: str, *, retry_after_s: float | None, code: str | None = None
    ) -> None:
        """`retry_after_s` None: no wait lets it through, so the client is told not to
        retry (`x-should-retry: false`, which the OpenAI SDKs honour) instead of when."""
        no_wait_helps = {"x-should-retry": "false"}
        headers = no_wait_helps if retry_after_s is None else retry_after_header(retry_after_s)
        super().__init__(message, code=code, headers=headers)


class BudgetExceeded(RateLimited):
    """A hard budget limit. `x-should-retry: false` stops the OpenAI SDKs' automatic
    retries, which cannot succeed before the period ends."""

    type = "insufficient_quota"
    default_code = "budget_exceeded"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.headers["x-should-retry"] = "false"


class LimitsUnavailable(GatewayError):
    status = 503
    default_code = "limits_unavailable"


class ClassifierUnavailable(GatewayError):
    """The route's classifier cannot score here (its model failed to load)."""

    status = 503
    default_code = "classifier_unavailable"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    default_code = "bad_gateway"


class UpstreamUnavailable(UpstreamError):
    status = 503
    default_code = "no_deployment_available"

    def __init__(
        self, message: str, *, retry_after_s: float | None = None, code: str | None = None
    ) -> None:
        """`retry_after_s`: when a deployment is expected back (a breaker's cooldown,
        the upstreams' own Retry-After), sent as `Retry-After`."""
        headers = {} if retry_after_s is None else retry_after_header(retry_after_s)
        super().__init__(message, code=code, headers=headers)


class UpstreamTimeout(UpstreamError):
    status = 504
    default_code = "upstream_timeout"
