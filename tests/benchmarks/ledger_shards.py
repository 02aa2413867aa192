"""Ledger writes per second: one plain Redis against a 3-master Redis Cluster with the
ledger spread over N shards, in the same run.

    python -m tests.benchmarks.ledger_shards [--processes 4] [--records 20000]
        [--batch 32] [--concurrency 4] [--shards 16] [--reps 3] [--min-replicas 1]

Each of `--processes` client processes (a gateway worker each) writes `--records`
records through its own `RedisStore.record_many`, in batches of `--batch` (the ledger
writer's BATCH_MAX), `--concurrency` batches in flight. Both targets run without
persistence, and every master (the plain Redis too) feeds one replica, as in
production: Redis replicates a script by its effects, so a replica replays each
record's ~100 writes. The figure is records over the wall time from the first process's
start to the last one's end; the best of `--reps` runs per target is reported.
`--min-replicas 1` measures both targets again with `CASCADE_LEDGER_MIN_REPLICAS=1`
(a WAIT per batch and master: `gateway/ledger/replicas.py`), the price of that setting.

Target: the cluster takes at least 2x the plain node's writes. That needs CPU beyond
what one Redis and its clients use: on a machine with few cores the writers, the
`redis-server` processes and the replication share them, and the ratio says so. The
CPU each side spent per record is printed too, and each target's ceiling: the records
per second its busiest master's core allows, the bound once every Redis process has a
core and the writers enough.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import redis

from gateway.ledger import LedgerUnavailable, RedisStore, SpendRecord
from tests.cluster import LocalCluster, free_ports
from tests.gateway.ledger_fixtures import make_record
from tests.support import eventually

TARGET_RATIO = 2.0
Span = tuple[float, float, float]  # a writer's start, end, CPU seconds


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    cluster: bool
    shards: int
    min_replicas: int = 0


@dataclass(frozen=True)
class Job:
    target: Target
    prefix: str
    process: int
    records: int
    batch: int
    concurrency: int


def records_of(job: Job) -> list[SpendRecord]:
    ids = (f"{job.prefix}p{job.process}-{i}" for i in range(job.records))
    return [make_record(i, record_id=rid, request_id=rid) for i, rid in enumerate(ids)]


async def write(job: Job, start: float) -> tuple[float, float, float]:
    """Write the job's records; the timed part's start and end (wall clock) and the
    CPU seconds this process spent in it."""
    target = job.target
    store = RedisStore(
        target.url,
        prefix=job.prefix,
        cluster=target.cluster,
        shards=target.shards,
        min_replicas=target.min_replicas,
    )
    records = records_of(job)
    batches = [records[i : i + job.batch] for i in range(0, len(records), job.batch)]
    try:
        await until_written(store, make_warmup(job))  # connections, script, layout check
        await asyncio.sleep(max(0.0, start - time.time()))
        began, cpu = time.time(), time.process_time()
        queue = iter(batches)

        async def lane() -> None:
            for batch in queue:
                await until_written(store, batch)

        await asyncio.gather(*(lane() for _ in range(job.concurrency)))
        return began, time.time(), time.process_time() - cpu
    finally:
        await store.close()


async def until_written(store: RedisStore, batch: list[SpendRecord]) -> None:
    """`record_many`, sent again while unconfirmed (a WAIT short of replicas), as the
    ledger's replay would; each record counted once all the same."""
    for _ in range(100):
        try:
            added = await store.record_many(batch)
        except LedgerUnavailable:
            await asyncio.sleep(0.05)
            continue
        assert all(added) or store.replica_ack, "a fresh record was counted as a duplicate"
        return
    raise RuntimeError("a batch was never confirmed")


def make_warmup(job: Job) -> list[SpendRecord]:
    rids = [f"{job.prefix}warm-p{job.process}-{i}" for i in range(job.batch)]
    return [make_record(i, record_id=rid, request_id=rid) for i, rid in enumerate(rids)]


def run_process(job: Job, start: float, out: multiprocessing.Queue[Span]) -> None:
    out.put(asyncio.run(write(job, start)))


@dataclass(frozen=True)
class Result:
    rate: float  # records per second
    client_us: float  # writer CPU per record, microseconds
    master_us: float  # CPU per record of the nodes that serve slots, together
    replica_us: float  # of their replicas, together
    busiest_us: float  # of the busiest master: a core each, its ceiling is 1e6 / this


