"""`cascade-gateway spend`: report, budgets and export (their parsers and bodies; the
rest of the command line is `gateway.cli`). The ledger, the archive and their
dependencies are imported inside each command, so other commands never load them.

    spend report [--from D] [--to D] [--group-by ...] [--archive DIR]
    spend budgets [--policy FILE]
    spend export --archive DIR [--once] [--metrics-port PORT]
    spend compact --archive DIR [--before D]
    spend reshard --shards N
    spend quality --route ROUTE [--last N] [--threshold T]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.errors import GatewayError
from policies import DEFAULT_POLICY_PATH, PolicyError, load_policy

if TYPE_CHECKING:
    from gateway.ledger import RedisStore
    from gateway.settings import Settings
    from gateway.spend.query import SpendQuery
    from gateway.spend.report import Aggregates, FormatType


def add_spend_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    spend = sub.add_parser("spend", help="spend from the ledger").add_subparsers(
        dest="spend_command", required=True
    )
    report = spend.add_parser(
        "report",
        help="spend, errors, reference cost and savings by group",
        description="Spend by group from the Redis ledger (REDIS_URL), as GET /v1/spend "
        "reports it, or from the archive (--archive DIR), for any past range. Days are "
        "UTC, both ends inclusive; by default the last 30 days.",
    )
    report.add_argument(
        "--from", dest="day_from", metavar="YYYY-MM-DD", help="first day (default: 29 before --to)"
    )
    report.add_argument(
        "--to", dest="day_to", metavar="YYYY-MM-DD", help="last day (default: today, UTC)"
    )
    report.add_argument("--group-by", default="team", help="comma-separated: day,team,key,...")
    report.add_argument("--format", choices=["csv", "json"], default="csv")
    report.add_argument(
        "--archive", metavar="DIR", type=Path, help="read the archive's Parquet files, not Redis"
    )
    report.set_defaults(func=cmd_spend_report)
    budgets = spend.add_parser("budgets", help="the policy's budgets: spent, burn rate, forecast")
    budgets.add_argument(
        "--policy",
        help="policy file or directory (default: CASCADE_POLICY, else the embedded default "
        "policy, as serve reads them)",
    )
    budgets.add_argument("--format", choices=["csv", "json"], default="csv")
    budgets.set_defaults(func=cmd_spend_budgets)
    export = spend.add_parser(
        "export",
        help="archive the ledger's records into daily Parquet files (a sidecar)",
        description="Drain the Redis ledger's event streams (REDIS_URL) into DIR/day=YYYY-MM-DD/"
        "*.parquet, every record once, as a gateway with CASCADE_LEDGER_ARCHIVE_DIR does; "
        "one exporter at a time holds a stream, the others wait to take over. Runs until "
        "SIGINT or SIGTERM, or with --once until the streams are drained.",
    )
    export.add_argument("--archive", metavar="DIR", type=Path, required=True)
    export.add_argument("--once", action="store_true", help="drain what is there, then exit")
    export.add_argument("--batch-max", type=int, default=20_000, help="records per file at most")
    export.add_argument(
        "--flush-interval", type=float, default=60.0, help="seconds records gather before a file"
    )
    export.add_argument(
        "--lease-ttl",
        type=float,
        default=30.0,
        help="seconds without renewal before another exporter takes a stream over",
    )
    export.add_argument(
        "--no-compact",
        dest="compact",
        action="store_false",
        help="leave closed days' files as written (see `spend compact`)",
    )
    export.add_argument(
        "--metrics-port", type=int, help="serve the backlog metrics on CASCADE_HOST:PORT/metrics"
    )
    export.set_defaults(func=cmd_spend_export)
    compact = spend.add_parser(
        "compact",
        help="merge each stream's archive files of a closed day into one",
        description="Merge each stream's Parquet files of every day before --before (today, "
        "UTC, by default) into one, under the archive's lock: reports then open a file per "
        "stream and day instead of one per flush. Safe beside running exporters.",
    )
    compact.add_argument("--archive", metavar="DIR", type=Path, required=True)
    compact.add_argument(
        "--before", type=_day, help="compact the days before this one (YYYY-MM-DD; default today)"
    )
    compact.set_defaults(func=cmd_spend_compact)
    reshard = spend.add_parser(
        "reshard",
        help="move a one-slot ledger onto N shards (for a Redis Cluster), gateways stopped",
        description="Move the ledger under CASCADE_REDIS_PREFIX on REDIS_URL from one hash "
        "tag ({ledger}) onto N ({ledger.K}), markers, aggregates and events, then record "
        "N; with CASCADE_REDIS_CLUSTER=true, budgets and rate limits move to their own "
        "slots too (--shards 1: only they move). Run it with every gateway and exporter "
        "stopped, then start them with CASCADE_LEDGER_SHARDS=N. A move cut short can be "
        "run again.",
    )
    reshard.add_argument("--shards", type=int, required=True, help="the shard count, 2 or more")
    reshard.set_defaults(func=cmd_spend_reshard)
    quality = spend.add_parser(
        "quality",
        help="a select route's deployments: predicted quality against what the verifier accepted",
        description="Per deployment of a select route, from its recent ledger records: "
        "answers, cost, the quality the predictor expected, the share the verifier "
        "accepted, their gap, and the offset the fleet has learned (REDIS_URL).",
    )
    quality.add_argument("--route", required=True)
    quality.add_argument(
        "--last", type=int, default=10_000, help="how many of the ledger's latest records to read"
    )
    quality.add_argument(
        "--threshold",
        type=float,
        help="the verifier score that counts as accepted (default: the route's verify_threshold)",
    )
    quality.add_argument("--policy", help="the gateway's policy (default: CASCADE_POLICY)")
    quality.add_argument("--format", choices=["csv", "json"], default="csv")
    quality.set_defaults(func=cmd_spend_quality)


def cmd_spend_report(args: argparse.Namespace) -> int:
    from gateway.settings import Settings

    query = _report_query(args)
    if query is None:
        return 2
    if not (args.day_from and args.day_to):
        print(f"spend report: from {query.day_from} to {query.day_to} (UTC)", file=sys.stderr)
    if args.archive is not None:
        return _archive_report(args.archive, query, args.format)
    settings = Settings()
    if not _redis_set(settings, "the report reads the Redis ledger"):
        return 1

    async def report(store: RedisStore) -> str:
        return await _render_report(store, query, args.format)

    return _print_from_ledger(settings, report)


def _report_query(args: argparse.Namespace) -> SpendQuery | None:
    """The API's parameters and defaults (the last 30 days), checked the API's way; the
    archive's range has no limit."""
    from gateway.spend.query import MAX_DAYS, parse_query

    params = {"from": args.day_from or "", "to": args.day_to or "", "group_by": args.group_by}
    max_days = None if args.archive is not None else MAX_DAYS
    try:
        return parse_query(params, list(params), datetime.now(UTC).date(), max_days)
    except GatewayError as exc:
        print(f"spend report: {exc.message}", file=sys.stderr)
        return None


