"""`engine up|status|down` end to end: the real argv builder runs the vLLM stand-in
through a wrapper script named as the engine's `executable`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from local_engine.cli import main
from local_engine.state import EngineRecord, pid_alive, read_record
from tests.local_engine.stand_in import ROOT, free_port
from tests.support import eventually


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    wrapper = tmp_path / "fake-vllm"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m tests.fakes.vllm_process "$@"\n'
    )
    wrapper.chmod(0o755)
    path = tmp_path / "policy.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        engines:
          small:
            model: fake/small
            port: {free_port()}
            executable: {wrapper}
            speculative: {{method: ngram, num_speculative_tokens: 3, prompt_lookup_max: 3}}
            extra_args: [--load-seconds, "0.2", --tokens-per-second, "100",
                         --kv-cache-usage, "0.25"]
            health_interval_s: 0.05
            restart_backoff_s: 0.1
            stop_timeout_s: 2
        deployments:
          local: {{model: fake/small, engine: small}}
        routes:
          auto: {{deployments: [local]}}
        """)
    )
    return path


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "run"
    yield path
    for state in path.glob("*.json"):  # leave no process behind, whatever the test did
        record = read_record(state)
        for pid in (record.supervisor_pid, record.pid):
            if pid and pid != os.getpid() and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def cli(*args: str) -> int:
    return main(list(args))


