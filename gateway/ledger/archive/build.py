"""The exporter as the gateway (`CASCADE_LEDGER_ARCHIVE_DIR`) and the `spend export`
sidecar both run it: on the ledger's streams, with a Redis client of its own.

Its own, because the ledger store's client retries a dropped connection once, and a
retried `XREADGROUP >` whose first reply was lost delivers the *next* page: the lost one
sits in the pending list, unseen. The exporter's client retries nothing; a failed read
fails its batch, and the next batch reads the pending entries first.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gateway.ledger.archive.exporter import ArchiveExporter
from gateway.ledger.archive.stream_export import ArchiveOptions
from gateway.redis_client import RedisClient, redis_client

if TYPE_CHECKING:
    from gateway.ledger.redis_store import RedisStore
    from gateway.metrics import ArchiveMetrics

# A reply can take a while on a busy Redis (XAUTOCLAIM, a large page): the exporter is
# off the request path, and a timeout costs a retried batch.
SOCKET_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 2.0


def archive_client(url: str, *, cluster: bool, streams: int) -> RedisClient:
    """A client for the exporter: never retries a call (see the module docstring)."""
    return redis_client(
        url,
        socket_timeout=SOCKET_TIMEOUT_S,
        connect_timeout=CONNECT_TIMEOUT_S,
        max_connections=streams + 1,  # each stream's task has one call in flight at most
        pool_timeout=SOCKET_TIMEOUT_S,
        retry_on=(),
        decode_responses=True,
        cluster=cluster,
    )


def build_exporter(
    store: RedisStore,
    root: Path,
    options: ArchiveOptions | None = None,
    metrics: ArchiveMetrics | None = None,
) -> ArchiveExporter:
    """An exporter of `store`'s event streams into `root`, on its own client (closed by
    its `stop` or `close`); not started."""
    streams = store.event_stream_keys()
    return ArchiveExporter(
        archive_client(store.url, cluster=store.cluster, streams=len(streams)),
        streams,
        root,
        options,
        metrics,
        stream_cap=store.shard_maxlen,
        owns_client=True,
    )
