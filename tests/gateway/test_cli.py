"""The `cascade-gateway` command line, run as the installed console script."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai
import pytest

from gateway.ledger import RedisStore
from policies import hash_key
from router import sandbox
from router.classifier import Classifier
from router.embedding_classifier import shipped
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import (
    AUTH,
    EXE,
    POLICIES,
    StartGateway,
    openai_compatible_policy,
    wait_for_record,
)
from tests.gateway.ledger_fixtures import free_port
from tests.support import serving


def run(
    *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXE, *args], input=stdin, capture_output=True, text=True, timeout=60, env=env
    )


def test_policy_check_accepts_the_shipped_policies() -> None:
    for path in [POLICIES / "default.yaml", *sorted((POLICIES / "examples").glob("*.yaml"))]:
        result = run("policy", "check", str(path))
        assert result.returncode == 0, result.stderr
        assert "ok" in result.stdout


def test_policy_check_notes_what_serves_nothing_until_configured(tmp_path: Path) -> None:
    """A key or deployment whose env var is unset is no error (it may be set where the
    gateway runs), but check says so, as the serving gateway's log does."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "deployments:\n"
        "  paid: {api_base: 'https://api.openai.com/v1', model: gpt-4o,"
        " api_key: '${UNSET_PAID_KEY}', requires_key: true}\n"
        "routes:\n"
        "  auto: {deployments: [paid]}\n"
        "keys:\n"
        "  ci: {secret: '${UNSET_CI_KEY}'}\n"
        "admin_keys: ['${UNSET_ADMIN_KEY}']\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNSET_")}
    result = run("policy", "check", str(policy), env=env)
    assert result.returncode == 0, result.stderr
    notes = [line.strip() for line in result.stdout.splitlines() if "note:" in line]
    assert any("deployment 'paid'" in n and "UNSET_PAID_KEY" in n for n in notes), notes
    assert any("key 'ci' is disabled" in n and "UNSET_CI_KEY" in n for n in notes), notes
    assert "note: no client key is enabled: the gateway serves nobody" in notes
    assert "note: no admin key is set: /admin answers 401" in notes


def test_policy_check_notes_an_unpriced_deployment_as_serve_logs_it(tmp_path: Path) -> None:
    """No price in litellm's map nor in the policy: its requests are recorded unpriced,
    and a select route takes it for free; check says so before serve does."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "deployments:\n"
        "  mystery: {api_base: 'http://127.0.0.1:9/v1', model: check-test-unpriced-model}\n"
        "routes:\n"
        "  auto: {deployments: [mystery]}\n"
    )
    result = run("policy", "check", str(policy))
    assert result.returncode == 0, result.stderr
    assert (
        "  note: deployment 'mystery' (model 'check-test-unpriced-model') has no price in "
        "litellm's map and none in the policy: its requests are recorded as unpriced"
    ) in result.stdout.splitlines()


def test_serve_refuses_a_bad_policy_or_setting_with_the_message_alone(tmp_path: Path) -> None:
    """What a crash-looping pod's log shows: the problem, named as the operator wrote
    it (file, line and field; the environment variable), not a traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments:\n  a: {model: m, timeout_s: soon}\nroutes: {}\n")
    result = run("serve", "--policy", str(bad))
    assert result.returncode == 1
    assert f"{bad}:2:" in result.stderr and "deployments.a.timeout_s" in result.stderr
    assert "Traceback" not in result.stderr
    for name, value in [("PORT", "eighty"), ("PORT", "70000"), ("LOG_LEVEL", "loud")]:
        result = run("serve", env={**os.environ, f"CASCADE_{name}": value})
        assert result.returncode == 2, result.stderr
        assert f"CASCADE_{name}='{value}'" in result.stderr and "Traceback" not in result.stderr
    result = run("serve", "--port", "70001")  # never bound as 70001 - 65536
    assert result.returncode == 2
    assert "--port=70001" in result.stderr and "less than or equal to 65535" in result.stderr
    # Every command that reads the settings names a bad one the same way.
    result = run("spend", "report", env={**os.environ, "CASCADE_PORT": "70000"})
    assert result.returncode == 2
    assert "spend: CASCADE_PORT='70000'" in result.stderr and "Traceback" not in result.stderr


def test_log_levels_read_as_logging_reads_them() -> None:
    from gateway.settings import Settings

    assert Settings(log_level="WARN").log_level == "warning"  # logging's alias
    assert Settings(log_level="Debug").log_level == "debug"


