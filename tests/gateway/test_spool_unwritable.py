"""A spool that cannot be written: said at start (not first at the Redis outage, when
spend would start to be lost), and each record lost while Redis is away is counted in
`cascade_ledger_lost_records_total`, which an alert watches.

Over real sockets: the gateway under uvicorn with its Redis unreachable (a port nothing
listens on) and its spool under /proc, where no directory can be made, and a fake
upstream."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, metric
from tests.support import eventually

POLICY = """
deployments:
  a:
    api_base: ${UPSTREAM_URL}
    model: a-model
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  chat: {strategy: fixed, deployments: [a]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
NOBODY = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def test_an_unwritable_spool_is_named_at_start_and_its_losses_counted(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    spool = Path("/proc/no-such-dir/ledger.spool")  # /proc takes no new directory, even root's
    with caplog.at_level(logging.ERROR):
        server = start_gateway(POLICY, redis=NOBODY, spool=spool, UPSTREAM_URL=fake_openai.url)
    assert any("CASCADE_SPOOL_PATH" in r.getMessage() for r in caplog.records)
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH)
        assert reply.status_code == 200  # served all the same
    eventually(
        lambda: metric(server.url, "cascade_ledger_lost_records_total") == 2,
        what="two records counted as lost",
    )


def test_a_writable_spool_says_nothing_and_loses_nothing(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        server = start_gateway(POLICY, redis=NOBODY, UPSTREAM_URL=fake_openai.url)
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH).is_success
    eventually(
        lambda: metric(server.url, "cascade_ledger_spooled_records") == 1, what="one spooled"
    )
    assert metric(server.url, "cascade_ledger_lost_records_total") == 0
    assert not any("CASCADE_SPOOL_PATH" in r.getMessage() for r in caplog.records)