def shell(*args: str, without: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """`cascade-gateway engine ARGS` in a fresh process (the gateway's own entry point),
    from a shell where the variables in `without` are unset: an on-call engineer's."""
    env = {name: value for name, value in os.environ.items() if name not in without}
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "engine", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def with_api_key(policy: Path, value: str) -> None:
    with_field(policy, f"api_key: {value}")


def with_field(policy: Path, line: str) -> None:
    text = policy.read_text()
    policy.write_text(
        text.replace("    stop_timeout_s: 2\n", f"    stop_timeout_s: 2\n    {line}\n")
    )


def dumping_environ(policy: Path) -> Path:
    """Make the engine's executable write the environment it was given to a JSON file
    (returned) before it runs the stand-in."""
    dump = policy.parent / "engine-environ.json"
    (policy.parent / "fake-vllm").write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        with open({str(dump)!r}, "w") as out:
            json.dump(dict(os.environ), out)
        os.environ["PYTHONPATH"] = {str(ROOT)!r}
        os.execv(sys.executable, [sys.executable, "-m", "tests.fakes.vllm_process", *sys.argv[1:]])
        """)
    )
    return dump


def chat(base_url: str, key: str | None = None) -> int:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": "fake/small", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{base_url}/chat/completions", json=body, headers=headers).status_code


def record(run_dir: Path, state: str | None = None) -> EngineRecord:
    def check() -> EngineRecord | None:
        try:
            found = read_record(run_dir / "small.json")
        except Exception:
            return None
        return found if state is None or found.state == state else None

    found: EngineRecord = eventually(check, 15, f"engine small to be {state}")
    return found


def test_up_in_the_foreground_until_sigint(
    policy: Path, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    up = subprocess.Popen(
        [sys.executable, "-m", "local_engine.cli", "up", "--policy", str(policy), "--run-dir",
         str(run_dir)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    ready = record(run_dir, "ready")
    eventually(lambda: read_record(run_dir / "small.json").tokens_per_second, 5, "a rate")

    assert cli("status", "--policy", str(policy), "--run-dir", str(run_dir)) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "ENGINE", "PID", "STATE", "HEALTH", "RUN", "WAIT", "KV%", "TOK/S", "ACCEPT", "RESTARTS",
    ]  # fmt: skip
    cells = table[1].split()
    assert cells[:7] == ["small", str(ready.pid), "ready", "ok", "0", "0", "25.0"]
    assert cells[8:] == ["0.67", "0"]

    up.send_signal(signal.SIGINT)
    _, errors = up.communicate(timeout=10)
    assert up.returncode == 0
    assert "engine small ready" in errors.decode()
    assert record(run_dir).state == "stopped" and not pid_alive(ready.pid)
    assert "--speculative-config" in (run_dir / "small.log").read_text()


def test_detach_then_down_from_another_invocation(
    policy: Path, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("up", "--policy", str(policy), "--run-dir", str(run_dir), "--detach") == 0
    out = capsys.readouterr().out
    ready = record(run_dir, "ready")
    assert f"supervisor pid {ready.supervisor_pid}" in out and "ready" in out

    assert cli("status", "--policy", str(policy), "--run-dir", str(run_dir), "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["state"], status["health"], status["kv_cache_percent"]) == ("ready", "ok", 25.0)

    assert cli("down", "--policy", str(policy), "--run-dir", str(run_dir)) == 0

    assert capsys.readouterr().out == "small: stopped\n"
    assert not pid_alive(ready.pid)
    eventually(lambda: not pid_alive(ready.supervisor_pid), 5, "the supervisor to exit")


def test_down_stops_the_engine_itself_when_the_supervisor_is_gone(
    policy: Path, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("up", "--policy", str(policy), "--run-dir", str(run_dir), "--detach") == 0
    ready = record(run_dir, "ready")
    os.kill(ready.supervisor_pid, signal.SIGKILL)
    eventually(lambda: not pid_alive(ready.supervisor_pid), 5, "the supervisor to die")
    capsys.readouterr()

    assert cli("status", "--policy", str(policy), "--run-dir", str(run_dir), "--json") == 0
    assert json.loads(capsys.readouterr().out)["state"] == "ready (supervisor gone)"
    assert cli("down", "--policy", str(policy), "--run-dir", str(run_dir)) == 0

    assert capsys.readouterr().out == "small: stopped (no live supervisor)\n"
    assert not pid_alive(ready.pid)
    assert record(run_dir).state == "stopped"


def test_status_of_an_engine_never_started(
    policy: Path, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("status", "--policy", str(policy), "--run-dir", str(run_dir), "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["state"], status["health"], status["pid"]) == ("not started", "down", None)
    assert cli("down", "--policy", str(policy), "--run-dir", str(run_dir)) == 0
    assert "small: not running" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "big"], "no engine named big; declared: small"),
    ],
)
def test_selection_errors(
    policy: Path, run_dir: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    for command in ("up", "status", "down"):
        assert cli(command, "--policy", str(policy), "--run-dir", str(run_dir), *args) == 2
        assert message in capsys.readouterr().err


def test_policy_without_engines_or_with_unset_key(
    tmp_path: Path,
    policy: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bare = tmp_path / "bare.yaml"
    bare.write_text("deployments: {a: {model: m, api_base: 'http://x/v1'}}\n"
                    "routes: {auto: {deployments: [a]}}\n")  # fmt: skip
    assert cli("up", "--policy", str(bare)) == 2
    assert "the policy declares no engines" in capsys.readouterr().err

    monkeypatch.delenv("FAKE_ENGINE_KEY", raising=False)
    key_line = "    api_key: ${FAKE_ENGINE_KEY}\n"
    policy.write_text(
        policy.read_text().replace("    stop_timeout_s: 2\n", f"    stop_timeout_s: 2\n{key_line}")
    )
    assert cli("up", "--policy", str(policy)) == 2
    assert "api_key references ${FAKE_ENGINE_KEY}, which is unset" in capsys.readouterr().err


def test_status_and_down_from_a_shell_without_the_engine_key(
    policy: Path, run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with_api_key(policy, "${FAKE_ENGINE_KEY}")
    monkeypatch.setenv("FAKE_ENGINE_KEY", "fake-engine-key")
    assert cli("up", "--policy", str(policy), "--run-dir", str(run_dir), "--detach") == 0
    ready = record(run_dir, "ready")
    capsys.readouterr()
    assert chat(ready.base_url) == 401  # the engine got the key and asks for it
    assert chat(ready.base_url, "fake-engine-key") == 200

    common = ("--policy", str(policy), "--run-dir", str(run_dir))
    status = shell("status", *common, "--json", without=("FAKE_ENGINE_KEY",))
    assert (status.returncode, status.stderr) == (0, "")
    row = json.loads(status.stdout)
    assert (row["state"], row["health"], row["pid"]) == ("ready", "ok", ready.pid)
    table = shell("status", *common, without=("FAKE_ENGINE_KEY",))
    assert table.returncode == 0 and table.stdout.splitlines()[1].split()[:4] == [
        "small",
        str(ready.pid),
        "ready",
        "ok",
    ]

    down = shell("down", *common, without=("FAKE_ENGINE_KEY",))
    assert (down.returncode, down.stdout, down.stderr) == (0, "small: stopped\n", "")
    assert not pid_alive(ready.pid)
    eventually(lambda: not pid_alive(ready.supervisor_pid), 5, "the supervisor to exit")


def test_up_refuses_an_unset_key_naming_the_field_and_variable(policy: Path, run_dir: Path) -> None:
    with_api_key(policy, "${FAKE_ENGINE_KEY}")
    common = ("--policy", str(policy), "--run-dir", str(run_dir))
    for detach in ((), ("--detach",)):
        up = shell("up", *common, *detach, without=("FAKE_ENGINE_KEY",))
        assert up.returncode == 2 and up.stdout == ""
        assert (
            f"{policy}: engines.small.api_key: api_key references ${{FAKE_ENGINE_KEY}}, "
            "which is unset; engine up hands the key to vLLM: set FAKE_ENGINE_KEY, or write "
            "${FAKE_ENGINE_KEY:-} to run the engine without a key" in up.stderr
        )
        assert not run_dir.exists()  # nothing started, no state written

    status = shell("status", *common, "--json", without=("FAKE_ENGINE_KEY",))
    assert status.returncode == 0
    assert json.loads(status.stdout)["state"] == "not started"
    down = shell("down", *common, without=("FAKE_ENGINE_KEY",))
    assert (down.returncode, down.stdout) == (0, f"small: not running (no state in {run_dir})\n")


def test_an_optional_key_left_unset_starts_the_engine_without_one(
    policy: Path, run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with_api_key(policy, "${FAKE_ENGINE_KEY:-}")
    monkeypatch.delenv("FAKE_ENGINE_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "inherited")  # dropped: the policy says no key
    assert cli("up", "--policy", str(policy), "--run-dir", str(run_dir), "--detach") == 0
    ready = record(run_dir, "ready")
    assert chat(ready.base_url) == 200

    assert cli("down", "--policy", str(policy), "--run-dir", str(run_dir)) == 0
    assert capsys.readouterr().out.endswith("small: stopped\n")
    assert not pid_alive(ready.pid)


def test_the_example_policy_status_and_down_without_its_keys(tmp_path: Path) -> None:
    # Its header calls VLLM_LARGE_KEY optional: inspecting and stopping never needs it.
    example = ROOT / "policies" / "examples" / "vllm-engines.yaml"
    common = ("--policy", str(example), "--run-dir", str(tmp_path / "run"))
    keys = ("VLLM_LARGE_KEY", "GATEWAY_TEST_KEY")

    status = shell("status", *common, "--json", without=keys)
    assert (status.returncode, status.stderr) == (0, "")
    rows = [json.loads(line) for line in status.stdout.splitlines()]
    assert [(row["name"], row["state"]) for row in rows] == [
        ("small", "not started"),
        ("large", "not started"),
    ]
    down = shell("down", *common, without=keys)
    assert (down.returncode, down.stderr) == (0, "")
    assert [line.split(":")[0] for line in down.stdout.splitlines()] == ["small", "large"]


@pytest.mark.parametrize("keyed", [True, False])
def test_the_engine_gets_none_of_the_gateway_secrets(
    policy: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch, keyed: bool
) -> None:
    secrets = {
        "OPENAI_API_KEY": "fake-openai-key",
        "ANTHROPIC_API_KEY": "fake-anthropic-key",
        "GATEWAY_ADMIN_KEY": "fake-admin-key",
        "REDIS_URL": "redis://:fake-redis-password@127.0.0.1:6379/0",
        "FAKE_ENGINE_KEY": "fake-engine-key",  # the supervisor reads it; the engine need not
        "VLLM_API_KEY": "inherited",  # dropped either way: the policy decides
    }
    passed = {"CUDA_VISIBLE_DEVICES": "0", "HF_HOME": str(run_dir / "hf"), "OMP_NUM_THREADS": "2"}
    for name, value in {**secrets, **passed}.items():
        monkeypatch.setenv(name, value)
    dump = dumping_environ(policy)
    with_field(policy, 'env: {OMP_NUM_THREADS: "1", ENGINE_ONLY: "from the spec"}')
    if keyed:
        with_api_key(policy, "${FAKE_ENGINE_KEY}")
    common = ("--policy", str(policy), "--run-dir", str(run_dir))

    assert cli("up", *common, "--detach") == 0  # a separate supervisor, as serve starts
    ready = record(run_dir, "ready")
    environ = json.loads(dump.read_text())
    assert cli("down", *common) == 0
    assert not pid_alive(ready.pid)

    assert sorted(name for name in secrets if name in environ) == (
        ["VLLM_API_KEY"] if keyed else []
    )
    assert "fake-redis-password" not in json.dumps(environ)
    assert environ.get("VLLM_API_KEY") == ("fake-engine-key" if keyed else None)
    assert {name: environ.get(name) for name in ("PATH", "HOME")} == {
        name: os.environ[name] for name in ("PATH", "HOME")
    }
    assert {name: environ.get(name) for name in passed} == {**passed, "OMP_NUM_THREADS": "1"}
    assert environ["ENGINE_ONLY"] == "from the spec"


@pytest.mark.parametrize("port", ["99999", "0", "http"])
def test_serve_cpu_refuses_a_port_it_cannot_bind_as_given(
    port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """99999 would be bound as 34463 (mod 65536) while the log named 99999."""
    with pytest.raises(SystemExit) as exited:
        main(["serve-cpu", "--port", port])
    assert exited.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_the_commands_default_to_the_policy_and_engines_serve_uses(
    policy: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`serve` reads CASCADE_POLICY and keeps its engines under `engines/` beside
    CASCADE_SPOOL_PATH: with those set, `engine up|status|down` need no flags to find
    the same engines (without them, a serve-started engine read as "not started")."""
    monkeypatch.setenv("CASCADE_POLICY", str(policy))
    monkeypatch.setenv("CASCADE_SPOOL_PATH", str(tmp_path / "state" / "ledger.spool"))
    run_dir = tmp_path / "state" / "engines"
    try:
        assert cli("up", "--detach") == 0
        ready = record(run_dir, "ready")
        capsys.readouterr()
        assert cli("status", "--json") == 0
        status = json.loads(capsys.readouterr().out)
        assert (status["name"], status["state"]) == ("small", "ready")
    finally:
        assert cli("down") == 0
    assert not pid_alive(ready.pid)
