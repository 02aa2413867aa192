"""Gateway startup: launch to a healthy `/readyz`, against references in the same run.

Each repetition launches, one after the other on the same CPU:
- *baseline*: uvicorn serving a one-route Starlette app (`baseline_app` below) with the
  gateway's own uvicorn options (uvloop, httptools): the floor any Python ASGI gateway
  pays.
- *portkey* (with `--portkey`): Portkey's gateway, the reference issue 24 measured, from
  its npm package (`npm install @portkey-ai/gateway` in any directory, then
  `--portkey DIR/node_modules/@portkey-ai/gateway/build/start-server.js`); ready at its
  first answer on `/` (it has no readiness route).
- *gateway*: `python -m gateway.cli serve` on `policies/examples/openai-compatible.yaml`
  (one OpenAI-compatible upstream, no self-hosted engine to start), the Redis ledger on
  unless --no-redis. After `/readyz` it is sent one chat completion, answered by a fake
  upstream in this process: launch -> first answer is reported beside readiness, so
  work moved off the ready path (imports finished in the background) still shows.
It polls every few milliseconds from the moment of `Popen`, records the wall time and
the child's CPU time at readiness, then stops the child.

`--python` runs the Python targets on another interpreter: a venv with the gateway
installed as the README installs it to serve (`pip install -e '.[engine]'`), without
the dev extra's packages (rich, pygments: httpx imports them when they are there).
Python children run with their bytecode cached (`PYTHONPYCACHEPREFIX` in a temporary
directory, written by one unmeasured launch of each first), as an installed image runs:
a checkout where PYTHONDONTWRITEBYTECODE is set would recompile the project's ~150
modules on every launch.

Then, per Python target, the wall time of a bare `import` of the app's module
(`gateway.http.app` vs `starlette` + `uvicorn`), and with --importtime the modules that
cost the most.

    python -m tests.benchmarks.startup              # 5 reps, about 30 s
    python -m tests.benchmarks.startup --reps 10 --portkey PATH --importtime 25

Target (issue 24): gateway launch -> ready <= 2x Portkey's (the baseline's without
--portkey), medians, same run. Exit status: 0 target met, 1 missed, 2 the run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.benchmarks.overhead import (
    POLICY,
    REPO,
    BenchmarkError,
    Child,
    RedisLedger,
    cpu_seconds,
    free_port,
    gateway_env,
    http_get,
    spawn,
)
from tests.fakes.openai_upstream import FakeOpenAI

TARGET_RATIO = 2.0
POLL_S = 0.005
READY_TIMEOUT_S = 60.0
BENCH_KEY = "cg-bench-" + secrets.token_hex(16)
BASELINE_IMPORT = "import starlette.applications, starlette.routing, uvicorn"
GATEWAY_IMPORT = "import gateway.http.app"

log = logging.getLogger("benchmarks.startup")


def baseline_app() -> Any:
    """The baseline: Starlette with a `/readyz` route (imported only in its child)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def readyz(request: object) -> JSONResponse:
        return JSONResponse({"status": "ready"})

    return Starlette(routes=[Route("/readyz", readyz)])


@dataclass(frozen=True)
class Launch:
    """One launch: seconds from `Popen` to the first 200 from `/readyz`, and the child's
    CPU seconds by then (None where /proc is unreadable)."""

    wall_s: float
    cpu_s: float | None
    answer_s: float | None = None  # launch -> the first proxied answer (gateway only)


def time_to_ready(
    name: str,
    argv: Sequence[str],
    env: dict[str, str],
    port: int,
    cpu: int | None,
    logs: Path,
    *,
    ready_path: str = "/readyz",
    ask: Callable[[int], None] | None = None,
) -> Launch:
    """Launch `argv`, poll `ready_path` until 200, then `ask(port)` for one answer if
    given; stop it. Raise if it dies or stalls."""
    url = f"http://127.0.0.1:{port}{ready_path}"
    started = time.perf_counter()
    child = spawn(name, argv, cpu, env, logs)
    try:
        while True:
            with contextlib.suppress(urllib.error.URLError, OSError):
                http_get(url, timeout_s=1.0)
                break
            _check_alive(child, url, started)
            time.sleep(POLL_S)
        ready = Launch(time.perf_counter() - started, cpu_seconds(child.popen.pid))
        if ask is None:
            return ready
        ask(port)
        return dataclasses.replace(ready, answer_s=time.perf_counter() - started)
    finally:
        child.stop()


