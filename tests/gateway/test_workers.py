"""`serve --workers N`: a scrape reaches one worker, yet its counters are every
worker's, summed (prometheus_client's multiprocess files, in the directory `serve`
sets up or the operator gives)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
from prometheus_client.mmap_dict import MmapedDict

from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.ledger_fixtures import free_port
from tests.support import serving

POLICY = """
deployments:
  upstream:
    api_base: ${UPSTREAM_URL}
    model: m
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  auto: {deployments: [upstream], reference_model: upstream}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
KEY = "fake-workers-key"
MAX_REQUESTS = 200


def requests_counted(base: str) -> float:
    """`cascade_requests_total` summed over its series, from one scrape on a new
    connection (so that scrapes land on different workers)."""
    text = httpx.get(f"{base}/metrics", headers={"connection": "close"}).text
    return sum(float(v) for v in re.findall(r"^cascade_requests_total\{.*\} (\S+)$", text, re.M))


def workers_that_answered(directory: Path) -> int:
    """Worker processes whose counter file holds a request answered."""
    answered = 0
    for path in directory.glob("counter_*.db"):
        entries = MmapedDict.read_all_values_from_file(str(path))  # type: ignore[no-untyped-call]
        answered += any("cascade_requests_total" in key and value > 0 for key, value, *_ in entries)
    return answered


def test_every_scrape_counts_every_workers_requests(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "REDIS"))}
    counters = tmp_path / "metrics"  # given by the operator: serve uses it as it is
    counters.mkdir()
    env |= {"GATEWAY_TEST_KEY": KEY, "CASCADE_SPOOL_PATH": str(tmp_path / "spool")}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(counters)
    env["CASCADE_LOG_DECISIONS"] = "true"  # INFO lines, which each worker must set up
    log = tmp_path / "gateway.log"
    with FakeOpenAI() as upstream, log.open("wb") as stderr:
        env["UPSTREAM_URL"] = upstream.url
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--policy", str(policy)]
        proc = subprocess.Popen(
            [*argv, "--port", str(port), "--workers", "2"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            serving(proc, lambda: httpx.get(f"{base}/healthz").status_code == 200, 60)
            body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
            auth = {"authorization": f"Bearer {KEY}", "connection": "close"}
            sent = 0
            while workers_that_answered(counters) < 2:  # both must have answered some
                assert sent < MAX_REQUESTS, "one worker answered every request"
                reply = httpx.post(f"{base}/v1/chat/completions", json=body, headers=auth)
                assert reply.status_code == 200
                sent += 1
            assert [requests_counted(base) for _ in range(8)] == [sent] * 8
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    # Every request's decision line, from both workers, with its level and logger.
    line = r"^\d{4}-\d\d-\d\dT[\d:.]+Z INFO gateway\.decisions \[req_[0-9a-f]+\]: "
    decided = re.findall(line, log.read_text(), re.M)
    assert len(decided) >= sent
