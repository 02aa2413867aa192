"""The spend archive under load, through an exporter restart and a Redis restart.

    python -m tests.benchmarks.archive_run [--rate 500] [--duration 60]
    python -m tests.benchmarks.archive_run --hour            # 3600 s at --rate

Records go through the real ledger (`CostLedger` on `RedisStore`, spooling while Redis
is away) at `--rate` per second into a private `redis-server` (AOF, fsync always), while
a `cascade-gateway spend export` process archives them. A third of the way in the
exporter is SIGKILLed and a new one started (it takes over once the lease lapses); two
thirds in, Redis is killed and restarted. Then writing stops, the ledger's spool and
the stream drain, and the archive is read back. Printed (JSON): records written,
archived, duplicates, missing, files, the largest backlog seen, and how long a
whole-archive report took. Exits 1 if any record is missing or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from redis.exceptions import RedisError

from gateway.ledger import CostLedger, RedisStore, Spool
from gateway.spend.archive_report import ArchiveAggregates
from tests.gateway.archive_support import varied_record
from tests.gateway.ledger_fixtures import RedisServer

REPO = Path(__file__).resolve().parents[2]
TICK_S = 0.01


def start_exporter(
    url: str, prefix: str, root: Path, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "REDIS_URL": url, "CASCADE_REDIS_PREFIX": prefix}
    command = [sys.executable, "-m", "gateway.cli", "spend", "export", "--archive", str(root)]
    command += ["--flush-interval", str(args.flush), "--lease-ttl", str(args.lease_ttl)]
    return subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.DEVNULL)


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    redis_server = RedisServer(work / "redis")
    redis_server.start()
    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    root = work / "archive"
    store = RedisStore(redis_server.url, prefix=prefix)
    [key] = store.event_stream_keys()
    ledger = CostLedger(store, Spool(work / "spool"), replay_interval_s=0.5)
    ledger.start()
    exporter = start_exporter(redis_server.url, prefix, root, args)
    written, max_backlog, events = 0, 0, []
    started = time.monotonic()
    restarted_exporter = restarted_redis = False
    next_sample = 0.0
    try:
        while (elapsed := time.monotonic() - started) < args.duration:
            due = int(elapsed * args.rate) - written
            now = datetime.now(UTC).timestamp()
            for i in range(written, written + due):
                ledger.submit(dataclasses.replace(varied_record(i), ts=now))
            written += due
            if not restarted_exporter and elapsed > args.duration / 3:
                exporter.kill()
                exporter.wait()
                exporter = start_exporter(redis_server.url, prefix, root, args)
                restarted_exporter = True
                events.append(f"{elapsed:.1f}s: exporter killed and restarted")
            if not restarted_redis and elapsed > 2 * args.duration / 3:
                redis_server.kill()
                events.append(f"{elapsed:.1f}s: redis killed")
                await asyncio.sleep(args.redis_down)
                redis_server.start()
                restarted_redis = True
                events.append(f"{time.monotonic() - started:.1f}s: redis restarted")
            if elapsed > next_sample:
                next_sample = elapsed + 1
                with contextlib.suppress(RedisError):  # Redis away: the next sample
                    max_backlog = max(max_backlog, await store.client.xlen(key))
            await asyncio.sleep(TICK_S)
        events.append(f"{time.monotonic() - started:.1f}s: writing stopped")
        drain_started = time.monotonic()
        while ledger.spooled_count or await store.client.xlen(key):
            if time.monotonic() - drain_started > args.drain_timeout:
                break
            await asyncio.sleep(0.5)
        events.append(f"drained in {time.monotonic() - drain_started:.1f}s")
        exporter.send_signal(signal.SIGTERM)
        exporter.wait(timeout=60)
    finally:
        exporter.kill()
        await ledger.stop()
        await store.close()
        redis_server.stop()

    counts: Counter[str] = Counter()
    files = sorted(root.glob("day=*/*.parquet"))
    for path in files:
        counts.update(pq.read_table(path, columns=["record_id"]).column("record_id").to_pylist())
    ids = {varied_record(i).record_id for i in range(written)}
    report_started = time.monotonic()
    [total] = ArchiveAggregates(root).aggregate_now(
        datetime(2000, 1, 1).date(), datetime(2100, 1, 1).date(), []
    )
    report_s = time.monotonic() - report_started
    return {
        "rate_per_s": args.rate,
        "duration_s": args.duration,
        "written": len(ids),
        "archived": len(counts),
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "missing": len(ids - set(counts)),
        "unexpected": len(set(counts) - ids),
        "files": len(files),
        "max_backlog": max_backlog,
        "report_calls": total.calls + total.errors,
        "report_s": round(report_s, 3),
        "events": events,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=500, help="records per second")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of writing")
    parser.add_argument("--hour", action="store_true", help="run for 3600 s")
    parser.add_argument("--flush", type=float, default=5.0, help="exporter's flush interval")
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="exporter's lease")
    parser.add_argument("--redis-down", type=float, default=3.0, help="seconds Redis is away")
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    args = parser.parse_args()
    if args.hour:
        args.duration = 3600.0
    with tempfile.TemporaryDirectory(prefix="archive-run-") as work:
        result = asyncio.run(run(args, Path(work)))
    print(json.dumps(result, indent=2))
    return 0 if result["missing"] == result["duplicates"] == result["unexpected"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
