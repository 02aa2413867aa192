"""Who is calling: bearer keys, stored hashed, mapped to a team and its routes; and
where from: the socket peer, or the client a trusted proxy forwarded for."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from starlette.datastructures import Headers

from gateway.errors import AuthenticationFailed, PermissionDenied
from policies.keys import hash_key

ANONYMOUS_KEY_ID = "anonymous"
# A request carrying any of these came through a proxy: its socket peer is the proxy.
FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


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
    metrics_hashes: frozenset[str] | None = None  # None: /metrics is open

    def authenticate(self, authorization: str | None, client_host: str | None = None) -> Principal:
        """The caller's principal. Key-less callers get the policy's anonymous team,
        and only from this machine: a gateway bound to a public address must not
        lend its upstream keys to anyone who finds it. Where no client key exists at
        all, any key counts as none: the OpenAI SDK always sends one.

        `client_host` is the socket peer of a request that no proxy forwarded, None
        for one that was (`Origin.direct_peer`): a proxy on this machine relays others."""
        secret = bearer_secret(authorization)
        keyless = secret is None or not self.principals
        if self.anonymous is not None and keyless and is_loopback(client_host):
            return self.anonymous
        if secret is None:
            raise AuthenticationFailed(
                "missing API key: send 'Authorization: Bearer <key>' (or, to /v1/messages, "
                "'x-api-key: <key>')",
                code="missing_api_key",
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

    def authenticate_metrics(self, authorization: str | None) -> None:
        """Open unless the policy lists `metrics_keys`; then a metrics or admin key."""
        if self.metrics_hashes is None:
            return
        secret = bearer_secret(authorization)
        if secret is None:
            raise AuthenticationFailed(
                "missing metrics key: send 'Authorization: Bearer <metrics or admin key>'",
                code="missing_api_key",
            )
        digest = hash_key(secret)
        if digest not in self.metrics_hashes and digest not in self.admin_hashes:
            raise AuthenticationFailed("invalid metrics or admin key")


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a request came from: its socket peer, as the server saw it (uvicorn's own
    proxy-header handling off), whether it carries a forwarding header, and the client's
    address for logs and limits.

        origin = Origin.of(request.client.host, request.headers, trusted_proxies)
    """

    peer: str | None
    forwarded: bool
    address: str | None  # the peer, or the client a trusted proxy forwarded for

    @classmethod
    def of(cls, peer: str | None, headers: Headers, trusted: Sequence[Network] = ()) -> Origin:
        forwarded = any(name in headers for name in FORWARDING_HEADERS)
        address = peer
        if forwarded and within(peer, trusted):
            chain = ",".join(headers.getlist("x-forwarded-for"))
            address = forwarded_for(chain, trusted) or peer
        return cls(peer, forwarded, address)

    @property
    def direct_peer(self) -> str | None:
        """The peer of a request no proxy forwarded; None for one that was."""
        return None if self.forwarded else self.peer


def forwarded_for(chain: str, trusted: Sequence[Network]) -> str | None:
    """The right-most address in an X-Forwarded-For `chain` that no trusted proxy added
    (the left-most when all are trusted). Each proxy appends its peer, so entries left of
    the first untrusted one are whatever the client wrote. An entry that is no address
    stops the walk at the last good one."""
    address = None
    for entry in reversed(chain.split(",")):
        host = parse_ip(entry.strip())
        if host is None:
            break
        address = str(host)
        if not any(host in network for network in trusted):
            break
    return address


def within(host: str | None, networks: Sequence[Network]) -> bool:
    ip = parse_ip(host)
    return ip is not None and any(ip in network for network in networks)


def parse_ip(host: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return None if host is None else ipaddress.ip_address(host)
    except ValueError:
        return None


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
    ip = parse_ip(host)
    return ip is not None and ip.is_loopback
