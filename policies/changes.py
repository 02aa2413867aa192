"""What a reload changed in the policy, one line per change, for the log.

    changes = policy_changes(serving.policy, loaded.policy)
    for line in changes.changed: log.info("policy change: %s", line)
    for line in changes.warnings: log.warning("policy change: %s", line)

Lines name things and fields, never values: a key's secret, a deployment's api_key or
the admin keys are said to have changed, never what they hold. A warning the serving
policy already had (a deployment still unavailable) is not repeated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from policies.access import Budget
from policies.engines import EngineSpec
from policies.schema import Deployment, Policy
from policies.unserved import unserved_notes

# Sections of named entries: section → what one entry is called in a line.
NAMED_SECTIONS = {
    "deployments": "deployment",
    "routes": "route",
    "teams": "team",
    "keys": "key",
    "engines": "engine",
}
# Lists of secrets: a change is reported, never a value nor which one.
SECRET_LISTS = ("admin_keys", "finance_keys", "metrics_keys")


@dataclass(frozen=True)
class PolicyChanges:
    """`changed`: added, removed, changed, became available, a warning resolved (INFO).
    `warnings`: became unavailable, and warnings the previous policy did not have."""

    changed: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.changed or self.warnings)


def policy_changes(old: Policy, new: Policy) -> PolicyChanges:
    """The changes from the serving policy `old` to the reloaded `new`."""
    changed: list[str] = []
    warnings: list[str] = []
    for section, noun in NAMED_SECTIONS.items():
        changed += _named_changes(noun, getattr(old, section), getattr(new, section))
    flipped = _availability(old.deployments, new.deployments, changed, warnings)
    changed += _named_changes("budget", _budgets(old.budgets), _budgets(new.budgets))
    covered = {*NAMED_SECTIONS, "budgets"}
    for field in type(new).model_fields:  # the rest: secret lists and settings sections
        if field not in covered:
            changed += _field_change(field, getattr(old, field), getattr(new, field))
    # Deployments that flipped or left are said above; their notes would repeat it.
    skip = tuple(
        f"deployment '{name}' "
        for name in flipped | (old.deployments.keys() - new.deployments.keys())
    )
    old_notes, new_notes = unserved_notes(old), unserved_notes(new)
    changed += [
        f"resolved: {n}" for n in old_notes if n not in new_notes and not n.startswith(skip)
    ]
    warnings += [n for n in new_notes if n not in old_notes and not n.startswith(skip)]
    warnings += _not_started(old.engines, new.engines)
    return PolicyChanges(tuple(changed), tuple(warnings))


def _named_changes(noun: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    lines = [f"{noun} '{name}' added" for name in new if name not in old]
    lines += [f"{noun} '{name}' removed" for name in old if name not in new]
    if noun == "deployment":  # said with their availability, below
        return lines
    for name in old.keys() & new.keys():
        fields = _changed_fields(old[name], new[name])
        if fields:
            lines.append(f"{noun} '{name}' changed: {', '.join(fields)}")
    return sorted(lines)


def _not_started(old: Mapping[str, EngineSpec], new: Mapping[str, EngineSpec]) -> list[str]:
    """Engines the reload made `autostart`: `serve` starts those only as it starts."""
    return [
        f"engine '{name}' has autostart but is not started until the gateway restarts "
        f"(a reload starts no engine; or run `cascade-gateway engine up --engine {name}`)"
        for name in sorted(new)
        if new[name].autostart and not (name in old and old[name].autostart)
    ]


def _availability(
    old: Mapping[str, Deployment],
    new: Mapping[str, Deployment],
    changed: list[str],
    warnings: list[str],
) -> set[str]:
    """Appends each kept deployment's change; returns those whose availability flipped."""
    flipped: set[str] = set()
    for name in sorted(old.keys() & new.keys()):
        fields = _changed_fields(old[name], new[name])
        detail = f" ({', '.join(fields)} changed)" if fields else ""
        was, now = old[name].unavailable_reason(), new[name].unavailable_reason()
        if was is not None and now is None:
            changed.append(f"deployment '{name}' became available{detail}")
        elif was is None and now is not None:
            warnings.append(f"deployment '{name}' became unavailable: {now}{detail}")
        elif fields:
            changed.append(f"deployment '{name}' changed: {', '.join(fields)}")
            continue
        else:
            continue
        flipped.add(name)
    return flipped


def _field_change(field: str, old: Any, new: Any) -> list[str]:
    if old == new:
        return []
    if isinstance(old, BaseModel) and isinstance(new, BaseModel):
        return [f"{field} changed: {', '.join(_changed_fields(old, new))}"]
    if field in SECRET_LISTS:
        return [f"{field} changed ({sum(1 for s in new if s)} set of {len(new)})"]
    return [f"{field} changed"]


def _changed_fields(old: BaseModel, new: BaseModel) -> list[str]:
    before, after = old.model_dump(), new.model_dump()
    return [field for field in after if before.get(field) != after[field]]


def _budgets(budgets: list[Budget]) -> dict[str, Budget]:
    return {f"{b.scope}:{b.name}/{b.period}": b for b in budgets}
