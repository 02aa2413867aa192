"""Process settings, read once from the environment (prefix CASCADE_).

Policy (deployments, routes, keys) lives in YAML; these are the knobs of the
process itself. `REDIS_URL` is read without the prefix, as most platforms set it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal, TextIO

import orjson
from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.http.request_ids import RequestIdFilter
from policies import DEFAULT_POLICY_PATH

# The ledger's shards on a Redis Cluster by default: enough to spread over a few dozen
# masters, few enough that an aggregate's fan-out (one read per shard) stays cheap.
CLUSTER_LEDGER_SHARDS = 16
# A log line: `2025-01-31T12:00:00.123Z INFO gateway.pipeline.executor [req_...]: ...`
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CASCADE_", extra="ignore")

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case_level(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        return "warning" if value.lower() == "warn" else value.lower()

    policy: Path = DEFAULT_POLICY_PATH
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    workers: int = Field(default=1, ge=1)
    # Python's level names, any case (uvicorn takes the lower-case form; "warn" is
    # logging's alias of "warning").
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    # `json`: one JSON object a line (time, level, logger, request id, message, and a
    # traceback as one field), for log shippers; `text`: one line a record, but tracebacks.
    log_format: Literal["text", "json"] = "text"
    # One INFO line per request on the `gateway.decisions` logger: the route, its plan
    # and why (the score, tiers, skipped deployments), and a cascade's verdicts. Off by
    # default: per-request logging costs more than the proxying itself.
    log_decisions: bool = False
    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("CASCADE_REDIS_URL", "REDIS_URL")
    )
    redis_prefix: str = "cg:"
    # REDIS_URL names one node of a Redis Cluster; the clients find the others.
    redis_cluster: bool = False
    # Hash tags the ledger is spread over ({ledger.0} .. {ledger.N-1}), so a cluster's
    # masters share its writes. Unset: 16 on a cluster, else 1 (the `{ledger}` names).
    # Fixed for a ledger's life: a store with another count refuses to run on it.
    ledger_shards: int | None = Field(default=None, ge=1, le=1024)
    ledger_stream_maxlen: int = 100_000
    # How long a spend record's exactly-once marker lives in Redis: a replay of the
    # spool within it is applied once; a spooled record older than it is refused (it
    # may be written already). Redis holds markers for this long, not the records' life.
    ledger_dedupe_window_s: int = Field(default=48 * 3600, gt=0)  # ledger.store's default
    # Replicas that must take each batch of spend records (Redis WAIT) before the ledger
    # counts it written: 0, off; 1, a master that crashes loses no spend it had not yet
    # replicated (the batch is spooled and sent again; gateway.ledger.replicas).
    ledger_min_replicas: int = Field(default=0, ge=0)
    # How long WAIT waits for them: at most half the ledger's 1 s socket timeout (Redis
    # answers a WAIT some tens of ms after its timeout).
    ledger_replica_wait_ms: int = Field(default=100, ge=1, le=500)
    # Spend records written while Redis is unreachable; replayed when it returns.
    spool_path: Path = Path("var/ledger.spool")
    # Where the spend archive goes (daily Parquet files, every record once: see
    # gateway.ledger.archive). Set, the gateway exports the ledger's event streams there
    # in the background; needs the `archive` extra. Unset: no archive.
    ledger_archive_dir: Path | None = None
    # How long records gather before the archive writes them: longer, fewer and larger
    # files; the stream holds them meanwhile (keep it well under a full stream's worth).
    ledger_archive_flush_s: float = Field(default=60.0, gt=0)
    # Merge each closed day's archive files into a few, once a day (see
    # gateway.ledger.archive.compact); false leaves them to `spend compact`.
    ledger_archive_compact: bool = True
    # Upstream connection pool (shared by every OpenAI-compatible deployment).
    upstream_max_connections: int = 1000
    # Connection pool under the OpenAI-compatible client: "aiohttp" (fastest) or
    # "httpcore" (httpx's own).
    upstream_transport: Literal["aiohttp", "httpcore"] = "aiohttp"
    # Cap on one backoff wait; a longer Retry-After moves on to the next deployment.
    max_retry_wait_s: float = 5.0
    # CPU threads the embedding classifier (a route's `classifier: minilm`) may use in
    # each worker process; unset: torch's default, every core. With several workers,
    # cores / workers keeps them from oversubscribing the machine.
    embedding_threads: int | None = Field(default=None, ge=1)
    # Seconds to wait for in-flight ledger writes on shutdown.
    shutdown_grace_s: float = 10.0
    # Serve the OpenAPI document at /openapi.json (off: it maps the admin surface for
    # anyone who can reach the port).
    openapi: bool = False

    @property
    def ledger_shard_count(self) -> int:
        """`ledger_shards`, or its default for the kind of Redis."""
        if self.ledger_shards is not None:
            return self.ledger_shards
        return CLUSTER_LEDGER_SHARDS if self.redis_cluster else 1


def configure_logging(level: str, log_format: str = "text") -> None:
    """Root logging at `level`, once per process (a no-op where it is set up already):
    the CLI's, and each uvicorn worker's, which starts unconfigured. httpx's INFO line
    per request stays off: per-request logging costs more than the proxying."""
    logging.basicConfig(level=level.upper(), handlers=[log_handler(log_format=log_format)])
    logging.getLogger("httpx").setLevel(logging.WARNING)


def log_handler(stream: TextIO | None = None, log_format: str = "text") -> logging.Handler:
    """The handler of the gateway's log lines (to stderr by default): UTC time, level,
    logger and the id of the request being served (`x-request-id`; "-" outside one).
    The id is added by the handler's filter, so every logger's records have it."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else LogFormatter(LOG_FORMAT))
    handler.addFilter(RequestIdFilter())
    return handler


class LogFormatter(logging.Formatter):
    """ISO 8601 times in UTC, to the millisecond: 2025-01-31T12:00:00.123Z."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{utc}.{int(record.msecs):03d}Z"


class JsonLogFormatter(LogFormatter):
    """One JSON object a line: `ts`, `level`, `logger`, `pid`, `request_id`, `message`,
    and `exception` (the traceback, one string) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,  # which worker, with --workers N
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return orjson.dumps(line).decode()