def measure(
    target: Target, nodes: tuple[list[int], list[int]], args: argparse.Namespace, rep: int
) -> Result:
    """One run of every writer process against `target`, whose servers are `nodes`
    (masters, replicas)."""
    prefix = f"bench{rep}-wait{target.min_replicas}:"  # fresh records for each target
    start = time.time() + 3.0  # every process set up and warm by then
    results: multiprocessing.Queue[Span] = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(
            target=run_process,
            args=(
                Job(target, prefix, k, args.records, args.batch, args.concurrency),
                start,
                results,
            ),
        )
        for k in range(args.processes)
    ]
    for proc in procs:
        proc.start()
    before = {port: cpu_seconds(port) for group in nodes for port in group}
    spans = [results.get(timeout=600) for _ in procs]
    used = {port: cpu_seconds(port) - cpu for port, cpu in before.items()}
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a writer process failed ({proc.exitcode})")
    total = args.processes * args.records
    wall = max(end for _, end, _ in spans) - min(began for began, _, _ in spans)
    client_cpu = sum(cpu for _, _, cpu in spans)
    # The servers' CPU includes the warm-up (one batch per writer): negligible.
    masters, replicas = ([used[port] for port in group] for group in nodes)
    cpu = (client_cpu, sum(masters), sum(replicas), max(masters))
    return Result(total / wall, *(seconds / total * 1e6 for seconds in cpu))


def cpu_seconds(port: int) -> float:
    with redis.Redis(port=port, decode_responses=True) as client:
        info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def plain_redis(workdir: Path, *, replica_of: int | None = None) -> PlainNode:
    """A redis-server without persistence; with `replica_of`, that node's replica."""
    [port] = free_ports(1)
    (workdir / str(port)).mkdir(parents=True)
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--dir", str(workdir / str(port)), "--daemonize", "no"]
    if replica_of is not None:
        command += ["--replicaof", "127.0.0.1", str(replica_of)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    eventually(lambda: _answers(port), 10, f"redis-server on {port}")
    if replica_of is not None:
        eventually(lambda: _linked(port), 10, f"the replica on {port} in sync")
    return PlainNode(proc, port)


@dataclass(frozen=True)
class PlainNode:
    proc: subprocess.Popen[bytes]
    port: int

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _linked(port: int) -> bool:
    with redis.Redis(port=port, decode_responses=True) as client:
        return bool(client.info("replication").get("master_link_status") == "up")


def url_of(port: int) -> str:
    return f"redis://127.0.0.1:{port}/0"


def _answers(port: int) -> bool:
    done = subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True, check=False)
    return done.stdout.strip() == b"PONG"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=max(2, os.cpu_count() or 2))
    parser.add_argument("--records", type=int, default=20_000, help="per process")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4, help="batches in flight")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--min-replicas", type=int, default=0, help="also with this WAIT")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        plain = plain_redis(Path(tmp) / "plain")
        replica = plain_redis(Path(tmp) / "plain", replica_of=plain.port)
        try:
            with LocalCluster(Path(tmp) / "cluster") as cluster:
                masters = cluster.masters()
                replicas = [p for p in cluster.ports if p not in masters]
                runs = [
                    (
                        Target("plain Redis, 1 shard", url_of(plain.port), False, 1),
                        ([plain.port], [replica.port]),
                    ),
                    (
                        Target(f"cluster, {args.shards} shards", cluster.url, True, args.shards),
                        (masters, replicas),
                    ),
                ]
                if args.min_replicas:  # the same again, each batch waiting for replicas
                    runs += [
                        (replace(t, name=f"{t.name} + WAIT", min_replicas=args.min_replicas), n)
                        for t, n in runs
                    ]
                results = {
                    target.name: max(
                        (measure(target, nodes, args, rep) for rep in range(args.reps)),
                        key=lambda result: result.rate,
                    )
                    for target, nodes in runs
                }
        finally:
            replica.stop()
            plain.stop()

    print(
        f"{args.processes} writer processes x {args.records} records, batches of "
        f"{args.batch}, {args.concurrency} in flight; best of {args.reps}; "
        f"{os.cpu_count()} CPUs"
    )
    print("  CPU per record, microseconds: writers, masters, replicas (each all together)")
    print("  and the busiest master, whose core bounds the target: ceiling = 1e6 / that")
    header = f"{'records/s':>10} {'writers':>8} {'masters':>8} {'replicas':>8} {'busiest':>8}"
    print(f"  {'target':<32} {header} {'ceiling':>10}")
    for name, r in results.items():
        cpu = f"{r.client_us:>8.0f} {r.master_us:>8.0f} {r.replica_us:>8.0f} {r.busiest_us:>8.0f}"
        print(f"  {name:<32} {r.rate:>10,.0f} {cpu} {1e6 / r.busiest_us:>10,.0f}")
    plain_result, cluster_result = list(results.values())[:2]
    ratio = cluster_result.rate / plain_result.rate
    verdict = "met" if ratio >= TARGET_RATIO else "not met"
    print(f"  ratio {ratio:.2f}x (target {TARGET_RATIO:.0f}x: {verdict})")
    ceilings = plain_result.busiest_us / cluster_result.busiest_us
    print(f"  ratio of the ceilings {ceilings:.2f}x (a core per Redis process, writers enough)")
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
