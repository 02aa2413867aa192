"""A `select` route's runtime built in-process from two deployments, `cheap` (no quality
profile unless a test gives it one) and `dear` (GPT-4's profile and price), never
called. Used by test_selector and test_shared_profiles.

    rt = runtime(select_route(reference_model="dear"))  # its one route: rt.routes["r"]
"""

from __future__ import annotations

from gateway.runtime import Runtime, build_runtime
from policies import LoadedPolicy, Policy


def runtime(route: dict[str, object], **cheap: object) -> Runtime:
    """The runtime of a policy whose one route `r` is `route`; `cheap` adds fields to
    the cheap deployment."""
    deployments = {
        "cheap": {"model": "m1", "api_base": "http://127.0.0.1:9/v1", **cheap},
        "dear": {
            "model": "m2",
            "api_base": "http://127.0.0.1:9/v1",
            "quality_profile": "gpt-4-1106-preview",
            "price": {"input_per_mtok": 10, "output_per_mtok": 30},
        },
    }
    policy = Policy.model_validate({"deployments": deployments, "routes": {"r": route}})
    return build_runtime(LoadedPolicy(policy, (), {}, "digest"))


def select_route(**extra: object) -> dict[str, object]:
    """A `select` route over both deployments, with `extra` fields."""
    return {"strategy": "select", "deployments": ["cheap", "dear"], **extra}