def test_policy_check_reports_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "deployments:\n"
        "  a:\n"
        "    model: m\n"
        "    timeout_s: soon\n"
        "routes:\n"
        "  auto: {deployments: [b]}\n"
    )
    result = run("policy", "check", str(bad))
    assert result.returncode == 1
    assert f"{bad}:4:" in result.stderr
    assert "deployments.a.timeout_s" in result.stderr


def test_policy_explain_names_route_deployment_and_reasons() -> None:
    result = run("policy", "explain", str(POLICIES / "default.yaml"), "--prompt", "hello")
    assert result.returncode == 0, result.stderr
    decision = json.loads(result.stdout)
    assert decision["route"] == "auto"
    assert decision["deployment"] == "local-cpu"
    assert any("skip" in reason and "OPENAI_API_KEY" in reason for reason in decision["reasons"])


def test_policy_explain_scores_every_prompt_and_says_when_the_route_ignores_it() -> None:
    result = run("policy", "explain", str(POLICIES / "default.yaml"), "--prompt", "hello")
    decision = json.loads(result.stdout)
    assert decision["strategy"] == "cascade"
    expected = Classifier.load().score([{"role": "user", "content": "hello"}])
    assert decision["score"] == pytest.approx(expected, abs=1e-9)
    assert decision["classifier"] == "features"
    assert any("the verifier's prior" in reason for reason in decision["reasons"])


@pytest.mark.parametrize(
    ("routes", "chosen"),
    [(["exam"], "exam"), (["exam", "auto"], "auto")],
)
def test_policy_explain_without_model_takes_auto_or_the_only_route(
    tmp_path: Path, routes: list[str], chosen: str
) -> None:
    policy = tmp_path / "routes.yaml"
    policy.write_text(
        'deployments:\n  a: {model: m, api_base: "http://127.0.0.1:9/v1"}\nroutes:\n'
        + "".join(f"  {name}: {{strategy: fixed, deployments: [a]}}\n" for name in routes)
    )
    result = run("policy", "explain", str(policy), "--prompt", "hi")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["route"] == chosen


def test_policy_explain_without_a_route_to_take_says_to_choose_one(tmp_path: Path) -> None:
    policy = tmp_path / "routes.yaml"
    policy.write_text(
        'deployments:\n  a: {model: m, api_base: "http://127.0.0.1:9/v1"}\nroutes:\n'
        "  one: {strategy: fixed, deployments: [a]}\n  two: {strategy: fixed, deployments: [a]}\n"
    )
    result = run("policy", "explain", str(policy), "--prompt", "hi")
    assert result.returncode == 1
    assert "--model" in result.stderr and "one, two" in result.stderr


def test_policy_explain_scores_with_the_routes_classifier(tmp_path: Path) -> None:
    policy = tmp_path / "minilm.yaml"
    policy.write_text(
        """
deployments:
  cheap: {model: small, api_base: "http://127.0.0.1:9/v1", tier: cheap}
  big: {model: large, api_base: "http://127.0.0.1:9/v1", tier: premium}
routes:
  auto:
    strategy: classifier
    classifier: minilm
    deployments: [cheap, big]
    tiers: [{tier: cheap, below: 0.5}, {tier: premium}]
"""
    )
    result = run("policy", "explain", str(policy), "--prompt", "Prove that 7 is prime.")
    assert result.returncode == 0, result.stderr
    decision = json.loads(result.stdout)
    assert decision["classifier"] == "minilm"
    expected = shipped().score([{"role": "user", "content": "Prove that 7 is prime."}])
    assert decision["score"] == pytest.approx(expected, abs=1e-6)


def test_policy_explain_says_what_the_sla_does_live() -> None:
    env = {**os.environ, "UPSTREAM_A_URL": "http://a/v1", "UPSTREAM_B_URL": "http://b/v1"}
    policy = str(POLICIES / "examples" / "sla-hedge.yaml")
    result = run("policy", "explain", policy, "--prompt", "hi", "--model", "chat", env=env)
    assert result.returncode == 0, result.stderr
    decision = json.loads(result.stdout)
    assert (decision["deployment"], decision["fallbacks"]) == ("upstream-a", ["upstream-b"])
    live = [reason for reason in decision["reasons"] if reason.startswith("live:")]
    assert "500 ms TTFT SLA" in live[0] and "after 250 ms" in live[1]


