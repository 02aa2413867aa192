"""A policy's sections as far as they validated, and the checks that span them (a route
naming a deployment, a key naming a team, a budget's owner, an engine's deployments).

`Policy` runs them once every section is valid (`Sections.of`); the loader runs them on
the entries that are valid when some are not (`Sections.validated`), so that one
`policy check` reports them beside the schema errors. Problems are (field path, message)
pairs, raised together as a `CrossReferenceError`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from policies.access import ANY_ROUTE, DEFAULT_TEAM, Auth, Budget, Key, Team
from policies.engines import EngineSpec
from policies.schema import OPENAI_COMPATIBLE, Deployment, GatewaySection, Route
from policies.section import Loc

if TYPE_CHECKING:
    from policies.schema import Policy

_Entry = TypeVar("_Entry", bound=BaseModel)
# A section's entries by name; None for an entry that did not validate (its name is
# declared, its content unknown).
Entries = Mapping[str, _Entry | None]


@dataclass(frozen=True, slots=True)
class Sections:
    """A policy's sections as far as they validated, for the checks that span them.

    An entry that failed its own validation is kept as None: its name is declared (a
    reference to it is no error) but a check that needs its content is skipped, since
    its own errors are reported already. A section that is None (missing though
    required, or not a mapping) is unknown: references into it are not checked.
    """

    deployments: Entries[Deployment] | None
    routes: Entries[Route] | None
    teams: Entries[Team] | None = None
    keys: Entries[Key] | None = None
    budgets: Sequence[Budget | None] | None = None
    engines: Entries[EngineSpec] | None = None
    auth: Auth | None = None
    gateway: GatewaySection | None = None

    @classmethod
    def of(cls, policy: Policy) -> Sections:
        """A valid policy's sections (every entry valid)."""
        return cls(
            deployments=policy.deployments,
            routes=policy.routes,
            teams=policy.teams,
            keys=policy.keys,
            budgets=policy.budgets,
            engines=policy.engines,
            auth=policy.auth,
            gateway=policy.gateway,
        )

    @classmethod
    def validated(
        cls, data: Any, unset_env: Mapping[str, list[str]], empty_env: Collection[str] = ()
    ) -> Sections:
        """Each entry of raw policy `data` validated on its own, for a policy that does
        not validate as a whole: the valid ones are cross-checked all the same."""
        data = data if isinstance(data, Mapping) else {}
        budgets = data.get("budgets", [])
        sections = cls(
            deployments=_entries(data, "deployments", Deployment, required=True),
            routes=_entries(data, "routes", Route, required=True),
            teams=_entries(data, "teams", Team),
            keys=_entries(data, "keys", Key),
            budgets=[_valid(Budget, b) for b in budgets] if isinstance(budgets, list) else None,
            engines=_entries(data, "engines", EngineSpec),
            auth=_valid(Auth, data.get("auth", {})),
            gateway=_valid(GatewaySection, data.get("gateway", {})),
        )
        sections.note_unset_env(unset_env, empty_env)
        return sections

    def note_unset_env(
        self, unset_env: Mapping[str, list[str]], empty_env: Collection[str] = ()
    ) -> None:
        """Tell deployments and keys which of their env vars were unset, and which env
        vars are set but empty (`empty_env`: their messages say so)."""
        empty = frozenset(empty_env)
        for name, deployment in _present(self.deployments):
            for field in ("api_base", "api_key"):
                names = unset_env.get(f"deployments.{name}.{field}")
                if names:
                    deployment._unset_env[field] = list(names)
            deployment._empty_env = empty
        for key_id, key in _present(self.keys):
            key._empty_env = empty
            key._unset_env = {
                field: list(names)
                for field in ("secret", "hash")
                if (names := unset_env.get(f"keys.{key_id}.{field}"))
            }

    def problems(self) -> Iterator[tuple[Loc, str]]:
        """Every problem between sections, each with its field path."""
        yield from self._route_problems()
        yield from self._key_problems()
        for team_name, team in _present(self.teams):
            loc: Loc = ("teams", team_name)
            yield from self._allowed_route_problems(loc, f"team '{team_name}'", team.allowed_routes)
        yield from self._budget_problems()
        yield from self._engine_problems()
        anonymous = self.auth.anonymous_team if self.auth is not None else None
        if anonymous is not None and not self._has_team(anonymous):
            yield ("auth", "anonymous_team"), self._undeclared("auth", "team", anonymous)
        default_route = self.gateway.default_route if self.gateway is not None else None
        if default_route is not None and not _declared(self.routes, default_route):
            message = self._undeclared("gateway.default_route", "route", default_route)
            yield ("gateway", "default_route"), message

    def route_deployments(self, route: Route) -> list[Deployment] | None:
        """The declared deployments of `route`, in order; None if one of them did not
        validate (or the section did not), so what they serve is unknown."""
        if self.deployments is None:
            return None
        served: list[Deployment] = []
        for name in route.deployments:
            if name not in self.deployments:
                continue  # undeclared: reported on its own
            deployment = self.deployments[name]
            if deployment is None:
                return None
            served.append(deployment)
        return served

    def _route_problems(self) -> Iterator[tuple[Loc, str]]:
        for route_name, route in _present(self.routes):
            for index, deployment in enumerate(route.deployments):
                if not _declared(self.deployments, deployment):
                    yield (
                        ("routes", route_name, "deployments", index),
                        self._undeclared(f"route '{route_name}'", "deployment", deployment),
                    )
            served = self.route_deployments(route)
            yield from self._opinion_problems(route_name, route, served)
            if route.judge is not None and not _declared(self.deployments, route.judge):
                yield (
                    ("routes", route_name, "judge"),
                    self._undeclared(f"judge of route '{route_name}'", "deployment", route.judge),
                )
            if served is None:
                continue
            tiers = {deployment.tier for deployment in served}
            for index, step in enumerate(route.tiers):
                if step.tier not in tiers:
                    yield (
                        ("routes", route_name, "tiers", index, "tier"),
                        f"route '{route_name}' has tier '{step.tier}' but none of its "
                        f"deployments is in it; their tiers: {', '.join(sorted(tiers))}",
                    )

    def _opinion_problems(
        self, route_name: str, route: Route, served: list[Deployment] | None
    ) -> Iterator[tuple[Loc, str]]:
        owner = f"second_opinions of route '{route_name}'"
        # Every tier but the last may have its answer verified (an earlier one can be
        # unavailable, or ejected, and the next then answers first).
        cheap = {d.model for d in served if d.tier != served[-1].tier} if served else set()
        for index, name in enumerate(route.second_opinions):
            loc: Loc = ("routes", route_name, "second_opinions", index)
            opinion = self.deployments.get(name) if self.deployments is not None else None
            if not _declared(self.deployments, name):
                yield loc, self._undeclared(owner, "deployment", name)
            elif opinion is not None and opinion.model in cheap:
                # The same model (at the client's temperature, often 0) mostly repeats
                # itself: its agreement would wave every cheap answer through.
                yield (
                    loc,
                    (
                        f"{owner}: '{name}' serves {opinion.model}, the model of a tier "
                        "whose answers the cascade verifies, and a model agrees with itself; "
                        "ask another model"
                    ),
                )

    def _key_problems(self) -> Iterator[tuple[Loc, str]]:
        for key_id, key in _present(self.keys):
            if key.secret is None and key.hash is None and not key._unset_env:
                yield ("keys", key_id), f"key '{key_id}' needs a secret (as ${{ENV}}) or a hash"
            if not self._has_team(key.team):
                yield (
                    ("keys", key_id, "team"),
                    self._undeclared(f"key '{key_id}'", "team", key.team),
                )
            if key.allowed_routes is not None:
                owner = f"key '{key_id}'"
                yield from self._allowed_route_problems(("keys", key_id), owner, key.allowed_routes)

    def _allowed_route_problems(
        self, loc: Loc, owner: str, routes: list[str]
    ) -> Iterator[tuple[Loc, str]]:
        for index, route in enumerate(routes):
            if route != ANY_ROUTE and not _declared(self.routes, route):
                message = self._undeclared(owner, "route", route, extra=ANY_ROUTE)
                yield (*loc, "allowed_routes", index), message

    def _budget_problems(self) -> Iterator[tuple[Loc, str]]:
        declared = {"key": self.keys, "route": self.routes}
        tiers = self._tiers()
        for index, budget in enumerate(self.budgets or []):
            if budget is None:
                continue
            owner = f"budget {index}"
            if budget.scope == "team":
                if not self._has_team(budget.name):
                    yield ("budgets", index, "name"), self._undeclared(owner, "team", budget.name)
            elif not _declared(declared[budget.scope], budget.name):
                message = self._undeclared(owner, budget.scope, budget.name)
                yield ("budgets", index, "name"), message
            downgrade = budget.downgrade_tier
            if downgrade is not None and tiers is not None and downgrade not in tiers:
                yield (
                    ("budgets", index, "downgrade_tier"),
                    f"{owner} downgrades to tier '{downgrade}', which no "
                    f"deployment serves; tiers: {', '.join(sorted(tiers))}",
                )

    def _tiers(self) -> set[str] | None:
        """Every deployment's tier; None when a deployment's is unknown."""
        if self.deployments is None or None in self.deployments.values():
            return None
        return {d.tier for _, d in _present(self.deployments)}

    def _engine_problems(self) -> Iterator[tuple[Loc, str]]:
        for name, deployment in _present(self.deployments):
            if deployment.engine is None:
                continue
            loc: Loc = ("deployments", name, "engine")
            engine = self.engines.get(deployment.engine) if self.engines is not None else None
            if not _declared(self.engines, deployment.engine):
                yield loc, self._undeclared(f"deployment '{name}'", "engine", deployment.engine)
            elif (
                engine is not None
                and deployment.provider == OPENAI_COMPATIBLE
                and deployment.model != engine.served_name
            ):
                yield (
                    ("deployments", name, "model"),
                    f"deployment '{name}' asks for model '{deployment.model}' but engine "
                    f"'{deployment.engine}' serves '{engine.served_name}'",
                )
        listening: dict[tuple[str, int], str] = {}
        for name, engine in _present(self.engines):
            other = listening.setdefault((engine.host, engine.port), name)
            if other != name:
                yield (
                    ("engines", name, "port"),
                    f"engine '{name}' listens on {engine.host}:{engine.port}, as engine "
                    f"'{other}' does; give each engine its own port",
                )

    def _has_team(self, team: str) -> bool:
        return team == DEFAULT_TEAM or _declared(self.teams, team)

    def _undeclared(self, owner: str, kind: str, name: str, extra: str | None = None) -> str:
        section: Mapping[str, Any] = {
            "deployment": self.deployments,
            "route": self.routes,
            "team": self.teams,
            "key": self.keys,
            "engine": self.engines,
        }[kind] or {}
        declared = sorted({DEFAULT_TEAM, *section}) if kind == "team" else list(section)
        if extra is not None:
            declared = [*declared, extra]
        listing = ", ".join(declared) if declared else "none"
        return f"{owner} names {kind} '{name}', which is not declared; declared: {listing}"


def _present(entries: Entries[_Entry] | None) -> Iterator[tuple[str, _Entry]]:
    """The entries that validated, by name."""
    for name, entry in (entries or {}).items():
        if entry is not None:
            yield name, entry


def _declared(entries: Entries[Any] | None, name: str) -> bool:
    """Is `name` declared in the section? An unknown section declares every name."""
    return entries is None or name in entries


def _valid(model: type[_Entry], data: Any) -> _Entry | None:
    try:
        return model.model_validate(data)
    except ValidationError:
        return None


def _entries(
    data: Mapping[str, Any], section: str, model: type[_Entry], required: bool = False
) -> Entries[_Entry] | None:
    if section not in data:
        return None if required else {}
    entries = data[section]
    if not isinstance(entries, Mapping):
        return None
    return {str(name): _valid(model, entry) for name, entry in entries.items()}
