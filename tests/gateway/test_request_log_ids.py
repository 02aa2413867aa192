"""Log lines carry the UTC time and the id of the request being served, so the
`x-request-id` a client quotes finds the request's lines: written through the handler
`configure_logging` installs, from a gateway over loopback whose upstream fails."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from gateway.http.request_ids import bind_request_id
from gateway.ledger import CostLedger, MemoryStore, SpendRecord
from gateway.ledger.spool import Spool
from gateway.settings import log_handler
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway
from tests.gateway.ledger_fixtures import make_record

REPO = Path(__file__).resolve().parents[2]
POLICY = """
deployments:
  a: {api_base: "${UPSTREAM_BASE_URL}", model: a-model, max_retries: 0}
  b: {api_base: "${UPSTREAM_BASE_URL}", model: b-model, max_retries: 0}
routes:
  fallback: {strategy: fallback, deployments: [a, b]}
  single: {strategy: fixed, deployments: [a]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"  # ISO 8601, UTC


@pytest.fixture
def log_lines(caplog: pytest.LogCaptureFixture) -> Iterator[io.StringIO]:
    """What the gateway's log handler writes, at INFO, while the test runs."""
    stream = io.StringIO()
    handler = log_handler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO):
            yield stream
    finally:
        root.removeHandler(handler)


def ask(base: str, route: str) -> httpx.Response:
    body = {"model": route, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def failure_lines(text: str, request_id: str) -> list[str]:
    """The executor's lines of `request_id`'s failed attempts, as the handler wrote them."""
    logged = rf"{TIME} INFO gateway\.pipeline\.executor \[{re.escape(request_id)}\]: "
    return re.findall(rf"^{logged}attempt \d failed: .*$", text, re.MULTILINE)


def test_a_failed_attempt_is_logged_with_the_request_id_its_client_got(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, log_lines: io.StringIO
) -> None:
    base = start_gateway(POLICY, UPSTREAM_BASE_URL=fake_openai.url).url
    fake_openai.fail(500, times=1)  # `a` fails, `b` answers
    answered = ask(base, "fallback")
    fake_openai.fail(500, times=1)  # nothing to fall back to: a 502
    refused = ask(base, "single")
    assert (answered.status_code, refused.status_code) == (200, 502)
    ids = [answered.headers["x-request-id"], refused.headers["x-request-id"]]
    assert ids[0] != ids[1]
    text = log_lines.getvalue()
    for request_id in ids:
        assert len(failure_lines(text, request_id)) == 1, text
    assert len(re.findall("attempt 1 failed", text)) == 2, text  # those two, no other


def test_records_outside_requests_and_made_by_hand_get_a_dash(log_lines: io.StringIO) -> None:
    logging.getLogger("some.library").warning("outside")  # a third-party logger's record
    assert re.fullmatch(rf"{TIME} WARNING some\.library \[-\]: outside\n", log_lines.getvalue())
    stream = io.StringIO()  # a record no logger saw: the handler still gives it an id
    record = {"name": "other", "levelname": "ERROR", "levelno": logging.ERROR, "msg": "by hand"}
    log_handler(stream).handle(logging.makeLogRecord(record))
    assert re.fullmatch(rf"{TIME} ERROR other \[-\]: by hand\n", stream.getvalue())


def test_an_id_is_bound_in_its_own_context_only(log_lines: io.StringIO) -> None:
    def serve() -> None:  # as a request's task does
        bind_request_id("req_x")
        logging.getLogger("tests.request").warning("in")

    contextvars.copy_context().run(serve)
    logging.getLogger("tests.request").warning("after")
    lines = log_lines.getvalue().splitlines()
    assert re.fullmatch(rf"{TIME} WARNING tests\.request \[req_x\]: in", lines[0])
    assert re.fullmatch(rf"{TIME} WARNING tests\.request \[-\]: after", lines[1])


class BrokenStore(MemoryStore):
    async def record_many(self, recs: Sequence[SpendRecord]) -> list[bool]:
        raise RuntimeError("a bug (test)")


async def test_a_writer_started_by_one_request_logs_others_records_without_its_id(
    log_lines: io.StringIO, tmp_path: Path
) -> None:
    """The ledger's writer starts with the first request that records spend, and lives
    on: its lines are its own, not that request's."""
    ledger = CostLedger(BrokenStore(), Spool(tmp_path / "spool"))

    async def request(request_id: str, record: SpendRecord) -> None:
        bind_request_id(request_id)
        ledger.submit(record)

    await asyncio.create_task(request("req_a", make_record(1)))
    assert await ledger.flush(5)
    await asyncio.create_task(request("req_b", make_record(2)))
    assert await ledger.flush(5)
    await ledger.stop(1)
    failed = re.findall(r"\[(\S+)\]: writing 1 spend record\(s\) failed", log_lines.getvalue())
    assert failed == ["-", "-"]


CONFIGURED = """
import logging, sys, uvicorn
from gateway.http.request_ids import bind_request_id
from gateway.settings import configure_logging
configure_logging("info", sys.argv[1])
uvicorn.Config("gateway.http.app:create_app", factory=True, log_level="info", log_config=None)
logging.getLogger("uvicorn.error").info("uvicorn's own")
logging.getLogger("gateway.x").info("outside")
bind_request_id("req_1")
logging.getLogger("redis").warning("a library's")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("gateway.y").exception("it broke")
"""


def configured(log_format: str) -> list[str]:
    """The lines a process set up as `serve` sets it up (uvicorn given no log config of
    its own, as `serve` runs it) writes."""
    done = subprocess.run(
        [sys.executable, "-c", CONFIGURED, log_format],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stderr.splitlines()


def test_configure_logging_formats_every_logger_uvicorns_too() -> None:
    lines = configured("text")
    assert re.fullmatch(rf"{TIME} INFO uvicorn\.error \[-\]: uvicorn's own", lines[0])
    assert re.fullmatch(rf"{TIME} INFO gateway\.x \[-\]: outside", lines[1])
    assert re.fullmatch(rf"{TIME} WARNING redis \[req_1\]: a library's", lines[2])
    assert re.fullmatch(rf"{TIME} ERROR gateway\.y \[req_1\]: it broke", lines[3])
    assert lines[4] == "Traceback (most recent call last):"  # text: the traceback follows


def test_json_logs_are_one_object_a_line_tracebacks_included() -> None:
    """CASCADE_LOG_FORMAT=json: every record, uvicorn's and a traceback's included, is
    one JSON object on one line, with the request id as a field."""
    records = [json.loads(line) for line in configured("json")]
    assert [(r["level"], r["logger"], r["request_id"], r["message"]) for r in records] == [
        ("INFO", "uvicorn.error", "-", "uvicorn's own"),
        ("INFO", "gateway.x", "-", "outside"),
        ("WARNING", "redis", "req_1", "a library's"),
        ("ERROR", "gateway.y", "req_1", "it broke"),
    ]
    assert all(re.fullmatch(TIME, r["ts"]) for r in records)
    assert len({r["pid"] for r in records}) == 1 and isinstance(records[0]["pid"], int)
    assert "ZeroDivisionError" in records[3]["exception"]
    assert all("exception" not in r for r in records[:3])