def test_policy_explain_says_whether_second_opinions_are_asked() -> None:
    policy = str(POLICIES / "examples" / "cascade-second-opinion.yaml")
    env = {**os.environ, "LOCAL_URL": "http://a/v1", "OPINION_URL": "http://b/v1"}
    env["OPENAI_API_KEY"] = "fake-openai-key"
    question = "Which gas do plants absorb?\nA) oxygen\nB) carbon dioxide\nAnswer:"

    def opinion_reason(prompt: str, env: dict[str, str]) -> str:
        result = run("policy", "explain", policy, "--prompt", prompt, "--model", "exam", env=env)
        assert result.returncode == 0, result.stderr
        [reason] = [r for r in json.loads(result.stdout)["reasons"] if "second opinion" in r]
        return reason

    assert opinion_reason(question, env).startswith("second opinions from opinion asked")
    assert "no answer to compare" in opinion_reason("Write a poem.", env)
    code = "Write a python function to reverse a string."
    assert opinion_reason(code, env).startswith("second opinions from opinion asked")
    alone = {k: v for k, v in env.items() if k != "OPENAI_API_KEY"}  # premium unavailable
    assert "no tier to escalate to" in opinion_reason(question, alone)
    unset = {k: v for k, v in env.items() if k != "OPINION_URL"}
    assert "none is available" in opinion_reason(question, unset)


def test_policy_explain_says_whether_code_answers_are_run(tmp_path: Path) -> None:
    example = (POLICIES / "examples" / "cascade-second-opinion.yaml").read_text()
    env = {**os.environ, "LOCAL_URL": "http://a/v1", "OPINION_URL": "http://b/v1"}

    def code_reason(policy_text: str, prompt: str) -> str:
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_text)
        result = run(
            "policy", "explain", str(policy), "--prompt", prompt, "--model", "exam", env=env
        )
        assert result.returncode == 0, result.stderr
        [reason] = [
            r
            for r in json.loads(result.stdout)["reasons"]
            if "code answers" in r or "code is run" in r
        ]
        return reason

    code = "Write a python function to reverse a string."
    assert "not run (run_code_examples is off)" in code_reason(example, code)
    runs = example.replace("strategy: cascade", "strategy: cascade\n    run_code_examples: true")
    assert runs != example
    expected = "run in the sandbox against the examples it claims"
    if sandbox.available() is None:
        assert expected in code_reason(runs, code)
        assert "does not ask for Python code" in code_reason(runs, "Write a poem.")
        js = "Write a JavaScript function to reverse a string."
        assert "does not ask for Python code" in code_reason(runs, js)
    else:  # this host cannot isolate code: the route keeps the runs off
        assert "this host cannot isolate code" in code_reason(runs, code)


def test_policy_explain_says_what_decides_an_escalation() -> None:
    policy = str(POLICIES / "examples" / "cascade-second-opinion.yaml")
    env = {**os.environ, "LOCAL_URL": "http://a/v1", "OPINION_URL": "http://b/v1"}
    result = run("policy", "explain", policy, "--prompt", "hi", "--model", "exam", env=env)
    assert result.returncode == 0, result.stderr
    [reason] = [r for r in json.loads(result.stdout)["reasons"] if "verify_threshold" in r]
    assert reason.startswith("an answer the verifier scores below verify_threshold 0.6069 ")
    assert "escalates to the next tier, at most 1 time(s)" in reason


def many_deployments_policy(path: Path, count: int = 1000) -> Path:
    """A valid policy whose `check` notes (each deployment waits for its key) and
    `explain` reasons (what each serves) run past what a pipe holds (64 KiB)."""
    lines = ["deployments:"]
    lines += [
        f"  d{n:04}: {{model: m, api_base: 'http://127.0.0.1:9/v1', requires_key: true,"
        f" api_key: '${{UNSET_KEY_{n:04}}}', price: {{input_per_mtok: 1, output_per_mtok: 1}}}}"
        for n in range(count)
    ]
    names = ", ".join(f"d{n:04}" for n in range(count))
    path.write_text("\n".join([*lines, "routes:", f"  auto: {{deployments: [{names}]}}", ""]))
    return path


