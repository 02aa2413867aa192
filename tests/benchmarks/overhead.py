"""Gateway latency overhead: the shared load driver, direct vs through the gateway.

Starts the shared fake upstream and the gateway (Redis ledger on, unless --no-redis),
runs `../shared/bench/overhead.py` (open-loop, fixed rate, direct and gateway in the
same run), then prints the added latency per mode and rate, checks the target and
compares the ledger's event count with the requests the gateway answered.

    python -m tests.benchmarks.overhead             # 100,500,1000 req/s, 10 s x 3 reps (~7 min)
    python -m tests.benchmarks.overhead --quick     # smoke run, about 40 s
    python -m tests.benchmarks.overhead --no-redis --rates 500 --profile gw.svg

CPU layout (2 cores): the gateway alone on CPU 0; the fake upstream and the driver,
two small asyncio loops, share CPU 1; Redis runs wherever the OS puts it.
Target: at 500 req/s, added p50 <= 1 ms and added p99 <= 5 ms, no errors or drops.
Exit status: 0 target met and ledger consistent, 1 otherwise, 2 the run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHARED_BENCH = REPO.parent / "shared" / "bench"
POLICY = "policies/examples/openai-compatible.yaml"
QUICK = {"rates": "50,200", "duration": 3.0, "reps": 1}

TARGET_RATE = 500.0
TARGET_P50_MS = 1.0
TARGET_P99_MS = 5.0
# The driver warms each target up for 1 s at min(rate, 200) req/s before every
# measured run, and reports only the measured runs.
WARMUP_RATE_CAP = 200

OUR_ENV_PREFIXES = ("CASCADE_", "UPSTREAM_", "GATEWAY_")
OUR_ENV_NAMES = ("REDIS_URL",)
# Keep every event in the stream (the default MAXLEN ~100k would trim a full run).
STREAM_MAXLEN = 100_000_000
METRIC_OK = re.compile(r'^cascade_requests_total\{[^}]*status="200"[^}]*\}\s+(\S+)', re.M)

log = logging.getLogger("benchmarks.overhead")


class BenchmarkError(Exception):
    """The benchmark could not run (a process died, a port never answered, no Redis)."""


@dataclass
class Child:
    """A subprocess in its own session (Ctrl-C reaches only us; we stop it in order)."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path | None = None

    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 15.0) -> None:
        """Signal, wait up to `grace_s`, then kill."""
        if not self.running():
            return
        self.popen.send_signal(sig)
        try:
            self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", self.name, grace_s)
            self.popen.kill()
            self.popen.wait()

    def tail(self, lines: int = 25) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:]) or "(empty log)"


def spawn(
    name: str, argv: Sequence[str], cpu: int | None, env: dict[str, str], logs: Path | None
) -> Child:
    """Start `argv` in the repo root, pinned to `cpu`; output to `logs/<name>.log` or ours."""
    log_path = None if logs is None else logs / f"{name}.log"
    out = None if log_path is None else log_path.open("wb")
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    try:
        popen = subprocess.Popen(
            list(argv),
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
            preexec_fn=pin,
        )
    finally:
        if out is not None:
            out.close()
    log.info("started %s (pid %d%s)", name, popen.pid, "" if cpu is None else f", cpu {cpu}")
    return Child(name, popen, log_path)


def gateway_env() -> dict[str, str]:
    """This process's environment without our own settings: a gateway child configured
    only by what the benchmark sets."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(OUR_ENV_PREFIXES) and name not in OUR_ENV_NAMES
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# Loopback only: never let an http_proxy variable route these requests elsewhere.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout_s: float = 2.0) -> bytes:
    with _HTTP.open(url, timeout=timeout_s) as response:
        body: bytes = response.read()
        return body


def wait_ready(url: str, child: Child, timeout_s: float) -> None:
    """Poll `url` until it answers 200; fail early if `child` exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not child.running():
            raise BenchmarkError(
                f"{child.name} exited with status {child.popen.returncode} before {url} "
                f"answered; its log ends:\n{child.tail()}"
            )
        with contextlib.suppress(urllib.error.URLError, OSError):
            http_get(url, timeout_s=1.0)
            return
        if time.monotonic() > deadline:
            raise BenchmarkError(
                f"{url} did not answer 200 within {timeout_s:.0f} s:\n{child.tail()}"
            )
        time.sleep(0.1)


