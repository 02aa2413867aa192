"""Budgets and rate limits: admitted before the upstream call, settled after it."""

from gateway.limits.limiter import UNLIMITED, Admission, Limiter
from gateway.limits.redis_store import RedisLimitStore

__all__ = ["UNLIMITED", "Admission", "Limiter", "RedisLimitStore"]
