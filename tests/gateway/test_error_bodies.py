"""What the client is told of an upstream's error body, whatever its form: OpenAI's,
vLLM's older flat one, FastAPI's `detail`, an HTML error page, plain text, any bytes
(`gateway.upstreams.error_bodies`). End to end, the OpenAI SDK reads the message
through the real gateway in front of a fake upstream answering with such bodies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import Response

from gateway.pipeline.upstream_errors import upstream_error_fields
from gateway.upstreams.base import UpstreamTarget
from gateway.upstreams.error_bodies import MAX_MESSAGE_CHARS, error_message
from gateway.upstreams.litellm_impl import translate_error
from tests.fakes import openai_upstream
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import CLIENT_KEY, StartGateway

VLLM_FLAT = (
    b'{"object":"error","message":"This model\'s maximum context length is 4096 tokens. '
    b'However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}'
)
FASTAPI_422 = orjson.dumps(
    {
        "detail": [
            {"type": "missing", "loc": ["body", "messages"], "msg": "Field required"},
            {"type": "int_type", "loc": ["body", "n", 0], "msg": "Input should be an integer"},
        ]
    }
)
NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "Bad model", "type": "invalid_request_error"}}', "Bad model"),
        (VLLM_FLAT, "This model's maximum context length is 4096 tokens. However, you"),
        (FASTAPI_422, "body.messages: Field required; body.n[0]: Input should be an integer"),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b'{"error": "model overloaded"}', "model overloaded"),
        (b'{"error": {"code": 7}}', '{"code":7}'),
        (b'"plain JSON string"', "plain JSON string"),
        (NGINX_502, "an HTML page (502 Bad Gateway)"),
        (b"<!DOCTYPE html><html><body>oops</body></html>", "an HTML page"),
        (b"<!doctype html><title>Error &amp; more</title>", "an HTML page (Error & more)"),
        (b"upstream connect error\nor disconnect", "upstream connect error or disconnect"),
        (b"", None),
        (b"   \n\t", None),
        (b"{}", None),
        (b"[1, 2]", None),
    ],
)
def test_the_message_of_each_form(body: bytes, message: str | None) -> None:
    found = error_message(body)
    if message is None:
        assert found is None
    else:
        assert found is not None and found.startswith(message)


def test_a_long_fastapi_detail_list_names_the_first_few() -> None:
    detail = [{"loc": ["body", f"f{i}"], "msg": "bad"} for i in range(9)]
    found = error_message(orjson.dumps({"detail": detail}))
    assert found == "; ".join(f"body.f{i}: bad" for i in range(5)) + " (and 4 more)"


def test_a_long_message_is_cut_and_an_html_page_never_shows_its_markup() -> None:
    found = error_message(orjson.dumps({"error": {"message": "x" * 10_000}}))
    assert found is not None and len(found) == MAX_MESSAGE_CHARS and found.endswith("...")
    page = b"<html><head><title>" + b"T" * 5000 + b"</title></head><body><script>"
    found = error_message(page + b"x" * 100_000 + b"</script></body></html>")
    assert found is not None and len(found) <= MAX_MESSAGE_CHARS and "<" not in found


def test_the_flat_form_keeps_its_type_for_the_client() -> None:
    assert upstream_error_fields(VLLM_FLAT) == {"type": "BadRequestError"}
    assert upstream_error_fields(b'{"message": "m", "type": "t"}') == {}  # not flat: no object


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
ERROR_SHAPES = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries({"error": JSON_VALUES}),
    st.fixed_dictionaries({"object": st.just("error"), "message": JSON_VALUES}),
    st.fixed_dictionaries(
        {"detail": st.lists(st.dictionaries(st.sampled_from(["loc", "msg"]), JSON_VALUES))}
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=4096),
        ERROR_SHAPES.map(lambda value: json.dumps(value).encode()),  # big integers too
        st.text(max_size=2000).map(lambda t: b"<html><title>" + t.encode() + b"</title>"),
    )
)
def test_any_error_body_gives_a_bounded_message_and_never_raises(body: bytes) -> None:
    found = error_message(body)
    assert found is None or (0 < len(found) <= MAX_MESSAGE_CHARS and "\n" not in found)
    assert isinstance(upstream_error_fields(body), dict)


def test_a_deep_or_huge_body_too() -> None:
    for body in (b"[" * 5000 + b"]" * 5000, b'{"detail": ' + b"[" * 2000 + b"]" * 2000 + b"}"):
        found = error_message(body)
        assert found is None or len(found) <= MAX_MESSAGE_CHARS
    assert len(error_message(b"x" * 20_000_000) or "") == MAX_MESSAGE_CHARS


class BadGateway(Exception):
    status_code = 502  # as litellm's exceptions carry it


def test_an_html_page_litellm_quotes_is_reduced_to_its_title() -> None:
    target = UpstreamTarget("claude", "anthropic", "m", "http://127.0.0.1:9", None)
    failure = translate_error(target, BadGateway("AnthropicException - " + NGINX_502.decode()))
    assert failure.status == 502
    assert failure.message.endswith("AnthropicException - an HTML page (502 Bad Gateway)")


# --- through the gateway: the client reads the upstream's message --------------------

POLICY = """
deployments:
  only:
    api_base: ${UPSTREAM_URL}
    model: m
    max_retries: 0
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  auto: {strategy: fixed, deployments: [only]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""


@pytest.fixture
def client(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> Iterator[openai.OpenAI]:
    base = start_gateway(POLICY, UPSTREAM_URL=fake_openai.url).url
    with openai.OpenAI(base_url=base + "/v1", api_key=CLIENT_KEY, max_retries=0) as sdk:
        yield sdk


def answer_errors_with(monkeypatch: pytest.MonkeyPatch, content: bytes, media_type: str) -> None:
    def respond(status: int, *_: Any, **__: Any) -> Response:
        return Response(content, status_code=status, media_type=media_type)

    monkeypatch.setattr(openai_upstream, "openai_error", respond)


@pytest.mark.parametrize(
    ("status", "content", "media_type", "shown"),
    [
        (400, VLLM_FLAT, "application/json", "maximum context length is 4096 tokens"),
        (422, FASTAPI_422, "application/json", "body.messages: Field required"),
        (502, NGINX_502, "text/html", "answered 502: an HTML page (502 Bad Gateway)"),
    ],
    ids=["vllm-flat-400", "fastapi-422", "html-502"],
)
def test_the_client_reads_the_upstreams_message(
    client: openai.OpenAI,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    status: int,
    content: bytes,
    media_type: str,
    shown: str,
) -> None:
    answer_errors_with(monkeypatch, content, media_type)
    fake_openai.fail(status, times=None)
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])
    message = failed.value.message
    assert shown in message
    assert "<" not in message and "HTTP " not in message
