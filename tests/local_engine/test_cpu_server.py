"""`serve-cpu`'s HTTP surface over a real loopback socket, driven by the official SDK."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from local_engine.config import EngineConfig
from local_engine.cpu.app import create_app
from local_engine.cpu.server import DEFAULT_MODEL
from local_engine.metrics import parse_vllm_metrics
from policies.engines import EngineSpec
from tests.local_engine.loopback_server import Server
from tests.local_engine.stand_in import Running, free_port, reaches
from tests.local_engine.tiny_models import TOKENIZER, speculative_service
from tests.support import requires, serving

SHIPPED = DEFAULT_MODEL / "model.safetensors"
needs_shipped_model = requires(None if SHIPPED.exists() else f"{SHIPPED} is absent", "the model")

MODEL = "tiny-test"
VLLM_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_drafts_total",
)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server(create_app(speculative_service(MODEL))) as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


def test_chat_completion_with_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=7, temperature=0
    )
    assert reply.object == "chat.completion" and reply.model == MODEL
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in {"stop", "length"}
    assert reply.usage is not None and reply.usage.prompt_tokens == len(
        TOKENIZER.encode(TOKENIZER.render_chat([{"role": "user", "content": "Hello"}]))
    )
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert 1 <= reply.usage.completion_tokens <= 7


def test_streamed_chat_equals_unstreamed_with_usage_last(client: openai.OpenAI) -> None:
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 9}
    whole = client.chat.completions.create(**request, temperature=0)  # type: ignore[call-overload]
    chunks = list(
        client.chat.completions.create(  # type: ignore[call-overload]
            **request, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[
        0
    ].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_plain_and_streamed(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=6, temperature=0)
    assert whole.object == "text_completion" and whole.usage is not None
    assert whole.usage.completion_tokens == 6 and whole.choices[0].finish_reason == "length"
    stream = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in stream) == whole.choices[0].text


def test_sse_wire_format_ends_with_done(server: Server) -> None:
    body = {"model": MODEL, "prompt": "a", "max_tokens": 3, "stream": True}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert all(event.startswith("data: ") for event in events)
    assert events[-1] == "data: [DONE]"


def test_models_health_and_vllm_metrics(client: openai.OpenAI, server: Server) -> None:
    assert [model.id for model in client.models.list()] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200
    client.completions.create(model=MODEL, prompt="warm", max_tokens=5, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    lines = text.splitlines()
    for name in VLLM_METRICS:
        labelled = [line for line in lines if line.startswith(name + "{")]
        assert labelled and all(f'model_name="{MODEL}"' in line for line in labelled), name
    # The gateway's vLLM scraper reads this engine like any vLLM deployment.
    scraped = parse_vllm_metrics(text)
    assert scraped.generation_tokens_total >= 5 and scraped.prompt_tokens_total > 0
    assert scraped.ttft_count >= 1 and scraped.itl_count >= 1
    assert scraped.spec_drafts > 0 and scraped.spec_draft_tokens >= scraped.spec_accepted_tokens
    assert scraped.kv_cache_usage is not None and 0.0 <= scraped.kv_cache_usage <= 1.0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 2}, "n"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": 500}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x" * 200}]}, "messages"),
    ],
)
def test_bad_input_is_an_openai_400_naming_the_field(
    client: openai.OpenAI, body: dict[str, object], param: str
) -> None:
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]} | body
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(**request)  # type: ignore[call-overload]
    error = raised.value.body
    assert isinstance(error, dict) and error["param"] == param, error
    assert error["type"] == "invalid_request_error" and param.split("[")[0] in error["message"]


def test_malformed_json_is_a_400(server: Server) -> None:
    response = httpx.post(
        server.url + "/v1/completions",
        content=b'{"model": "tiny-test", "prompt": ',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("the request body is not valid JSON")


@pytest.mark.parametrize(
    ("content", "content_type", "message"),
    [
        (b'{"model": "\xff"}', "application/json", "the request body is not valid JSON: 'utf-8'"),
        (b"[" * 100_000, "application/json", "the request body is JSON nested too deeply"),
        (b"[]", "application/json", "Input should be a valid dictionary"),
        (b"", "application/json", "Field required"),
        (b'{"model": "tiny-test", "prompt": "a"}', "text/plain", "Input should be a valid dict"),
    ],
)
def test_unreadable_bodies_are_openai_400s(
    server: Server, content: bytes, content_type: str, message: str
) -> None:
    headers = {"content-type": content_type}
    response = httpx.post(server.url + "/v1/completions", content=content, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(message)


def test_unknown_paths_and_methods_answer_as_vllm(server: Server) -> None:
    missing = httpx.get(server.url + "/v2/nothing")
    assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
    wrong = httpx.get(server.url + "/v1/completions")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json() == {"detail": "Method Not Allowed"}


def test_the_engine_server_imports_no_fastapi() -> None:
    """Starlette serves the engine, as it serves the gateway: FastAPI is no dependency."""
    code = "import sys, local_engine.cpu.server; print('fastapi' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False"]


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)


def test_gateway_cli_registers_serve_cpu_without_importing_torch() -> None:
    code = (
        "import sys; from gateway.cli import build_parser; "
        "args = build_parser().parse_args(['engine', 'serve-cpu', '--port', '9']); "
        "print(args.func.__name__, args.port, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["run_serve_cpu", "9", "False"]


@needs_shipped_model
def test_serve_cpu_command_answers_with_the_shipped_model(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "local_engine.cli", "serve-cpu", "--port", str(port)]
    log = tmp_path / "engine.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as sink, subprocess.Popen(command, stdout=sink, stderr=sink) as process:
        try:
            _wait_healthy(url, process, log)
            with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
                reply = sdk.chat.completions.create(
                    model="local-tiny",
                    messages=[{"role": "user", "content": "Tom has 3 apples and buys 4 more."}],
                    max_tokens=40,
                    temperature=0,
                )
            text = reply.choices[0].message.content or ""
            assert sum(ch.isalpha() for ch in text) > 10, text
            assert "vllm:spec_decode_num_drafts_total" in httpx.get(url + "/metrics").text
        finally:
            process.terminate()
            process.wait(timeout=20)


@needs_shipped_model
def test_the_supervisor_starts_the_cpu_engine_on_the_allow_listed_environment(
    tmp_path: Path,
) -> None:
    spec = EngineSpec.model_validate({"kind": "cpu", "port": free_port(), "health_interval_s": 0.1})
    gateway_env = {**os.environ, "OPENAI_API_KEY": "fake-openai-key"}
    config = EngineConfig("local", spec, tmp_path, base_env=gateway_env)
    running = Running([config])
    try:
        reaches(config, "ready", timeout_s=60)
        assert httpx.get(f"{spec.api_base}/models").json()["data"][0]["id"] == "local-tiny"
    finally:
        assert running.stop(timeout_s=30) == 0
    assert "OPENAI_API_KEY" not in config.env


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    serving(process, lambda: httpx.get(url + "/health", timeout=1).is_success, 60, log.read_text)
