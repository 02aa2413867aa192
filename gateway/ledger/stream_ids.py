"""Redis stream entry ids (`<ms>-<seq>`) as ordered pairs: the ledger's events carry
their write time in them, and the archive names its files by them."""

from __future__ import annotations

StreamId = tuple[int, int]


def parse_id(text: str) -> StreamId:
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(sid: StreamId) -> str:
    return f"{sid[0]}-{sid[1]}"