class RedisLedger:
    """The benchmark's own keys in Redis: a random prefix, counted and deleted by SCAN."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis  # the gateway's dependency; imported here so --no-redis needs no server

        self.url = url
        self.prefix = prefix
        self._client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10)
        self._errors: tuple[type[Exception], ...] = (redis.RedisError, OSError)

    def check(self) -> None:
        try:
            self._client.ping()
        except self._errors as exc:
            raise BenchmarkError(
                f"Redis at {self.url} is unreachable ({exc}); try --no-redis"
            ) from exc

    def event_count(self) -> int:
        return int(self._client.xlen(f"{self.prefix}{{ledger}}:events"))

    def delete_keys(self) -> int:
        """Delete every key under our prefix (SCAN + UNLINK in batches; never FLUSHDB)."""
        deleted, batch = 0, []
        for key in self._client.scan_iter(match=f"{self.prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                deleted += int(self._client.unlink(*batch))
                batch = []
        if batch:
            deleted += int(self._client.unlink(*batch))
        return deleted

    def close(self) -> None:
        self._client.close()


@dataclass(frozen=True)
class Row:
    """One mode and rate: medians over reps per target, errors and drops summed."""

    mode: str
    rate: float
    direct: dict[str, float]
    gateway: dict[str, float]
    gw_errors: int
    gw_dropped: int
    gw_error_kinds: dict[str, int]
    dir_errors: int

    def added(self, p: int) -> float:
        return self.gateway[f"p{p}"] - self.direct[f"p{p}"]

    def ratio(self, p: int) -> float:
        direct = self.direct[f"p{p}"]
        return self.gateway[f"p{p}"] / direct if direct else float("nan")

    def meets_target(self) -> bool:
        clean = self.gw_errors == 0 and self.gw_dropped == 0
        return clean and self.added(50) <= TARGET_P50_MS and self.added(99) <= TARGET_P99_MS


def summarize(results: list[dict[str, Any]]) -> list[Row]:
    """Group the driver's per-run JSON into rows, in the order the driver ran them."""
    groups: dict[tuple[str, float], dict[str, list[dict[str, Any]]]] = {}
    for run in results:
        group = groups.setdefault((run["mode"], run["rate"]), {"direct": [], "gateway": []})
        group[run["target"]].append(run)
    rows = []
    for (mode, rate), runs in groups.items():
        kinds: dict[str, int] = {}
        for run in runs["gateway"]:
            for kind, n in run["errors"].items():
                kinds[kind] = kinds.get(kind, 0) + n
        rows.append(
            Row(
                mode=mode,
                rate=rate,
                direct=_medians(runs["direct"]),
                gateway=_medians(runs["gateway"]),
                gw_errors=sum(r["err"] for r in runs["gateway"]),
                gw_dropped=sum(r["dropped"] for r in runs["gateway"]),
                gw_error_kinds=kinds,
                dir_errors=sum(r["err"] + r["dropped"] for r in runs["direct"]),
            )
        )
    return rows


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("p50", "p90", "p99", "rps", "ok")
    return {key: statistics.median(r[key] for r in runs) if runs else float("nan") for key in keys}


