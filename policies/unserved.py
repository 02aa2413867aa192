"""What a valid policy serves nothing with until it is configured (an env var unset or
empty)."""

from __future__ import annotations

from policies.schema import Policy


def unserved_notes(policy: Policy) -> list[str]:
    """What in `policy` serves nothing until configured (an env var unset or empty):
    printed by `policy check` and logged when a gateway loads the policy, since a
    request that meets it gets only a 401 or 503."""
    notes = [
        f"deployment '{name}' is unavailable until configured: {reason}"
        for name, spec in policy.deployments.items()
        if (reason := spec.unavailable_reason())
    ]
    notes += [
        f"deployment '{name}': requires is ignored (it never took effect); capabilities "
        "says what a deployment serves"
        for name, spec in policy.deployments.items()
        if "requires" in spec.model_fields_set
    ]
    disabled = {key_id: key.disabled_reason for key_id, key in policy.keys.items()}
    notes += [
        f"key '{key_id}' is disabled, its requests are refused (401): {reason}"
        for key_id, reason in disabled.items()
        if reason
    ]
    # Only what an unset variable disabled: a policy with no keys at all (the embedded
    # default) chose to have none.
    if disabled and all(disabled.values()):
        who = "callers on this machine only" if policy.auth.anonymous_team else "nobody"
        notes.append(f"no client key is enabled: the gateway serves {who}")
    if policy.admin_keys and not any(policy.admin_keys):
        notes.append("no admin key is set: /admin answers 401")
    if policy.metrics_keys and not any(policy.metrics_keys):
        notes.append("no metrics key is set: /metrics answers admin keys only, others 401")
    if not any(policy.finance_keys):  # none listed (the embedded default), or all unset
        why = "is set" if policy.finance_keys else "in the policy"
        who = "admin keys only" if any(policy.admin_keys) else "nobody, no admin key is set either"
        notes.append(
            f"no finance key {why}: the spend API and /dashboard/ answer {who} "
            '(finance_keys: ["${FINANCE_KEY}"] lets one in)'
        )
    return notes
