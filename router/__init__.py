"""Routing decisions: pure logic, no network I/O."""

from router.errors import RoutingError
from router.planner import DeploymentView, Plan, Step, plan_route

__all__ = ["DeploymentView", "Plan", "RoutingError", "Step", "plan_route"]
