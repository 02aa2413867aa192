"""The cost ledger: spend records, their stores, and the outage spool."""

from gateway.ledger.ledger import CostLedger
from gateway.ledger.memory_store import MemoryStore
from gateway.ledger.record import AggregateRow, SpendRecord
from gateway.ledger.redis_store import RedisStore, read_ledger
from gateway.ledger.shards import LedgerLayoutError
from gateway.ledger.spool import Spool
from gateway.ledger.store import LedgerStore, LedgerUnavailable

__all__ = [
    "AggregateRow",
    "CostLedger",
    "LedgerLayoutError",
    "LedgerStore",
    "LedgerUnavailable",
    "MemoryStore",
    "RedisStore",
    "SpendRecord",
    "Spool",
    "read_ledger",
]