def _check_alive(child: Child, url: str, started: float) -> None:
    if not child.running():
        raise BenchmarkError(
            f"{child.name} exited with status {child.popen.returncode} before {url} "
            f"answered; its log ends:\n{child.tail()}"
        )
    if time.perf_counter() - started > READY_TIMEOUT_S:
        raise BenchmarkError(
            f"{url} did not answer within {READY_TIMEOUT_S:.0f} s:\n{child.tail()}"
        )


def baseline_argv(python: str, port: int) -> list[str]:
    app = "tests.benchmarks.startup:baseline_app"
    return [python, "-m", "uvicorn", app, "--factory", "--port", str(port),
            "--loop", "uvloop", "--http", "httptools", "--log-level", "warning"]  # fmt: skip


def gateway_argv(python: str, port: int) -> list[str]:
    return [python, "-m", "gateway.cli", "serve", "--policy", POLICY, "--port", str(port)]


def portkey_argv(script: Path, port: int) -> list[str]:
    return ["node", str(script), f"--port={port}", "--headless"]


def python_env(tmp: Path) -> dict[str, str]:
    """A Python child's environment, with its bytecode cached under `tmp`."""
    env = gateway_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    return env


def gateway_launch_env(tmp: Path, ledger: RedisLedger | None, upstream: str) -> dict[str, str]:
    env = python_env(tmp)
    env.update(
        UPSTREAM_BASE_URL=upstream,
        GATEWAY_TEST_KEY=BENCH_KEY,
        GATEWAY_ADMIN_KEY="cg-admin-" + secrets.token_hex(16),
        CASCADE_SPOOL_PATH=str(tmp / "ledger.spool"),
        CASCADE_LOG_LEVEL="warning",
    )
    if ledger is not None:
        env.update(REDIS_URL=ledger.url, CASCADE_REDIS_PREFIX=ledger.prefix)
    return env