@pytest.mark.parametrize(
    ("command", "valid"),
    [(["check"], True), (["explain", "--prompt", "hello"], True), (["check"], False)],
    ids=["check", "explain", "check-invalid"],
)
def test_a_reader_that_goes_leaves_the_policy_commands_outcome(
    tmp_path: Path, command: list[str], valid: bool
) -> None:
    """`policy check PATH | head -1`: the reader takes a line and closes the pipe while
    the command still writes; it ends quietly (no BrokenPipeError traceback) with its
    own outcome, 0 for a valid policy, 1 for an invalid one."""
    path = many_deployments_policy(tmp_path / "policy.yaml")
    if not valid:
        path.write_text(path.read_text().replace("model: m,", "model: 7,", 1))
    verb, *rest = command
    args = [EXE, "policy", verb, str(path), *rest]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        assert child.stdout is not None and child.stderr is not None
        first = child.stdout.readline()
        child.stdout.close()
        err = child.stderr.read().decode()
    assert child.returncode == (0 if valid else 1), err
    assert "Traceback" not in err and "BrokenPipe" not in err
    if valid:
        assert first.startswith(b"{" if verb == "explain" else str(path).encode())
    else:
        assert first == b"" and "deployments.d0000.model" in err


def test_keys_new_and_hash_agree() -> None:
    made = json.loads(run("keys", "new").stdout)
    assert made["hash"] == hash_key(made["key"])
    hashed = run("keys", "hash", stdin=made["key"] + "\n")
    assert hashed.stdout.strip() == made["hash"]


def test_serve_on_embedded_defaults(tmp_path: Path) -> None:
    """The README's first command: no policy, no keys, no Redis, no GPU. The gateway
    starts the embedded CPU engine as its local tier and stops it on the way out."""
    port, engine_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "REDIS"))}
    env["CASCADE_SPOOL_PATH"] = str(tmp_path / "spool")
    env["LOCAL_ENGINE_PORT"] = str(engine_port)
    proc = subprocess.Popen(
        [EXE, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(f"{base}/healthz").status_code == 200, proc, 30)
        models = httpx.get(f"{base}/v1/models").json()  # anonymous access on localhost
        assert "auto" in {m["id"] for m in models["data"]}
        # The OpenAI SDK always sends a key: with no client key configured, any will do.
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="not-needed", max_retries=0)
        assert "auto" in {m.id for m in client.models.list()}
        # No keys: the premium route answers a clear 503 naming what is missing.
        reply = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": "premium", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert reply.status_code == 503
        assert "OPENAI_API_KEY" in reply.json()["error"]["message"]
        # `auto` is answered by the embedded engine, with text the tiny model generated.
        body = {"model": "auto", "max_tokens": 12, "messages": [{"role": "user", "content": "hi"}]}

        def answered() -> bool:
            return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30).is_success

        wait_for(answered, proc, 90)
        reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
        assert reply.headers["x-cascade-deployment"] == "local-cpu"
        assert reply.json()["choices"][0]["message"]["content"].strip()
        assert reply.json()["usage"]["completion_tokens"] > 0
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if proc.stdout:
            proc.stdout.close()
    with pytest.raises(httpx.TransportError):  # the engine went down with the gateway
        httpx.get(f"http://127.0.0.1:{engine_port}/health", timeout=2)


