"""tiktoken encodings parsed once per machine (`gateway.billing.encodings`): the cached
ranks build the same encoding tiktoken builds, a damaged cache file is ignored and
written again, and a directory that cannot be written only means no cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiktoken

from gateway.billing import encodings
from gateway.billing.tokens import encoding_for

TEXT = "Héllo wörld: count me <|endoftext|> 12345 \u4f60\u597d"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CASCADE_CACHE_DIR", str(tmp_path))
    encoding_for("cl100k")  # TIKTOKEN_CACHE_DIR points at litellm's bundled files
    return tmp_path


def built_by_tiktoken(name: str) -> tiktoken.Encoding:
    return tiktoken.get_encoding(name)


def test_the_cached_ranks_build_the_same_encoding(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = encodings.load("cl100k_base")
    [path] = cache.glob("tiktoken-*-cl100k_base.ranks")

    def no_parsing(name: str) -> tiktoken.Encoding:
        raise AssertionError("tiktoken parsed its file again")

    monkeypatch.setattr(tiktoken, "get_encoding", no_parsing)
    cached = encodings.load("cl100k_base")
    monkeypatch.undo()
    reference = built_by_tiktoken("cl100k_base")
    assert cached._mergeable_ranks == reference._mergeable_ranks == first._mergeable_ranks
    assert cached._special_tokens == reference._special_tokens
    assert cached._pat_str == reference._pat_str
    assert cached.encode(TEXT, disallowed_special=()) == reference.encode(
        TEXT, disallowed_special=()
    )
    assert path.stat().st_size > 500_000


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_a_damaged_cache_file_is_ignored_and_written_again(cache: Path, damage: str) -> None:
    encodings.load("cl100k_base")
    [path] = cache.glob("tiktoken-*-cl100k_base.ranks")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-10] ^= 0xFF  # a token's byte: the checksum no longer matches
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray(b"not a ranks file at all")
    path.write_bytes(bytes(data))
    again = encodings.load("cl100k_base")
    assert again._mergeable_ranks == built_by_tiktoken("cl100k_base")._mergeable_ranks
    assert path.read_bytes() != bytes(data)  # rewritten whole
    assert list(cache.glob(".*.tmp")) == []


def test_an_unwritable_cache_directory_means_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("CASCADE_CACHE_DIR", str(blocker / "cache"))
    encoding_for("cl100k")
    assert encodings.load("cl100k_base").encode("hello") == [15339]
