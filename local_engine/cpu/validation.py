"""Request bodies read into the models of `local_engine.cpu.protocol`.

    body = await read_body(request, ChatCompletionBody)

Every failure is an `InvalidRequest` (a 400 in OpenAI's error format) naming the field
as the client sent it (`messages[0].role`) with pydantic's message, word for word what
the engine answered while FastAPI read its bodies.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from starlette.requests import Request

from local_engine.cpu.errors import InvalidRequest

BodyT = TypeVar("BodyT", bound=BaseModel)
TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict"})


async def read_body(request: Request, model: type[BodyT]) -> BodyT:
    """The request's body as `model`; raises InvalidRequest naming the bad field."""
    raw = await request.body()
    if not raw:
        raise InvalidRequest("Field required")  # FastAPI's words for a missing body
    # Only a body declared JSON is parsed; any other (no content-type, a form) stays
    # bytes, which no model accepts ("... a valid dictionary ...").
    data = _json(raw) if _is_json(request.headers.get("content-type", "")) else raw
    try:
        return model.model_validate(data, from_attributes=True)
    except ValidationError as exc:
        raise _invalid(exc.errors(include_url=False)[0]) from None


def _is_json(content_type: str) -> bool:
    """`application/json`, or a `+json` type, with or without parameters."""
    maintype, _, subtype = content_type.partition(";")[0].strip().lower().partition("/")
    return maintype == "application" and (subtype == "json" or subtype.endswith("+json"))


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc.msg}") from None
    except UnicodeDecodeError as exc:  # bytes that are no UTF-8, -16 or -32 text
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # json's decoder nests one Python call per level
        raise InvalidRequest("the request body is JSON nested too deeply to read") from None


def _invalid(error: ErrorDetails) -> InvalidRequest:
    param = _param([part for part in error["loc"] if not _is_type_tag(part)])
    message = f"{param}: {error['msg']}" if param else error["msg"]
    return InvalidRequest(message, param)


def _param(loc: Sequence[int | str]) -> str | None:
    """A location as the client wrote it: `messages[0].content`."""
    path = ""
    for part in map(str, loc):
        path += f"[{part}]" if part.isdigit() else (f".{part}" if path else part)
    return path or None


def _is_type_tag(part: int | str) -> bool:
    """Pydantic puts union members' type names (`str`, `list[int]`) in error locations."""
    return isinstance(part, str) and (part in TYPE_TAGS or not part.isidentifier())
