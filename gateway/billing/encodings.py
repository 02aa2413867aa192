"""tiktoken encodings, parsed once per machine.

tiktoken parses its BPE file (100,000 to 200,000 base64 lines) in Python each time a
process builds an encoding: ~0.4 s of a replica's start for cl100k_base. The parsed
ranks are kept in a plain binary file under the cache directory (no pickle: nothing
in it is ever run), so a restart builds the encoding from them in ~0.1 s.

    DIR/tiktoken-<tiktoken version>-<encoding>.ranks
        b"CGTK1\\n", a JSON line (pat_str, special tokens, count, SHA-256 of the rest),
        then each token's length (uint16, little-endian) in rank order, then the tokens

DIR is `CASCADE_CACHE_DIR`, else `$XDG_CACHE_HOME/cascade-gateway`, else
`~/.cache/cascade-gateway`. A file that does not read back exactly (truncated, edited,
another format) is ignored and written again; a directory that cannot be written means
no cache, and the encoding is built as tiktoken builds it.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import itertools
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import tiktoken

MAGIC = b"CGTK1\n"
log = logging.getLogger(__name__)


def cache_dir() -> Path:
    if configured := os.environ.get("CASCADE_CACHE_DIR"):
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cascade-gateway"


def load(name: str) -> tiktoken.Encoding:
    """The encoding `name`, from the cache when it holds it, else built and cached."""
    path = cache_dir() / f"tiktoken-{tiktoken.__version__}-{name}.ranks"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return tiktoken.Encoding(name=name, **_read(path))
    encoding = tiktoken.get_encoding(name)
    try:
        _write(path, encoding)
    except OSError as exc:  # a read-only home, say: no cache, nothing else changes
        log.debug("cannot cache the %s encoding in %s: %s", name, path.parent, exc)
    return encoding


def _read(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    if not data.startswith(MAGIC):
        raise ValueError("not a ranks file")
    header_end = data.index(b"\n", len(MAGIC))
    header = json.loads(data[len(MAGIC) : header_end])
    body = memoryview(data)[header_end + 1 :]
    if hashlib.sha256(body).hexdigest() != header["sha256"]:
        raise ValueError("checksum mismatch")
    count = int(header["count"])
    lengths = array.array("H")
    lengths.frombytes(body[: 2 * count])
    if sys.byteorder != "little":
        lengths.byteswap()
    tokens = bytes(body[2 * count :])
    ends = list(itertools.accumulate(lengths))
    if not ends or ends[-1] != len(tokens):
        raise ValueError("ranks do not add up")
    ranks = {
        tokens[end - length : end]: rank
        for rank, (end, length) in enumerate(zip(ends, lengths, strict=True))
    }
    if len(ranks) != count:
        raise ValueError("a token is there twice")
    special = {str(k): int(v) for k, v in header["special_tokens"].items()}
    return {"pat_str": header["pat_str"], "mergeable_ranks": ranks, "special_tokens": special}


def _write(path: Path, encoding: tiktoken.Encoding) -> None:
    ranks: dict[bytes, int] = encoding._mergeable_ranks
    tokens = sorted(ranks, key=ranks.__getitem__)
    if [ranks[t] for t in tokens] != list(range(len(tokens))) or max(map(len, tokens)) >= 2**16:
        return  # not a dense ranking of short tokens: this format cannot hold it
    lengths = array.array("H", map(len, tokens))
    if sys.byteorder != "little":
        lengths.byteswap()
    body = lengths.tobytes() + b"".join(tokens)
    header = {
        "pat_str": encoding._pat_str,
        "special_tokens": encoding._special_tokens,
        "count": len(tokens),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        temp.write_bytes(MAGIC + json.dumps(header).encode() + b"\n" + body)
        os.replace(temp, path)  # whole or not at all: readers never see half a file
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
