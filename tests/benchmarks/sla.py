"""SLA benchmark: one tier of two upstreams, one degraded, steady streaming load on a
route with a 500 ms TTFT SLA; hedging and load-aware selection off, then on, same run.

    python -m tests.benchmarks.sla               # 40 req/s, 30 s per mode (~1.5 min)
    python -m tests.benchmarks.sla --quick       # 20 req/s, 8 s per mode

Upstreams are the shared fake (`../shared/bench/fake_upstream.py`): A answers
`--slow-share` of requests `--slow-ms` late (a provider having a bad day, or a replica
with a long queue), B is healthy; A is listed first. The gateway runs
`policies/examples/sla-hedge.yaml` ("on") and the same policy with `load_aware: false`
and no hedging ("off"). Reported per mode: SLA attainment (first token within 500 ms,
measured by the client), p50/p99 TTFT, errors, and upstream calls per request (from the
gateway's `cascade_upstream_attempts_total`, which counts lost hedges as `cancelled`).

Target (issue 4): "on" meets the SLA for >= 99% of requests where "off" meets it for
at most 80%, with at most 10% extra upstream calls.
Exit status: 0 target met, 1 not met, 2 the run failed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.benchmarks.overhead import (
    REPO,
    SHARED_BENCH,
    BenchmarkError,
    Child,
    free_port,
    gateway_env,
    http_get,
    spawn,
    wait_ready,
)

POLICY = REPO / "policies" / "examples" / "sla-hedge.yaml"
TTFT_SLA_S = 0.5
ATTEMPTS = re.compile(r"^cascade_upstream_attempts_total\{[^}]*\}\s+(\S+)", re.M)

log = logging.getLogger("benchmarks.sla")


@dataclass
class ModeResult:
    mode: str
    ttfts: list[float]
    errors: int
    upstream_calls: float

    @property
    def attainment(self) -> float:
        met = sum(1 for t in self.ttfts if t <= TTFT_SLA_S)
        return met / (len(self.ttfts) + self.errors)

    def pct(self, q: float) -> float:
        ordered = sorted(self.ttfts)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def calls_per_request(self) -> float:
        return self.upstream_calls / max(1, len(self.ttfts) + self.errors)


def off_policy(tmp: Path) -> Path:
    """The example with hedging and load-aware selection switched off."""
    policy = yaml.safe_load(POLICY.read_text())
    sla = policy["routes"]["chat"]["sla"]
    sla["load_aware"] = False
    sla.pop("hedge_after_ms", None)
    path = tmp / "sla-off.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


async def one_request(client: httpx.AsyncClient, url: str, key: str) -> float | None:
    body = {
        "model": "chat",
        "stream": True,
        "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
    }
    began = time.perf_counter()
    try:
        async with client.stream(
            "POST", url, json=body, headers={"authorization": f"Bearer {key}"}
        ) as response:
            if response.status_code != 200:
                return None
            ttft = None
            async for chunk in response.aiter_bytes():
                if ttft is None and b"data:" in chunk:
                    ttft = time.perf_counter() - began
            return ttft
    except httpx.HTTPError:
        return None


async def drive(base: str, key: str, rate: float, duration_s: float) -> tuple[list[float], int]:
    """Open-loop load: a request every 1/rate seconds, whatever the previous ones do."""
    url = f"{base}/v1/chat/completions"
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        n = int(rate * duration_s)
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one_request(client, url, key)))
        results = await asyncio.gather(*tasks)
    ttfts = [r for r in results if r is not None]
    return ttfts, len(results) - len(ttfts)


def upstream_calls(base: str) -> float:
    text = http_get(f"{base}/metrics").decode()
    return sum(float(value) for value in ATTEMPTS.findall(text))


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.children: list[Child] = []

    def start_upstream(self, name: str, *extra: str) -> str:
        port = free_port()
        argv = [sys.executable, str(SHARED_BENCH / "fake_upstream.py"), "--port", str(port),
                "--delay-ms", "40", "--tokens", "16", "--itl-ms", "2", *extra]  # fmt: skip
        child = spawn(name, argv, self.args.load_cpu, dict(os.environ), self.tmp)
        self.children.append(child)
        wait_ready(f"http://127.0.0.1:{port}/health", child, timeout_s=15)
        return f"http://127.0.0.1:{port}/v1"

    def start_gateway(self, policy: Path, a: str, b: str, key: str) -> tuple[Child, str]:
        port = free_port()
        env = gateway_env()
        env.update(
            UPSTREAM_A_URL=a,
            UPSTREAM_B_URL=b,
            GATEWAY_TEST_KEY=key,
            GATEWAY_ADMIN_KEY="cg-admin-" + secrets.token_hex(16),
            CASCADE_SPOOL_PATH=str(self.tmp / f"{policy.stem}.spool"),
        )
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--policy", str(policy),
                "--port", str(port)]  # fmt: skip
        child = spawn(f"gateway-{policy.stem}", argv, self.args.gateway_cpu, env, self.tmp)
        self.children.append(child)
        base = f"http://127.0.0.1:{port}"
        wait_ready(f"{base}/readyz", child, timeout_s=90)
        return child, base

    def run_mode(self, mode: str, policy: Path, a: str, b: str) -> ModeResult:
        key = "cg-bench-" + secrets.token_hex(12)
        gateway, base = self.start_gateway(policy, a, b, key)
        try:
            ttfts, errors = asyncio.run(drive(base, key, self.args.rate, self.args.duration))
            calls = upstream_calls(base)
        finally:
            gateway.stop()
        return ModeResult(mode, ttfts, errors, calls)

    def stop_all(self) -> None:
        for child in reversed(self.children):
            child.stop()


def report(results: Sequence[ModeResult]) -> bool:
    print(f"\nTTFT SLA {TTFT_SLA_S * 1000:.0f} ms; upstream A slow for a share of requests\n")
    print("| mode | requests | SLA met | p50 TTFT ms | p99 TTFT ms | errors | upstream calls/req |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.mode} | {len(r.ttfts) + r.errors} | {r.attainment:.2%} | {r.pct(0.5):.1f} | "
            f"{r.pct(0.99):.1f} | {r.errors} | {r.calls_per_request:.3f} |"
        )
    off, on = results
    extra = on.calls_per_request / off.calls_per_request - 1
    ok = on.attainment >= 0.99 and off.attainment <= 0.80 and extra <= 0.10
    print(
        f"\nextra upstream calls with hedging and load-aware selection: {extra:+.1%}; "
        f"target (on >= 99%, off <= 80%, extra <= 10%): {'met' if ok else 'NOT met'}"
    )
    return ok


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", type=float, default=40.0, help="requests per second")
    p.add_argument("--duration", type=float, default=30.0, help="seconds per mode")
    p.add_argument("--slow-share", type=float, default=0.3, help="share of A's requests late")
    p.add_argument("--slow-ms", type=float, default=1500.0, help="how late")
    p.add_argument("--quick", action="store_true", help="20 req/s, 8 s per mode")
    p.add_argument("--gateway-cpu", type=int, default=0 if (os.cpu_count() or 1) > 1 else None)
    p.add_argument("--load-cpu", type=int, default=1 if (os.cpu_count() or 1) > 1 else None)
    args = p.parse_args(argv)
    if args.quick:
        args.rate, args.duration = 20.0, 8.0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cg-sla-") as name:
        tmp = Path(name)
        bench = Bench(args, tmp)
        try:
            slow = ["--slow-share", str(args.slow_share), "--slow-ms", str(args.slow_ms)]
            a = bench.start_upstream("upstream-a", *slow)
            b = bench.start_upstream("upstream-b")
            results = [
                bench.run_mode("off", off_policy(tmp), a, b),
                bench.run_mode("on (hedging + load-aware)", POLICY, a, b),
            ]
        except BenchmarkError as exc:
            log.error("%s", exc)
            return 2
        finally:
            bench.stop_all()
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
