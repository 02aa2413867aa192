"""The `cascade-gateway` command line, run as the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from policies import hash_key
from tests.gateway.conftest import POLICIES
from tests.gateway.ledger_fixtures import free_port

EXE = shutil.which("cascade-gateway") or str(Path(sys.executable).parent / "cascade-gateway")


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


def test_keys_new_and_hash_agree() -> None:
    made = json.loads(run("keys", "new").stdout)
    assert made["hash"] == hash_key(made["key"])
    hashed = run("keys", "hash", stdin=made["key"] + "\n")
    assert hashed.stdout.strip() == made["hash"]


def test_serve_on_embedded_defaults(tmp_path: Path) -> None:
    """The README's first command: no policy, no keys, no Redis, no GPU."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "REDIS"))}
    env["CASCADE_SPOOL_PATH"] = str(tmp_path / "spool")
    proc = subprocess.Popen(
        [EXE, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"serve did not start: {proc.stdout.read() if proc.stdout else ''!r}")
            time.sleep(0.2)
        models = httpx.get(f"{base}/v1/models").json()  # anonymous access on localhost
        assert "auto" in {m["id"] for m in models["data"]}
        # No engine, no keys: the route answers a clear 503 naming what is missing.
        reply = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": "premium", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert reply.status_code == 503
        assert "OPENAI_API_KEY" in reply.json()["error"]["message"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        if proc.stdout:
            proc.stdout.close()