def report(rows: list[Row]) -> bool:
    """Print the summary table; True if the target holds at TARGET_RATE in every mode."""
    print("\n== summary (ms; stream = TTFT; medians over reps; errors/drops summed over reps)")
    print(
        f"{'mode':9} {'rate':>5} | {'direct p50/p99':>14} | {'gateway p50/p99':>15} | "
        f"{'added p50/p99':>13} | {'gw/direct p50/p99':>17} | {'rps dir/gw':>10} | "
        f"{'err dir/gw':>10} | {'drop gw':>7} | target"
    )
    for r in rows:
        verdict = ("met" if r.meets_target() else "MISSED") if r.rate == TARGET_RATE else "-"
        print(
            f"{r.mode:9} {r.rate:5.0f} | {r.direct['p50']:6.2f}/{r.direct['p99']:<7.2f} | "
            f"{r.gateway['p50']:6.2f}/{r.gateway['p99']:<8.2f} | "
            f"{r.added(50):6.2f}/{r.added(99):<6.2f} | {r.ratio(50):7.3f}/{r.ratio(99):<9.3f} | "
            f"{r.direct['rps']:4.0f}/{r.gateway['rps']:<5.0f} | "
            f"{r.dir_errors:4d}/{r.gw_errors:<5d} | {r.gw_dropped:7d} | {verdict}"
        )
        if r.gw_error_kinds:
            print(f"{'':15} gateway errors: {r.gw_error_kinds}")
    at_target = [r for r in rows if r.rate == TARGET_RATE]
    rule = (
        f"added p50 <= {TARGET_P50_MS:g} ms, p99 <= {TARGET_P99_MS:g} ms, "
        f"no errors at {TARGET_RATE:.0f} req/s"
    )
    if not at_target:
        print(f"target ({rule}): not evaluated, no {TARGET_RATE:.0f} req/s run")
        return True
    met = all(r.meets_target() for r in at_target)
    print(f"target ({rule}): {'MET' if met else 'MISSED'}")
    return met


def warmup_requests(rates: Sequence[float], modes: int, reps: int) -> int:
    """Requests the driver sends in warm-ups (it reports only the measured runs)."""
    return modes * reps * sum(int(min(int(rate), WARMUP_RATE_CAP) * 1.0) for rate in rates)


def gateway_ok_count(base: str) -> int | None:
    """Requests the gateway answered 200, from its /metrics; None if unreadable."""
    try:
        text = http_get(f"{base}/metrics", timeout_s=5.0).decode()
    except (urllib.error.URLError, OSError):
        return None
    return round(sum(float(value) for value in METRIC_OK.findall(text)))


def spooled_lines(spool: Path) -> int:
    count = 0
    for path in (spool, spool.with_name(spool.name + ".replaying")):
        with contextlib.suppress(FileNotFoundError):
            count += sum(1 for line in path.read_bytes().splitlines() if line.strip())
    return count


