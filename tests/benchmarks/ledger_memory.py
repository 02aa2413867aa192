"""Redis memory per request the ledger keeps, beyond the dedupe window's markers.

    python -m tests.benchmarks.ledger_memory [--records 20000]

Three layouts on one private `redis-server`, in the same run, each on its own prefix:

    40-day markers, no archive   the ledger as it was: every record's marker lives
                                 40 days and its stream entry until MAXLEN trims it
    2 s window, no archive       markers expire, stream entries stay
    2 s window, archive          `spend export --archive DIR --once` drains the stream
                                 into Parquet and deletes what it archived

Each writes `--records` records through `RedisStore.record_many`, waits past the window
and sweeps expired keys, then reads `used_memory`. Target: the archive layout grows
Redis by at most 100 bytes per request.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from gateway.ledger import RedisStore
from tests.gateway.ledger_fixtures import RedisServer, make_record

TARGET_BYTES = 100
WINDOW_S = 2
FORTY_DAYS_S = 40 * 86400
BATCH = 32


async def write(url: str, prefix: str, records: int, dedupe_s: int) -> None:
    store = RedisStore(url, prefix=prefix, dedupe_ttl_s=dedupe_s, stream_maxlen=10 * records)
    try:
        recs = [make_record(i) for i in range(records)]
        for start in range(0, records, BATCH):
            await store.record_many(recs[start : start + BATCH])
    finally:
        await store.close()


def export(url: str, prefix: str, archive: Path) -> None:
    env = {**os.environ, "REDIS_URL": url, "CASCADE_REDIS_PREFIX": prefix}
    command = [sys.executable, "-m", "gateway.cli", "spend", "export", "--archive", str(archive)]
    subprocess.run([*command, "--once"], env=env, check=True, stdout=subprocess.DEVNULL)


def sweep_expired(client: redis.Redis, prefix: str, timeout_s: float = 60.0) -> None:
    """Touch every marker until none is left: Redis deletes an expired key it meets."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        markers = client.scan_iter(f"{prefix}*:rec:*", count=1000)
        if not [key for key in markers if client.exists(key)]:
            return
        time.sleep(0.2)


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure(server: RedisServer, name: str, records: int, dedupe_s: int, archive: bool) -> float:
    client = redis.Redis.from_url(server.url)
    prefix = "mem-" + "".join(c if c.isalnum() else "-" for c in name) + ":"
    before = used(client)
    asyncio.run(write(server.url, prefix, records, dedupe_s))
    if archive:
        with tempfile.TemporaryDirectory() as root:
            export(server.url, prefix, Path(root))
    if dedupe_s <= WINDOW_S:
        time.sleep(dedupe_s + 1)
        sweep_expired(client, prefix)
    grown = (used(client) - before) / records
    keys = sum(1 for _ in client.scan_iter(f"{prefix}*", count=1000))
    print(f"{name:<28} {grown:8.0f} bytes/request   ({keys} keys left)")
    return grown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(Path(workdir) / "redis")
        server.start()
        try:
            print(f"{args.records} records per layout; dedupe window {WINDOW_S} s")
            today = measure(server, "40-day markers, no archive", args.records, FORTY_DAYS_S, False)
            measure(server, "2 s window, no archive", args.records, WINDOW_S, False)
            archived = measure(server, "2 s window, archive", args.records, WINDOW_S, True)
        finally:
            server.stop()
    verdict = "met" if archived <= TARGET_BYTES else "MISSED"
    print(f"archive layout: {archived:.0f} bytes/request against {today:.0f} before "
          f"(target <= {TARGET_BYTES}): {verdict}")  # fmt: skip
    return 0 if archived <= TARGET_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
