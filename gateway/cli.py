"""`cascade-gateway` command line: serve, policy check/explain, keys, router, spend."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gateway.errors import GatewayError
from gateway.spend.commands import add_spend_commands
from local_engine.cli import add_engine_commands
from policies import DEFAULT_POLICY_PATH, LoadedPolicy, PolicyError, load_policy
from policies.keys import hash_key
from policies.unserved import unserved_notes
from router.cli import ScoreField, add_router_commands
from router.rows import print_lines

if TYPE_CHECKING:
    from gateway.pipeline.selector import QualitySelector, TrafficProfiles
    from gateway.runtime import RouteRuntime, Runtime
    from gateway.settings import Settings
    from router import Plan
    from router.target_selection import Choice, Estimate

log = logging.getLogger("gateway")

Command = Callable[[argparse.Namespace], int]


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.settings import Settings, configure_logging
    from local_engine.autostart import start_engines, stop_engines

    given = {"policy": args.policy, "host": args.host, "port": args.port, "workers": args.workers}
    given = {name: value for name, value in given.items() if value is not None}
    try:
        settings = Settings(**given)
        policy = _load_policy(settings.policy).policy  # fail fast, before binding
    except ValidationError as exc:
        return _bad_settings("serve", exc, given)
    except PolicyError as exc:
        print(f"serve: the policy does not load:\n{exc}", file=sys.stderr)
        return 1
    # Workers are separate processes that build their own Settings from the environment.
    os.environ["CASCADE_POLICY"] = str(settings.policy)
    configure_logging(settings.log_level, settings.log_format)
    engines = start_engines(settings.policy, policy.engines, settings.spool_path.parent / "engines")
    # uvicorn re-raises the SIGTERM it caught once it has shut down: make that an exit
    # that runs `finally` (Ctrl-C's KeyboardInterrupt already does), so engines stop too.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with _worker_metrics(settings.workers):
            _run_uvicorn(settings)
    finally:
        stop_engines(engines)
    return 0


@contextlib.contextmanager
def _worker_metrics(workers: int) -> Iterator[None]:
    """With several workers, a fresh directory for their counters (see gateway.metrics),
    set in the environment they inherit and removed when they are gone. One set by the
    operator is used as it is."""
    from gateway.metrics import MULTIPROCESS_DIR_VARIABLE

    if workers <= 1 or MULTIPROCESS_DIR_VARIABLE in os.environ:
        yield
        return
    path = tempfile.mkdtemp(prefix="cascade-metrics-")
    os.environ[MULTIPROCESS_DIR_VARIABLE] = path
    try:
        yield
    finally:
        del os.environ[MULTIPROCESS_DIR_VARIABLE]
        shutil.rmtree(path, ignore_errors=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _run_uvicorn(settings: Settings) -> None:
    import uvicorn

    uvicorn.run(
        "gateway.http.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        log_config=None,  # its loggers' lines go through the root's handler, in our format
        access_log=False,  # per-request logging costs more than the proxying itself
        loop="uvloop",
        http="httptools",
        # The socket peer stays the request's client: the app decides whose forwarding
        # headers to believe (gateway.trusted_proxies), and a forwarded request is never
        # local, whatever uvicorn's FORWARDED_ALLOW_IPS says.
        proxy_headers=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
    )


def _load_policy(path: Path) -> LoadedPolicy:
    """The policy as this install would serve it: a route whose classifier cannot run
    here is one of its problems."""
    from gateway.pipeline.scoring import install_problems  # the router: not for every command

    return load_policy(path, install_check=install_problems)


def cmd_policy_check(args: argparse.Namespace) -> int:
    try:
        loaded = _load_policy(Path(args.path))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    from gateway.runtime import build_runtime

    policy = loaded.policy
    notes = unserved_notes(policy)
    # What serve logs at load besides (an unpriced deployment, code runs kept off).
    notes += [message for _, message in build_runtime(loaded).warnings]
    if team := policy.auth.anonymous_team:
        notes.append(
            f"auth.anonymous_team '{team}' serves key-less requests from loopback "
            "without forwarding headers"
        )
    if policy.budgets:
        notes.append(
            f"{len(policy.budgets)} budget(s) enforced on Redis (REDIS_URL); when it is "
            f"unreachable limits fail {policy.gateway.limits_when_redis_down} "
            "(gateway.limits_when_redis_down)"
        )
    summary = (
        f"{args.path}: ok ({len(policy.deployments)} deployments, {len(policy.routes)} routes, "
        f"{len(policy.keys)} keys)"
    )
    return print_report([summary, *(f"  note: {note}" for note in notes)])


def cmd_policy_explain(args: argparse.Namespace) -> int:
    from gateway.pipeline.scoring import RequestScorer
    from gateway.runtime import build_runtime, log_new_warnings
    from router import SCORED_STRATEGIES

    try:
        runtime = build_runtime(_load_policy(Path(args.path)))
        log_new_warnings(runtime, None)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        route = runtime.resolve(args.model or explained_route(runtime))
    except GatewayError as exc:
        hint = "" if args.model else " (choose one with --model ROUTE)"
        print(exc.message + hint, file=sys.stderr)
        return 1
    # The complexity score of the prompt, whether or not the route routes by it: a
    # cascade's verifier weighs the default classifier's as its prior, and ops compare
    # it with the tiers. Only a classifier route scores with its own classifier.
    messages = [{"role": "user", "content": args.prompt}]
    routed_by_score = route.strategy in SCORED_STRATEGIES
    classifier = route.classifier if routed_by_score else "features"
    score = RequestScorer()("chat", {"messages": messages}, classifier)
    needs = frozenset({"chat", *args.needs})
    choice = learning = None
    if route.strategy == "select":  # as the gateway would choose, with what it learned
        learning = fleet_learning(runtime)
        choice = select_choice(runtime, route, {"messages": messages}, learning.traffic)
    plan = runtime.plan(route, score if routed_by_score else None, needs=needs, choice=choice)
    first = runtime.deployments[plan.steps[0].deployment] if plan.steps else None
    decision = {
        "prompt_chars": len(args.prompt),
        "route": route.name,
        "strategy": route.strategy,
        "tier": first.tier if first else None,
        "deployment": first.name if first else None,
        "score": score,
        "classifier": classifier,
        "fallbacks": [s.deployment for s in plan.steps[1:]],
        "reasons": plan.reasons()
        + capability_reasons(runtime, route)
        + ([] if routed_by_score else [unused_score_reason(route, score)])
        + sla_reasons(route)
        + verify_reasons(route)
        + opinion_reasons(route, args.prompt, plan)
        + code_run_reasons(runtime, route, args.prompt)
        + judge_reasons(route),
    }
    if choice is not None:
        decision |= choice_summary(route, choice, plan, needs, runtime, learning)
    return print_report([json.dumps(decision, indent=2)])


def print_report(lines: Iterable[str]) -> int:
    """Print a policy command's lines: a reader that has gone (`policy check PATH | head
    -1` read what it wanted) leaves the exit status the command's outcome."""
    return print_lines(lines, reader_gone=0)


def fresh_selector(traffic: TrafficProfiles | None = None) -> QualitySelector:
    """A selector as a fresh gateway has it: no answer lengths seen (the default), and
    `traffic`'s learned offsets (None: none, the predictor alone)."""
    from gateway.pipeline.accounting import OutputLengths
    from gateway.pipeline.selector import QualitySelector

    return QualitySelector(OutputLengths(), traffic=traffic)


def select_choice(
    runtime: Runtime,
    route: RouteRuntime,
    body: dict[str, Any],
    traffic: TrafficProfiles | None = None,
) -> Choice:
    """A `select` route's choice for `body`, as a fresh gateway would make it (with
    `traffic`'s learned offsets)."""
    return fresh_selector(traffic).choose(runtime, route, "chat", body)


@dataclasses.dataclass(frozen=True)
class Learning:
    """What select routes learned from traffic as `policy explain` read it, and whence."""

    traffic: TrafficProfiles
    source: str


def fleet_learning(runtime: Runtime) -> Learning:
    """The learned offsets of `runtime`'s select deployments, read once from the Redis
    the gateway's settings name (REDIS_URL, CASCADE_REDIS_PREFIX); none, saying why, when
    it is not set or cannot be read."""
    from redis.exceptions import RedisError

    from gateway.pipeline.selector import TrafficProfiles, select_deployments
    from gateway.pipeline.shared_profiles import read_learning
    from gateway.settings import Settings

    none = "none, the predictor alone"
    try:
        settings = Settings()
    except ValidationError as exc:
        return Learning(TrafficProfiles(), f"{none}: the gateway's settings do not load ({exc})")
    if not settings.redis_url:
        return Learning(TrafficProfiles(), f"{none}: REDIS_URL is not set")
    deployments = select_deployments(runtime)
    url, prefix, cluster = settings.redis_url, settings.redis_prefix, settings.redis_cluster
    try:
        traffic = asyncio.run(read_learning(url, prefix, deployments, cluster=cluster))
    except (RedisError, OSError, ValueError) as exc:
        return Learning(TrafficProfiles(), f"{none}: Redis cannot be read ({exc})")
    return Learning(traffic, f"from Redis (prefix '{prefix}'), as the gateway has them")


def choice_summary(
    route: RouteRuntime,
    choice: Choice,
    plan: Plan,
    needs: Collection[str],
    runtime: Runtime | None = None,
    learning: Learning | None = None,
) -> dict[str, Any]:
    """Every candidate's predicted quality and expected cost (those skipped too, and
    why), the target and, when the route verifies, the order it escalates in; with
    `runtime` and `learning`, each candidate's profile (and whether its price chose
    it) and learned offset, and where the offsets came from."""
    from gateway.runtime import climbs

    skipped = dict(plan.skipped)
    candidates: dict[str, dict[str, Any]] = {}
    for name, e in choice.estimates.items():
        candidates[name] = {
            "predicted_quality": round(e.quality, 4),
            "expected_cost_usd": round(e.cost_usd, 9),
            "meets_target": choice.meets(name),
        }
        candidates[name] |= _profile_summary(name, e, runtime, learning)
        if name in skipped:
            candidates[name]["skipped"] = skipped[name]
    summary: dict[str, Any] = {
        "quality_target": round(choice.target, 4),
        "reference_profile": fresh_selector().reference_profile(route) or "the best candidate",
        "candidates": candidates,
    }
    if learning is not None:
        summary["learned_offsets"] = learning.source
    if plan.choice is not None and climbs(route, route.strategy, needs):
        summary["escalation_chain"] = list(plan.choice.chain())
        explorer = plan.choice.explorer() if route.explore > 0 else None
        if explorer is not None:  # tried first on that share of requests, verified
            summary["explores"] = {"deployment": explorer, "share": route.explore}
    return summary


def _profile_summary(
    name: str, estimate: Estimate, runtime: Runtime | None, learning: Learning | None
) -> dict[str, Any]:
    """The known model a candidate is rated as (a profile-less one: its price's prior),
    the predictor's figure for it and the offset traffic moved that by."""
    found: dict[str, Any] = {"prior_quality": round(estimate.predicted, 4)}
    if runtime is not None and name in runtime.policy.deployments:
        named = runtime.policy.deployments[name].quality_profile is not None
        found["quality_profile"] = estimate.profile
        found["profile_from"] = "policy" if named else "price"  # its price's prior
    if learning is not None:
        found["learned_offset"] = round(learning.traffic.offset(name, estimate.profile), 4)
    return found


def explained_route(runtime: Runtime) -> str:
    """The route explained without `--model`: the policy's `gateway.default_route`,
    else `auto`, else the policy's only route."""
    if default := runtime.policy.gateway.default_route:
        return default
    if len(runtime.routes) == 1 and "auto" not in runtime.routes:
        return next(iter(runtime.routes))
    return "auto"  # absent: the error lists the routes


def capability_reasons(runtime: Runtime, route: RouteRuntime) -> list[str]:
    """What each deployment of the route serves (a request needing more skips it)."""
    return [
        f"'{name}' serves {', '.join(sorted(runtime.deployments[name].capabilities))}"
        for name in route.deployments
    ]


def _capability_list(text: str) -> frozenset[str]:
    """`--needs tools,vision`: capability names, checked against the known ones."""
    from policies.capabilities import CAPABILITIES

    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    if unknown := sorted(names - set(CAPABILITIES)):
        raise argparse.ArgumentTypeError(
            f"unknown capability {', '.join(unknown)} (capabilities: {', '.join(CAPABILITIES)})"
        )
    return names


def unused_score_reason(route: RouteRuntime, score: float) -> str:
    why = (
        "the verifier's prior on the cheap answer; a cascade starts at its cheapest tier"
        if route.strategy == "cascade"
        else f"strategy '{route.strategy}' does not route by it"
    )
    return f"complexity score {score:.3f} ({why})"


def opinion_reasons(route: RouteRuntime, prompt: str, plan: Plan) -> list[str]:
    """Whether the cascade asks its second opinions for this prompt, and why."""
    from gateway.pipeline.opinions import configured, worth_asking

    if not route.second_opinions:
        return []
    usable = [d.name for d in configured(route)]
    names = ", ".join(d.name for d in route.second_opinions)
    tiers = {s.tier for s in plan.steps}
    if not plan.steps:
        return [f"second opinions ({names}) not asked: no deployment of the route is available"]
    if len(tiers) < 2 or route.max_escalations == 0:
        return [f"second opinions ({names}) not asked: the cascade has no tier to escalate to"]
    if not usable:
        return [f"second opinions ({names}) not asked: none is available"]
    if not worth_asking("chat", {"messages": [{"role": "user", "content": prompt}]}):
        return [
            f"second opinions ({names}) not asked: the prompt has no answer to compare "
            "(not multiple choice, maths or code)"
        ]
    return [
        f"second opinions from {', '.join(usable)} asked alongside the first tier (unless "
        "ejected by their breaker); the verifier compares their final answers (or their "
        "code) with the cheap answer (each priced)"
    ]


def judge_reasons(route: RouteRuntime) -> list[str]:
    """Which deployment grades the cascade's verified answers, if any."""
    from gateway.pipeline.judge import RUBRIC_VERSION

    if route.judge is None:
        return []
    return [
        f"judge '{route.judge.name}' grades each verified answer (rubric {RUBRIC_VERSION}, "
        f"within {route.judge_timeout_s * 1000:g} ms; priced); its grade replaces the "
        "verifier's score, which decides when the judge times out, fails or gives no grade"
    ]


def verify_reasons(route: RouteRuntime) -> list[str]:
    """What decides an escalation: the verifier's threshold and how often it may act."""
    if route.strategy == "cascade":
        onward = "the next tier"
    elif route.strategy == "select" and route.verify:
        onward = "the next candidate that meets a higher target"
    else:
        return []
    return [
        f"an answer the verifier scores below verify_threshold {route.verify_threshold:g} "
        f"escalates to {onward}, at most {route.max_escalations} time(s); the last answer "
        "is delivered whatever its score"
    ]


def code_run_reasons(runtime: Runtime, route: RouteRuntime, prompt: str) -> list[str]:
    """Whether the cascade runs a code answer against its own examples, and why."""
    from router.verifier import asks_for_python

    if route.strategy != "cascade":
        return []
    if not route.run_code_examples:
        if runtime.policy.routes[route.name].run_code_examples:
            return ["code answers are not run: this host cannot isolate code (see the log)"]
        return ["code answers are not run (run_code_examples is off)"]
    if not asks_for_python(prompt):
        return ["code answers are run in the sandbox, but this prompt does not ask for Python code"]
    return [
        "a Python answer's code is run in the sandbox against the examples it claims "
        "(doctests, '# Output:' comments); examples that fail count against it"
    ]


def sla_reasons(route: RouteRuntime) -> list[str]:
    """What the route's SLA adds at run time, which an offline explain cannot predict."""
    sla = route.sla
    if sla is None:
        return []
    reasons = []
    if sla.ttft_s is not None and sla.load_aware:
        reasons.append(
            f"live: deployments predicted to miss the {sla.ttft_s * 1000:g} ms TTFT SLA are "
            f"skipped (none predicted to make it: {sla.on_miss}); predictions in /admin/policy"
        )
    if sla.hedge_after_s is not None:
        reasons.append(
            f"live: no first token after {sla.hedge_after_s * 1000:g} ms: the next deployment "
            f"is asked too (up to {sla.max_hedges}), the first answer wins"
        )
    return reasons


def cmd_keys_new(args: argparse.Namespace) -> int:
    secret = "cg-" + secrets.token_urlsafe(32)
    status = print_lines([json.dumps({"key": secret, "hash": hash_key(secret)})])
    print("store only the hash in the policy; give the key to the client once", file=sys.stderr)
    return status


def cmd_keys_hash(args: argparse.Namespace) -> int:
    secret = sys.stdin.readline().strip()
    if not secret:
        print("read no key on standard input", file=sys.stderr)
        return 1
    return print_lines([hash_key(secret)])


def _ledger_scores(route: str, last: int, field: ScoreField) -> list[float]:
    from gateway.traffic import ledger_scores  # the ledger's client only when asked

    return ledger_scores(route, last, field)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cascade-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--policy", help=f"policy file or directory (default {DEFAULT_POLICY_PATH})")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--workers", type=int)
    serve.set_defaults(func=cmd_serve)

    policy = sub.add_parser("policy", help="validate or explain a policy").add_subparsers(
        dest="policy_command", required=True
    )
    check = policy.add_parser("check", help="validate a policy file or directory")
    check.add_argument("path")
    check.set_defaults(func=cmd_policy_check)
    explain = policy.add_parser("explain", help="show the routing decision for a prompt")
    explain.add_argument("path")
    explain.add_argument("--prompt", required=True)
    explain.add_argument("--model", help="route or deployment (default: the default route)")
    explain.add_argument(
        "--needs",
        type=_capability_list,
        default=frozenset(),
        help="what the request needs besides chat, comma-separated (tools,vision,json_schema)",
    )
    explain.set_defaults(func=cmd_policy_explain)

    keys = sub.add_parser("keys", help="client keys").add_subparsers(
        dest="keys_command", required=True
    )
    keys.add_parser("new", help="make a new key and print it with its hash").set_defaults(
        func=cmd_keys_new
    )
    keys.add_parser("hash", help="print the hash of a key read from stdin").set_defaults(
        func=cmd_keys_hash
    )

    add_router_commands(sub, ledger_scores=_ledger_scores)
    add_engine_commands(sub)

    add_spend_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Command = args.func
    try:
        return func(args)
    except ValidationError as exc:
        if exc.title != "Settings":  # not the environment's: a fault, not the operator's
            raise
        return _bad_settings(args.command, exc, {})  # a bad CASCADE_* setting, met elsewhere


def _bad_settings(command: str, exc: ValidationError, given: Collection[str]) -> int:
    """Exit 2 naming each bad setting as the operator set it: a flag in `given`, else
    its environment variable."""
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else "?"
        where = f"--{field}" if field in given else f"CASCADE_{field.upper()}"
        print(f"{command}: {where}={error.get('input')!r}: {error['msg']}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
