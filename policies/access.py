"""Who may call and how much: teams, keys, their rate limits and budgets, and how
callers without a key are treated."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal, Self

from pydantic import BeforeValidator, Field, IPvAnyNetwork, PrivateAttr, model_validator

from policies.section import (
    CrossReferenceError,
    PerMinute,
    Secret,
    Section,
    Usd,
    empty_as_unset,
    unset_or_empty,
)

BudgetScopeType = Literal["key", "team", "route"]
BudgetPeriodType = Literal["day", "month"]
DEFAULT_TEAM = "default"
ANY_ROUTE = "*"
KEY_HASH_PATTERN = r"^sha256:[0-9a-f]{64}$"


def _check_network(entry: object) -> object:
    """`entry` if it is a network (`10.0.0.0/8`, `fd00::/8`) or an address, else why not."""
    if not isinstance(entry, str):
        raise ValueError(f"{entry!r} is not a network; write one as 10.0.0.0/8")
    try:
        ipaddress.ip_network(entry)
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(f"{exc}; write a network as 10.0.0.0/8 or an address") from None
        raise ValueError(f"'{entry}' has host bits set; the network is {loose}") from None
    return entry


# A CIDR network (a lone address is its own /32 or /128), named as written when wrong.
Network = Annotated[IPvAnyNetwork, BeforeValidator(_check_network)]


class RateLimit(Section):
    """Requests and tokens (prompt + `max_tokens`) per minute, over a sliding window."""

    requests_per_minute: PerMinute | None = None
    tokens_per_minute: PerMinute | None = None


class Team(Section):
    """A group of keys sharing allowed routes and budgets."""

    allowed_routes: list[str] = [ANY_ROUTE]
    rate_limit: RateLimit | None = None
    description: str = ""


class Key(Section):
    """A client key: its secret (from `${ENV}`) or the secret's hash, and its team."""

    secret: Secret = None
    hash: Annotated[
        Annotated[str, Field(pattern=KEY_HASH_PATTERN)] | None, BeforeValidator(empty_as_unset)
    ] = None
    team: str = DEFAULT_TEAM
    allowed_routes: list[str] | None = None
    rate_limit: RateLimit | None = None
    description: str = ""

    # field -> env var names of a secret or hash that was unset: the key is disabled
    # (set by `Policy`, with the env vars that are set but empty)
    _unset_env: dict[str, list[str]] = PrivateAttr(default_factory=dict)
    _empty_env: frozenset[str] = PrivateAttr(default_factory=frozenset)

    @model_validator(mode="after")
    def _check_one_secret(self) -> Self:
        if self.secret is not None and self.hash is not None:
            raise ValueError("give either secret or hash, not both")
        return self

    @property
    def disabled_reason(self) -> str | None:
        """Why this key accepts no requests (its secret's env var is unset or empty), or
        None."""
        if self.secret is not None or self.hash is not None:
            return None
        for field in ("hash", "secret"):
            if names := self._unset_env.get(field):
                return f"{field} is not set ({unset_or_empty(names, self._empty_env)})"
        return "secret is not set"


class Budget(Section):
    """A spending limit for one key, team or route per day or month."""

    scope: BudgetScopeType
    name: str
    period: BudgetPeriodType
    limit_usd: Usd
    soft_limit_usd: Usd | None = None
    # Past the soft limit, requests on routes with this tier are sent to it instead of
    # the tier the router chose (e.g. `local`): spend slows before the hard stop.
    downgrade_tier: str | None = None

    @model_validator(mode="after")
    def _check_soft_limit(self) -> Self:
        if self.soft_limit_usd is not None and self.soft_limit_usd > self.limit_usd:
            message = f"soft_limit_usd {self.soft_limit_usd} is above limit_usd {self.limit_usd}"
            raise CrossReferenceError([(("soft_limit_usd",), message)])
        return self


class Auth(Section):
    """How callers without a key are treated."""

    anonymous_team: str | None = None