def wait_for(check: Callable[[], bool], proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    serving(proc, check, timeout_s, lambda: proc.stdout.read() if proc.stdout else b"")


async def test_spend_report_matches_the_ledger(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    ledger_store: RedisStore,
    redis_url: str,
    redis_prefix: str,
) -> None:
    base = start_gateway(openai_compatible_policy(), UPSTREAM_BASE_URL=fake_openai.url).url
    ids = []
    for words in (1, 5, 9):
        body = {"model": "auto", "messages": [{"role": "user", "content": "w " * words}]}
        reply = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
        ids.append(reply.headers["x-request-id"])
    records = [await wait_for_record(ledger_store, i) for i in ids]
    today = datetime.now(UTC).date().isoformat()
    env = {**os.environ, "REDIS_URL": redis_url, "CASCADE_REDIS_PREFIX": redis_prefix}
    args = ("spend", "report", "--from", today, "--to", today, "--group-by", "team,model")
    body = json.loads(run(*args, "--format", "json", env=env).stdout)
    [row] = body["data"]
    assert body["total"]["cost_usd"] == row["cost_usd"] and body["note"] is None
    assert (row["team"], row["model"], row["requests"]) == ("test", "fake-model", 3)
    assert row["cost_usd"] == round(sum(r.cost_nanos for r in records) / 1e9, 9)
    reference = sum(r.reference_cost_nanos for r in records) / 1e9
    assert row["savings_usd"] == pytest.approx(reference - row["cost_usd"], abs=1e-9)
    assert row["savings_pct"] > 90  # the example's upstream is far cheaper than gpt-4o

    csv_text = run(*args, env=env).stdout.splitlines()
    assert csv_text[0].startswith("team,model,requests,errors,")
    assert csv_text[1].startswith("test,fake-model,3,0,")


def test_router_score_and_verify_contracts(tmp_path: Path) -> None:
    """The external contracts: one {"id", "score"} line per input row, in order."""
    rows = tmp_path / "in.jsonl"
    rows.write_text(
        '{"id": "easy", "prompt": "hi there"}\n'
        '{"id": 7, "messages": [{"role": "user", "content": "Prove it step by step."}]}\n'
    )
    scored = [json.loads(line) for line in run("router", "score", str(rows)).stdout.splitlines()]
    assert [r["id"] for r in scored] == ["easy", 7]
    assert all(set(r) == {"id", "score"} and 0 <= r["score"] <= 1 for r in scored)

    answers = tmp_path / "answers.jsonl"
    answers.write_text(
        '{"id": "ok", "prompt": "What is 2+2?", "response": "2 + 2 = 4. The answer is 4."}\n'
        '{"id": "no", "prompt": "What is 2+2?", "response": "I am sorry, I cannot help."}\n'
    )
    verified = run("router", "verify", str(answers)).stdout.splitlines()
    scores = {row["id"]: row["score"] for row in map(json.loads, verified)}
    assert scores["ok"] > scores["no"]


def test_router_verify_weighs_second_opinions(tmp_path: Path) -> None:
    """Optional `samples` (other answers to the prompt): a second opinion that agrees on
    the option raises the score, one that disagrees lowers it; no samples sits between."""
    prompt = "Which is a gas at room temperature?\nA) iron\nB) oxygen\nC) wood\nAnswer:"
    rows = [
        {"id": "alone", "prompt": prompt, "response": "B"},
        {"id": "agree", "prompt": prompt, "response": "B", "samples": ["The answer is B."]},
        {"id": "disagree", "prompt": prompt, "response": "B", "samples": ["C"]},
        {"id": "unsure", "prompt": prompt, "response": "B", "samples": ["Hmm, hard."]},
    ]
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps(row) + "\n" for row in rows))
    verified = run("router", "verify", str(answers)).stdout.splitlines()
    scores = {row["id"]: row["score"] for row in map(json.loads, verified)}
    assert scores["agree"] > scores["alone"] > scores["disagree"]
    assert scores["unsure"] == scores["alone"]  # nothing to compare: no opinion

    answers.write_text(json.dumps({"id": 1, "prompt": "q", "response": "a", "samples": "b"}))
    result = run("router", "verify", str(answers))
    assert result.returncode == 1
    assert "'samples' must be a list of strings" in result.stderr
    assert result.stdout == ""


def test_router_calibrate_verify_prints_the_threshold(tmp_path: Path) -> None:
    """The `verify_threshold` a cascade needs to escalate a target share of answers."""
    maths = "Tom has 3 boxes of 12 eggs and breaks 5. How many eggs are left?"
    answers = [
        "3 * 12 = 36 eggs. 36 - 5 = 31 eggs are left.\n#### 31",
        "3 * 12 = 36, 36 - 5 = 33\n#### 33",  # a wrong step
        "I am sorry, I cannot help with that.",
        "Tom has 31 eggs left.",
    ]
    rows = tmp_path / "answers.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"id": i, "prompt": maths, "response": a}) + "\n"
            for i, a in enumerate(answers)
        )
    )
    result = run("router", "calibrate-verify", str(rows), "--escalate", "0.5")
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("verify_threshold: ") and line.endswith("escalates 50.0% of 4 answers")
    threshold = float(line.split()[1])
    verified = run("router", "verify", str(rows)).stdout.splitlines()
    scores = [json.loads(r)["score"] for r in verified]
    assert sum(s < threshold for s in scores) == 2

    bad = run("router", "calibrate-verify", str(rows), "--escalate", "2")
    assert bad.returncode == 1 and "--escalate must be a share" in bad.stderr


def test_router_calibrate_prints_a_tiers_block(tmp_path: Path) -> None:
    rows = tmp_path / "sample.jsonl"
    prompts = ["hi", "what time is it?", "Prove the theorem step by step.", "Write a compiler."]
    rows.write_text(
        "".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts))
    )
    result = run("router", "calibrate", str(rows), "--shares", "local=0.5,premium=0.5")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "tiers:" and lines[1].startswith("  - {tier: local, below: ")
    assert lines[2] == "  - {tier: premium}"