async def _render_report(store: Aggregates, query: SpendQuery, fmt: FormatType) -> str:
    """The API's reply (JSON with its total and note, or CSV), whether `store` is the
    Redis ledger or the archive."""
    from gateway.spend.report import aggregate, render

    rows = await aggregate(store, query.day_from, query.day_to, query.group_by)
    return render(query, rows, fmt)


def _archive_report(root: Path, query: SpendQuery, fmt: FormatType) -> int:
    from gateway.ledger.archive import ArchiveDependencyMissing
    from gateway.spend.archive_report import ArchiveAggregates, ArchiveUnreadable

    if not root.is_dir():
        print(f"spend report: no archive at {root}", file=sys.stderr)
        return 1
    try:
        text = asyncio.run(_render_report(ArchiveAggregates(root), query, fmt))
    except (ArchiveDependencyMissing, ArchiveUnreadable) as exc:
        print(f"spend report: {exc}", file=sys.stderr)
        return 1
    print(text, end="")
    return 0


def _print_from_ledger(settings: Settings, read: Callable[[RedisStore], Awaitable[str]]) -> int:
    """Print what `read` renders from the Redis ledger the settings name; 1 (and why)
    when it cannot be read."""
    from gateway.ledger import LedgerUnavailable, read_ledger

    try:
        text = read_ledger(settings, _refusal_named(read))
    except (ValueError, LedgerUnavailable, LedgerRefused) as exc:
        print(exc, file=sys.stderr)
        return 1
    print(text, end="")
    return 0