@dataclass
class Bench:
    """One benchmark run: its processes, its Redis keys, its temporary files."""

    args: argparse.Namespace
    tmp: Path
    ledger: RedisLedger | None
    children: list[Child]

    def start_upstream(self) -> str:
        script = SHARED_BENCH / "fake_upstream.py"
        port = free_port()
        argv = [sys.executable, str(script), "--port", str(port), "--delay-ms",
                str(self.args.delay_ms), "--tokens", str(self.args.tokens)]  # fmt: skip
        child = self._spawn("upstream", argv, self.args.load_cpu, dict(os.environ))
        wait_ready(f"http://127.0.0.1:{port}/health", child, timeout_s=15)
        return f"http://127.0.0.1:{port}/v1"

    def start_gateway(self, upstream: str, key: str) -> tuple[Child, str]:
        port = free_port()
        env = gateway_env()
        env.update(
            UPSTREAM_BASE_URL=upstream,
            GATEWAY_TEST_KEY=key,
            GATEWAY_ADMIN_KEY="cg-admin-" + secrets.token_hex(16),
            CASCADE_SPOOL_PATH=str(self.tmp / "ledger.spool"),
            CASCADE_LEDGER_STREAM_MAXLEN=str(STREAM_MAXLEN),
        )
        if self.ledger is not None:
            env.update(REDIS_URL=self.ledger.url, CASCADE_REDIS_PREFIX=self.ledger.prefix)
        argv = [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--policy",
            POLICY,
            "--port",
            str(port),
        ]
        child = self._spawn("gateway", argv, self.args.gateway_cpu, env)
        base = f"http://127.0.0.1:{port}"
        wait_ready(f"{base}/readyz", child, timeout_s=90)
        return child, base

    def run_driver(self, upstream: str, gateway: str, key: str, out: Path) -> None:
        a = self.args
        argv = [
            sys.executable, str(SHARED_BENCH / "overhead.py"),
            "--upstream", upstream, "--gateway", f"{gateway}/v1",
            "--header", f"authorization: Bearer {key}", "--model", "auto",
            "--modes", a.modes, "--rates", a.rates, "--duration", str(a.duration),
            "--reps", str(a.reps), "--label", "cascade-gateway", "--json", str(out),
        ]  # fmt: skip
        if a.load_cpu is not None:
            argv += ["--cpu", str(a.load_cpu)]  # pinned already; this names it in its header
        driver = spawn("driver", argv, a.load_cpu, dict(os.environ), logs=None)
        self.children.append(driver)
        if driver.popen.wait() != 0:
            raise BenchmarkError(f"the load driver exited with status {driver.popen.returncode}")

    def start_profiler(self, pid: int) -> None:
        path = Path(self.args.profile).resolve()
        fmt = {".svg": "flamegraph", ".json": "speedscope"}.get(path.suffix, "raw")
        argv = ["py-spy", "record", "--pid", str(pid), "--output", str(path), "--format", fmt,
                "--rate", "200"]  # fmt: skip
        self._spawn("py-spy", argv, self.args.load_cpu, dict(os.environ))

    def stop_profiler(self) -> None:
        for child in self.children:
            if child.name == "py-spy":
                child.stop(signal.SIGINT, grace_s=60)  # py-spy writes its file on SIGINT
                log.info("profile written to %s", self.args.profile)

    def stop_all(self) -> None:
        """Stop everything still running, newest first (the gateway drains its ledger)."""
        for child in reversed(self.children):
            child.stop(signal.SIGINT if child.name == "py-spy" else signal.SIGTERM)

    def _spawn(self, name: str, argv: Sequence[str], cpu: int | None, env: dict[str, str]) -> Child:
        child = spawn(name, argv, cpu, env, logs=self.tmp)
        self.children.append(child)
        return child


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc); None if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report_ledger(bench: Bench, answered: int | None, expected: int, warmups: int) -> bool:
    """Compare the ledger with the requests answered (after the gateway drained its
    writes on shutdown); True if they agree."""
    print("\n== ledger")
    print(
        f"driver: {expected - warmups} measured ok + {warmups} warm-up sent = {expected} "
        "(warm-up outcomes are not reported by the driver)"
    )
    print(f"gateway /metrics, requests answered 200: {answered}")
    if bench.ledger is None:
        print("ledger: in memory (--no-redis), not counted")
        return True
    events = bench.ledger.event_count()
    spooled = spooled_lines(bench.tmp / "ledger.spool")
    print(
        f"redis {bench.ledger.prefix}{{ledger}}:events XLEN: {events}; spooled locally: {spooled}"
    )
    consistent = answered is not None and events + spooled == answered
    print(
        f"ledger {'matches' if consistent else 'DOES NOT match'} the gateway's count; "
        f"driver vs ledger: {expected} vs {events + spooled}"
    )
    return consistent


def report_cpu(used_s: float | None, answered: int | None) -> None:
    if used_s is None or not answered:
        return
    print(
        f"gateway CPU while loaded: {used_s:.2f} s for {answered} requests = "
        f"{1000 * used_s / answered:.2f} ms/request (a ceiling of ~{answered / used_s:.0f} "
        "req/s on one core)"
    )