def ask_once(port: int) -> None:
    """One chat completion through the gateway; raise unless it is answered 200."""
    body = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body.encode(),
        headers={"Authorization": f"Bearer {BENCH_KEY}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise BenchmarkError(f"the gateway's first answer: {exc.code} {exc.read()!r}") from exc


def import_seconds(python: str, statement: str, cpu: int | None, env: dict[str, str]) -> float:
    """Wall seconds of a fresh interpreter running `statement`, less a bare one's."""
    return _python_seconds(python, statement, cpu, env) - _python_seconds(python, "pass", cpu, env)


def _python_seconds(python: str, statement: str, cpu: int | None, env: dict[str, str]) -> float:
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    started = time.perf_counter()
    subprocess.run([python, "-c", statement], cwd=REPO, check=True, preexec_fn=pin, env=env)
    return time.perf_counter() - started


def costliest_imports(
    python: str, statement: str, count: int, env: dict[str, str]
) -> list[tuple[float, str]]:
    """`python -X importtime`: the `count` top-level modules with the most cumulative
    time (ms), outermost first within each tree."""
    result = subprocess.run(
        [python, "-X", "importtime", "-c", statement],
        cwd=REPO, capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    rows = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split(":", 1)[1].split("|")
        rows.append((int(cumulative) / 1000, name.rstrip()))
    return sorted(rows, reverse=True)[:count]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _cpu(launches: Sequence[Launch]) -> float:
    return median([x.cpu_s for x in launches if x.cpu_s is not None])


def report(launches: dict[str, list[Launch]], imports: dict[str, float]) -> bool:
    """Print the table; True if the gateway's median is within TARGET_RATIO of the
    reference's (Portkey where it ran, else the baseline)."""
    print("\n== launch -> ready (seconds; median, min, max over reps; CPU median)")
    print(
        f"{'target':9} | {'median':>6} | {'min':>6} | {'max':>6} | {'cpu':>5} | "
        f"{'import':>6} | {'1st answer':>10}"
    )
    for name, runs in launches.items():
        walls = [x.wall_s for x in runs]
        answers = [x.answer_s for x in runs if x.answer_s is not None]
        imported = f"{imports[name]:6.3f}" if name in imports else f"{'-':>6}"
        answered = f"{median(answers):10.3f}" if answers else f"{'-':>10}"
        print(
            f"{name:9} | {median(walls):6.3f} | {min(walls):6.3f} | {max(walls):6.3f} | "
            f"{_cpu(runs):5.2f} | {imported} | {answered}"
        )
    gateway = median([x.wall_s for x in launches["gateway"]])
    for name in launches.keys() - {"gateway"}:
        ratio = gateway / median([x.wall_s for x in launches[name]])
        print(f"gateway / {name}: launch {ratio:.2f}x")
    print(f"gateway / baseline: import {imports['gateway'] / imports['baseline']:.2f}x")
    reference = "portkey" if "portkey" in launches else "baseline"
    met = gateway / median([x.wall_s for x in launches[reference]]) <= TARGET_RATIO
    print(f"target (launch <= {TARGET_RATIO:g}x {reference}'s): {'MET' if met else 'MISSED'}")
    return met


def run(args: argparse.Namespace, tmp: Path, ledger: RedisLedger | None) -> bool:
    cpu, env, python = args.cpu, python_env(tmp), args.python
    with FakeOpenAI() as upstream:
        gateway_env_ = gateway_launch_env(tmp, ledger, upstream.url)
        targets: dict[str, Callable[[int], Launch]] = {
            "baseline": lambda port: time_to_ready(
                "baseline", baseline_argv(python, port), env, port, cpu, tmp
            ),
            "gateway": lambda port: time_to_ready(
                "gateway", gateway_argv(python, port), gateway_env_, port, cpu, tmp, ask=ask_once
            ),
        }
        if args.portkey is not None:
            targets["portkey"] = lambda port: time_to_ready(
                "portkey", portkey_argv(args.portkey, port), gateway_env(), port, cpu, tmp,
                ready_path="/",
            )  # fmt: skip
        for launch in targets.values():  # unmeasured: writes the bytecode caches
            launch(free_port())
        launches: dict[str, list[Launch]] = {name: [] for name in targets}
        for rep in range(args.reps):
            for name, launch in targets.items():
                launches[name].append(launch(free_port()))
            log.info("rep %d: %s", rep + 1, ", ".join(
                f"{name} {runs[-1].wall_s:.3f} s" for name, runs in launches.items()
            ))  # fmt: skip
    imports = {
        name: median([import_seconds(python, statement, cpu, env) for _ in range(args.reps)])
        for name, statement in (("baseline", BASELINE_IMPORT), ("gateway", GATEWAY_IMPORT))
    }
    met = report(launches, imports)
    if args.importtime:
        print(
            f"\n== python -X importtime -c {GATEWAY_IMPORT!r}: cumulative ms, top {args.importtime}"
        )
        for ms, name in costliest_imports(python, GATEWAY_IMPORT, args.importtime, env):
            print(f"{ms:8.1f}  {name}")
    return met


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
        ledger.delete_keys()
        ledger.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cpu", type=int, default=0, help="the CPU every launch is pinned to")
    p.add_argument("--no-redis", action="store_true", help="in-memory ledger instead of Redis")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/4")
    p.add_argument("--python", default=sys.executable,
                   help="the Python targets' interpreter (a serving install's venv)")  # fmt: skip
    p.add_argument("--portkey", type=Path, default=None, metavar="START_SERVER_JS",
                   help="also launch Portkey's gateway (node) and judge against it")  # fmt: skip
    p.add_argument("--importtime", type=int, default=0, metavar="N",
                   help="also list the N costliest imports of gateway.http.app")  # fmt: skip
    args = p.parse_args(argv)
    if args.cpu not in os.sched_getaffinity(0):
        log.warning("CPU %d is not usable here; not pinning", args.cpu)
        args.cpu = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="startup: %(message)s")
    logging.getLogger("benchmarks.overhead").setLevel(logging.WARNING)  # a line per launch
    args = parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="cgstart-") as tmp, redis_keys(args) as ledger:
            ok = run(args, Path(tmp), ledger)
    except BenchmarkError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted; processes stopped and keys deleted")
        return 130
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