class LedgerRefused(Exception):
    """Redis answered the ledger's reads with an error (a database it does not have,
    a command it refuses): reached, unlike `LedgerUnavailable`, but of no use."""


def _refusal_named(
    read: Callable[[RedisStore], Awaitable[str]],
) -> Callable[[RedisStore], Awaitable[str]]:
    """`read`, its Redis errors raised as `LedgerRefused` naming the server."""
    from redis.exceptions import RedisError

    from gateway.redis_client import address

    async def named(store: RedisStore) -> str:
        try:
            return await read(store)
        except RedisError as exc:
            where = address(store.client)
            raise LedgerRefused(f"redis at {where} refused to read the ledger: {exc}") from exc

    return named


def cmd_spend_budgets(args: argparse.Namespace) -> int:
    from gateway.settings import Settings
    from gateway.spend import budget_statuses, render_budgets

    settings = Settings(**({"policy": args.policy} if args.policy else {}))
    try:
        policy = load_policy(settings.policy).policy
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    if not policy.budgets:  # say why the table is empty, and which policy was read
        default = " (the embedded default)" if settings.policy == DEFAULT_POLICY_PATH else ""
        print(
            f"spend budgets: the policy {settings.policy}{default} has no budgets (its "
            "`budgets:` section); name the gateway's policy with --policy FILE or CASCADE_POLICY",
            file=sys.stderr,
        )
        print(render_budgets([], args.format), end="")
        return 0
    if not _redis_set(settings, "budget status reads the Redis ledger"):
        return 1

    async def budgets(store: RedisStore) -> str:
        statuses = await budget_statuses(store, policy.budgets, datetime.now(UTC))
        return render_budgets(statuses, args.format)

    return _print_from_ledger(settings, budgets)


def cmd_spend_quality(args: argparse.Namespace) -> int:
    from gateway.settings import Settings
    from gateway.spend.quality import NoSelectAnswers, learned_offsets, render, tally

    settings = Settings(**({"policy": args.policy} if args.policy else {}))
    threshold = args.threshold
    if threshold is None:
        try:
            route = load_policy(settings.policy).policy.routes.get(args.route)
        except PolicyError as exc:
            print(exc, file=sys.stderr)
            return 1
        if route is None:
            print(
                f"spend quality: the policy {settings.policy} has no route '{args.route}' "
                "(name the gateway's with --policy, or give --threshold)",
                file=sys.stderr,
            )
            return 1
        threshold = route.verify_threshold
    if not _redis_set(settings, "spend quality reads the Redis ledger"):
        return 1

    async def report(store: RedisStore) -> str:
        tallies = tally(await store.events(args.last), args.route, threshold)
        if not tallies:
            raise NoSelectAnswers(
                f"spend quality: no answer of a select choice on route '{args.route}' among "
                f"the ledger's last {args.last} records"
            )
        deployments = [q.deployment for q in tallies]
        learned = await learned_offsets(store.client, settings.redis_prefix, deployments)
        return render(tallies, learned, args.format)

    try:
        return _print_from_ledger(settings, report)
    except NoSelectAnswers as exc:
        print(exc, file=sys.stderr)
        return 1


def _redis_set(settings: Settings, why: str) -> bool:
    """Whether REDIS_URL is set; if not, say so (and `why` it is needed)."""
    if not settings.redis_url:
        print(f"set REDIS_URL: {why}", file=sys.stderr)
    return bool(settings.redis_url)


def _day(text: str) -> date:
    """An argparse type: a day as YYYY-MM-DD."""
    with contextlib.suppress(ValueError):
        if len(text) == 10:
            return date.fromisoformat(text)
    raise argparse.ArgumentTypeError(f"'{text}' is not a date as YYYY-MM-DD")


