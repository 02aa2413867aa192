"""The CPU engine's `/v1/embeddings`: MiniLM from the `embeddings` extra, driven by the
official SDK (which asks for base64) and by plain HTTP (floats)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import openai
import pytest

from local_engine.cpu.app import EngineService, create_app
from local_engine.cpu.embeddings import DIMENSIONS, MODEL_NAME
from local_engine.cpu.engine import Engine, EngineOptions
from local_engine.cpu.metrics import EngineMetrics
from local_engine.cpu.runner import EngineRunner
from local_engine.sentence_model import missing
from tests.local_engine.loopback_server import Server
from tests.local_engine.tiny_models import TOKENIZER, target
from tests.support import requires

MODEL = "local-tiny"
pytestmark = requires(missing(), "MiniLM embeddings")


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    options = EngineOptions(max_num_seqs=2, max_model_len=128, num_speculative_tokens=0)
    metrics = EngineMetrics(MODEL)
    engine = Engine(target(), TOKENIZER, options=options, metrics=metrics)
    with Server(create_app(EngineService(EngineRunner(engine), TOKENIZER, metrics, MODEL))) as s:
        yield s.url


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_the_sdk_gets_normalised_minilm_vectors(engine_url: str) -> None:
    client = openai.OpenAI(base_url=f"{engine_url}/v1", api_key="unused", max_retries=0)
    texts = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock prices fell."]
    reply = client.embeddings.create(model=MODEL, input=texts)  # base64 on the wire
    assert reply.model == MODEL_NAME
    vectors = [item.embedding for item in reply.data]
    assert [item.index for item in reply.data] == [0, 1, 2]
    assert all(len(v) == DIMENSIONS for v in vectors)
    assert all(math.isclose(cosine(v, v), 1.0, abs_tol=1e-4) for v in vectors)
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.2
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > len(texts)


def test_floats_and_the_model_name_as_minilm(engine_url: str) -> None:
    body = {"model": MODEL_NAME, "input": "hello", "encoding_format": "float"}
    reply = httpx.post(f"{engine_url}/v1/embeddings", json=body, timeout=60).json()
    assert len(reply["data"][0]["embedding"]) == DIMENSIONS
    assert reply["object"] == "list" and reply["data"][0]["object"] == "embedding"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "other", "input": "x"}, 404, "model"),
        ({"model": MODEL, "input": "x", "dimensions": 128}, 400, "dimensions"),
        ({"model": MODEL, "input": []}, 400, "input"),
        ({"model": MODEL, "input": [""]}, 400, "input"),
        ({"model": MODEL, "input": [1, 2, 3]}, 400, "input"),
    ],
)
def test_bad_requests_name_the_field(
    engine_url: str, body: dict[str, object], status: int, param: str
) -> None:
    response = httpx.post(f"{engine_url}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param
