"""Routing decisions: pure logic, no network I/O."""

from router.errors import RoutingError
from router.planner import (
    SCORED_STRATEGIES,
    DeploymentView,
    Plan,
    RouteSpec,
    Step,
    Threshold,
    plan_route,
)

__all__ = [
    "SCORED_STRATEGIES",
    "DeploymentView",
    "Plan",
    "RouteSpec",
    "RoutingError",
    "Step",
    "Threshold",
    "plan_route",
]
