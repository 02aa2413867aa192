"""Router exceptions.

RoutingError    a route cannot be planned (unknown strategy, bad inputs)
"""

from __future__ import annotations


class RoutingError(Exception):
    pass
