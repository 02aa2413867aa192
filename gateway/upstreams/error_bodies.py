"""What an upstream's error body says, as one short line, whatever its form:

    OpenAI's             {"error": {"message": "...", "type": "...", "code": "..."}}
    vLLM's older, flat   {"object": "error", "message": "...", "type": "BadRequestError"}
    FastAPI's            {"detail": [{"loc": ["body", "messages"], "msg": "..."}]} (its 422),
                         {"detail": "Not Found"}
    other JSON           {"error": "..."}, {"message": "..."}, "..."
    an HTML page         a proxy's or load balancer's: its <title> only
    plain text           its text

    error_message(b'{"detail": [{"loc": ["body", "n"], "msg": "bad"}]}')  # 'body.n: bad'

`error_message` never raises, whatever the bytes, and its line is at most
`MAX_MESSAGE_CHARS` long: it becomes part of the message the client gets.
"""

from __future__ import annotations

import html
from typing import Any

import orjson

MAX_MESSAGE_CHARS = 300
MAX_DETAILS = 5  # of a FastAPI detail list, the entries spelled out
# Only the start of a body is read for text: a message is cut to MAX_MESSAGE_CHARS anyway.
TEXT_PREFIX_BYTES = 4 * MAX_MESSAGE_CHARS
HTML_PREFIX_BYTES = 16_384  # where a page's <title> is looked for
HTML_TAGS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<title")


def error_message(content: bytes) -> str | None:
    """The message of an upstream's error body, on one line; None when it has none."""
    try:
        parsed = orjson.loads(content)
    except orjson.JSONDecodeError:
        if is_html(content):
            return html_note(content)
        return one_line(content[:TEXT_PREFIX_BYTES].decode("utf-8", "replace"))
    return one_line(json_message(parsed) or "")


def json_message(parsed: Any) -> str | None:
    """The message of a parsed error body, in the forms the module docstring lists."""
    if isinstance(parsed, str):
        return parsed
    if not isinstance(parsed, dict):
        return None
    error = parsed.get("error")
    if isinstance(error, dict):
        return said(error.get("message") or error)
    if error:
        return said(error)
    if parsed.get("message"):  # vLLM's flat form, and others'
        return said(parsed["message"])
    if parsed.get("detail"):
        return detail_message(parsed["detail"])
    return None


def detail_message(detail: Any) -> str:
    """FastAPI's `detail`: a string, or its validation errors as `loc: msg`, joined."""
    if not isinstance(detail, list):
        return said(detail)
    shown = [_validation_error(item) for item in detail[:MAX_DETAILS]]
    more = len(detail) - len(shown)
    return "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")


def _validation_error(item: Any) -> str:
    if not isinstance(item, dict):
        return said(item)
    msg = said(item.get("msg") or item.get("message") or "invalid")
    loc = item.get("loc")
    if not isinstance(loc, list) or not loc:
        return msg
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{said(p)}" for p in loc).lstrip(".")
    return f"{path}: {msg}"


def said(value: Any) -> str:
    """A value as a message: a string as it is, anything else as (the start of) its JSON."""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value)[:TEXT_PREFIX_BYTES].decode("utf-8", "replace")
    except orjson.JSONEncodeError:  # nested past what orjson writes
        return f"a JSON {type(value).__name__}"


def is_html(content: bytes) -> bool:
    """Does `content` read as an HTML page (markup first, one of its tags early on)?"""
    head = content[:1024].lstrip().lower()
    return head.startswith(b"<") and any(tag in head for tag in HTML_TAGS)


def html_note(content: bytes) -> str:
    """An HTML page (a proxy's error page, say) by its title, never its markup. Found
    with `find`, not a regex: linear whatever the page holds."""
    page = content[:HTML_PREFIX_BYTES].lower()
    start = page.find(b"<title")
    opened = page.find(b">", start) + 1 if start >= 0 else 0
    end = page.find(b"</title", opened) if opened else -1
    title = None
    if end >= 0:
        title = html.unescape(content[opened:end].decode("utf-8", "replace"))
        title = one_line(title, MAX_MESSAGE_CHARS - len("an HTML page ()"))
    return f"an HTML page ({title})" if title else "an HTML page"


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str | None:
    """`text` on one line (control characters as spaces, runs of space as one), cut to
    `limit` characters; None when nothing is left."""
    text = text[: 4 * limit]
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text or None