def cmd_spend_compact(args: argparse.Namespace) -> int:
    from gateway.ledger.archive import ArchiveDependencyMissing, compact

    if not args.archive.is_dir():
        print(f"spend compact: no archive at {args.archive}", file=sys.stderr)
        return 1
    before = args.before or datetime.now(UTC).date()
    try:
        done = compact(args.archive, before)
    except ArchiveDependencyMissing as exc:
        print(f"spend compact: {exc}", file=sys.stderr)
        return 1
    print(
        f"compacted {done.days} day(s) before {before}: {done.merged} files into "
        f"{done.written} ({done.rows} rows), {done.superseded} leftover file(s) deleted"
    )
    return 0


def cmd_spend_reshard(args: argparse.Namespace) -> int:
    from gateway.settings import Settings

    settings = Settings()
    if not _redis_set(settings, "the ledger to move is on Redis"):
        return 1
    return asyncio.run(_reshard(settings, args.shards))


async def _reshard(settings: Settings, shards: int) -> int:
    if shards == 1 and not settings.redis_cluster:
        print(
            "spend reshard: --shards 1 keeps the ledger in one slot, and off a cluster the "
            "limits stay there too: nothing to move",
            file=sys.stderr,
        )
        return 1
    from gateway.ledger.reshard import ReshardRefused, reshard
    from gateway.limits.respread import spread_limits
    from gateway.redis_client import redis_client

    client = redis_client(
        settings.redis_url or "",
        socket_timeout=10.0,
        connect_timeout=5.0,
        max_connections=4,
        cluster=settings.redis_cluster,
    )
    try:
        moved = await reshard(client, settings.redis_prefix, shards)
        # On a cluster, limits live in their own slots too: the period's spend moves.
        limits = await spread_limits(client, settings.redis_prefix) if settings.redis_cluster else 0
    except ReshardRefused as exc:
        print(f"spend reshard: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.aclose()
    print(
        f"moved {moved.markers} marker(s), {moved.day_keys} aggregate key(s), "
        f"{moved.events} event(s) and {limits} limit key(s) onto {shards} shards: start "
        f"the gateways with CASCADE_LEDGER_SHARDS={shards}"
    )
    return 0


def cmd_spend_export(args: argparse.Namespace) -> int:
    from gateway.ledger.archive import ArchiveDependencyMissing, check_installed
    from gateway.settings import Settings, configure_logging

    settings = Settings()
    if not _redis_set(settings, "the exporter reads the Redis ledger's event streams"):
        return 1
    try:
        check_installed()
    except ArchiveDependencyMissing as exc:
        print(f"spend export: {exc}", file=sys.stderr)
        return 1
    configure_logging(settings.log_level, settings.log_format)
    return asyncio.run(_export(args, settings))


# The sidecar shares its event loop with nothing: it reads larger pages than a gateway.
SIDECAR_READ_COUNT = 1000


async def _export(args: argparse.Namespace, settings: Settings) -> int:
    from prometheus_client import CollectorRegistry, start_http_server
    from redis.exceptions import RedisError

    from gateway.ledger import LedgerUnavailable, RedisStore
    from gateway.ledger.archive import ArchiveBusy, ArchiveOptions, build_exporter
    from gateway.metrics import ArchiveMetrics

    store = RedisStore.from_settings(settings)
    registry = CollectorRegistry()
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, addr=settings.host, registry=registry)
    options = ArchiveOptions(
        batch_max=args.batch_max,
        read_count=SIDECAR_READ_COUNT,
        flush_s=args.flush_interval,
        lease_ttl_s=args.lease_ttl,
        compact=args.compact,
    )
    exporter = build_exporter(store, args.archive, options, ArchiveMetrics(registry))
    try:
        await store.check_layout()  # another shard count: other streams than the gateways'
        if args.once:
            archived = await exporter.drain()
            print(f"archived {archived} record(s) into {args.archive}")
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        exporter.start()
        await stop.wait()
        await exporter.stop()
        return 0
    except (ArchiveBusy, LedgerUnavailable, ValueError, RedisError, OSError) as exc:
        print(f"spend export: {exc}", file=sys.stderr)
        return 1
    finally:
        await exporter.close()
        await store.close()
