"""Who is calling: bearer keys, stored hashed, mapped to a team and its routes."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.errors import AuthenticationFailed, PermissionDenied
from policies.keys import hash_key

ANONYMOUS_KEY_ID = "anonymous"


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str
    team: str
    allowed_routes: frozenset[str] | None  # None: every route

    def can_use(self, route: str) -> bool:
        return self.allowed_routes is None or route in self.allowed_routes

    def check_route(self, route: str) -> None:
        if not self.can_use(route):
            raise PermissionDenied(
                f"key '{self.key_id}' (team '{self.team}') may not use route '{route}'",
                param="model",
            )


@dataclass(frozen=True, slots=True)
class KeyTable:
    """Client and admin keys by hash. Lookups hash the presented secret once."""

    principals: Mapping[str, Principal]
    admin_hashes: frozenset[str]
    anonymous: Principal | None = None

    def authenticate(self, authorization: str | None, client_host: str | None = None) -> Principal:
        """The caller's principal. Key-less callers get the policy's anonymous team,
        and only from this machine: a gateway bound to a public address must not
        lend its upstream keys to anyone who finds it. Where no client key exists at
        all, any key counts as none: the OpenAI SDK always sends one."""
        secret = bearer_secret(authorization)
        keyless = secret is None or not self.principals
        if self.anonymous is not None and keyless and is_loopback(client_host):
            return self.anonymous
        if secret is None:
            raise AuthenticationFailed(
                "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key"
            )
        principal = self.principals.get(hash_key(secret))
        if principal is None:  # a mistyped key is refused, not served as anonymous
            raise AuthenticationFailed("invalid API key")
        return principal

    def authenticate_admin(self, authorization: str | None) -> None:
        secret = bearer_secret(authorization)
        if secret is None:
            raise AuthenticationFailed(
                "missing admin key: send 'Authorization: Bearer <admin key>'",
                code="missing_api_key",
            )
        if hash_key(secret) not in self.admin_hashes:
            raise AuthenticationFailed("invalid admin key")


def bearer_secret(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, secret = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise AuthenticationFailed(
            "malformed Authorization header: expected 'Bearer <key>'", code="invalid_api_key"
        )
    return secret.strip()


def is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