def run(args: argparse.Namespace, tmp: Path, ledger: RedisLedger | None) -> bool:
    bench = Bench(args, tmp, ledger, [])
    try:
        key = "cg-bench-" + secrets.token_hex(16)
        upstream = bench.start_upstream()
        gateway, base = bench.start_gateway(upstream, key)
        pid = gateway.popen.pid
        log.info("gateway ready at %s (pid %d), upstream %s", base, pid, upstream)
        cpu_start = cpu_seconds(pid)
        if args.profile:
            bench.start_profiler(pid)
        out = tmp / "driver.json"
        bench.run_driver(upstream, base, key, out)
        bench.stop_profiler()
        if not gateway.running():
            raise BenchmarkError(f"the gateway died during the run:\n{gateway.tail()}")
        cpu_end, answered = cpu_seconds(pid), gateway_ok_count(base)
        gateway.stop()  # drains the pending ledger writes before we count them
        results = json.loads(out.read_text())
        met = report(summarize(results))
        rates = [float(rate) for rate in args.rates.split(",")]
        warmups = warmup_requests(rates, len(args.modes.split(",")), args.reps)
        measured = sum(r["ok"] for r in results if r["target"] == "gateway")
        consistent = report_ledger(bench, answered, measured + warmups, warmups)
        used = None if cpu_start is None or cpu_end is None else cpu_end - cpu_start
        report_cpu(used, answered)
        return met and consistent
    finally:
        bench.stop_all()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rates", default="100,500,1000", help="req/s, comma-separated")
    p.add_argument("--modes", default="nonstream,stream")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per measured run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="smoke run: rates 50,200, 3 s, 1 rep")
    p.add_argument(
        "--delay-ms", type=float, default=20.0, help="fake upstream's time to first byte"
    )
    p.add_argument("--tokens", type=int, default=32, help="completion tokens per reply")
    p.add_argument("--no-redis", action="store_true", help="in-memory ledger instead of Redis")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/4")
    p.add_argument("--gateway-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1, help="CPU of the driver and fake upstream")
    p.add_argument("--json", help="also keep the driver's per-run JSON here")
    p.add_argument("--profile", help="py-spy record the gateway: .svg, .json (speedscope) or raw")
    args = p.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    return args


def check_cpus(args: argparse.Namespace) -> None:
    """Pin only to CPUs we may use; on a one-CPU box run unpinned, with a warning."""
    allowed = os.sched_getaffinity(0)
    if {args.gateway_cpu, args.load_cpu} <= allowed and args.gateway_cpu != args.load_cpu:
        return
    log.warning("CPUs %s are not two separate usable CPUs (allowed: %s); not pinning",
                (args.gateway_cpu, args.load_cpu), sorted(allowed))  # fmt: skip
    args.gateway_cpu = args.load_cpu = None


@contextlib.contextmanager
def redis_keys(args: argparse.Namespace) -> Iterator[RedisLedger | None]:
    """A fresh random prefix in Redis, whose keys are deleted on the way out."""
    if args.no_redis:
        yield None
        return
    ledger = RedisLedger(args.redis_url, f"cgbench-{secrets.token_hex(6)}:")
    ledger.check()
    try:
        yield ledger
    finally:
        log.info("deleted %d redis keys under %s", ledger.delete_keys(), ledger.prefix)
        ledger.close()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="overhead: %(message)s")
    args = parse_args(argv)
    for script in ("fake_upstream.py", "overhead.py"):
        if not (SHARED_BENCH / script).is_file():
            log.error(
                "missing %s: the shared bench scripts are expected next to the repo",
                SHARED_BENCH / script,
            )
            return 2
    check_cpus(args)

    def terminate(signum: int, frame: object) -> None:
        log.error("terminated; stopping processes and deleting keys")
        raise SystemExit(128 + signum)  # unwinds through the finally blocks below

    signal.signal(signal.SIGTERM, terminate)
    try:
        with tempfile.TemporaryDirectory(prefix="cgbench-") as tmp, redis_keys(args) as ledger:
            ok = run(args, Path(tmp), ledger)
            if args.json:
                Path(args.json).write_bytes((Path(tmp) / "driver.json").read_bytes())
    except BenchmarkError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted; processes stopped and keys deleted")
        return 130
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
