"""A byte-level BPE tokenizer stored as JSON, with the chat template it was trained for.

Ids 0..255 are the bytes, then one id per merge, then the special tokens. Text is first
split into chunks (words with their leading space, single digits, punctuation runs,
whitespace), and merges apply within a chunk, lowest rank first, as GPT-2's BPE does.

    tokenizer = Tokenizer.load(Path("local_engine/models/tiny-target/tokenizer.json"))
    ids = tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": "Hi"}]))
"""

from __future__ import annotations

import codecs
import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from local_engine.cpu.errors import CheckpointError

TOKENIZER_FILE = "tokenizer.json"
CHUNK = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
BOS, END = "<|bos|>", "<|end|>"
ROLES = ("system", "user", "assistant")
SPECIAL_TOKENS = (BOS, END, *(f"<|{role}|>" for role in ROLES))


@dataclass
class Tokenizer:
    """Byte-level BPE: `merges[i]` joins two ids into id 256 + i."""

    merges: list[tuple[int, int]]
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS
    _ranks: dict[tuple[int, int], int] = field(init=False, repr=False)
    _cache: dict[str, list[int]] = field(init=False, repr=False, default_factory=dict)
    _pieces: list[bytes] = field(init=False, repr=False)
    _special: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self._pieces = [bytes([b]) for b in range(256)]
        for left, right in self.merges:
            self._pieces.append(self._pieces[left] + self._pieces[right])
        self._special = re.compile("|".join(re.escape(token) for token in self.special_tokens))

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.merges) + len(self.special_tokens)

    def special_id(self, token: str) -> int:
        return 256 + len(self.merges) + self.special_tokens.index(token)

    @property
    def bos_id(self) -> int:
        return self.special_id(BOS)

    @property
    def eos_id(self) -> int:
        return self.special_id(END)

    def encode(self, text: str) -> list[int]:
        """Ids for `text`; special token strings in it become their ids."""
        ids: list[int] = []
        start = 0
        for match in self._special.finditer(text):
            ids.extend(self._encode_plain(text[start : match.start()]))
            ids.append(self.special_id(match.group()))
            start = match.end()
        ids.extend(self._encode_plain(text[start:]))
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = True) -> bytes:
        parts: list[bytes] = []
        for token in ids:
            if token < len(self._pieces):
                parts.append(self._pieces[token])
            elif not skip_special:
                parts.append(self.special_tokens[token - len(self._pieces)].encode())
        return b"".join(parts)

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The chat template: `<|bos|>` then `<|role|>content<|end|>` per message, then
        `<|assistant|>` to prompt the reply (which the model ends with `<|end|>`)."""
        turns = "".join(f"<|{m['role']}|>{m['content']}{END}" for m in messages)
        return f"{BOS}{turns}<|assistant|>"

    def _encode_plain(self, text: str) -> list[int]:
        ids: list[int] = []
        for chunk in CHUNK.findall(text):
            cached = self._cache.get(chunk)
            if cached is None:
                cached = self._merge(list(chunk.encode()))
                if len(self._cache) < 100_000:
                    self._cache[chunk] = cached
            ids.extend(cached)
        return ids

    def _merge(self, ids: list[int]) -> list[int]:
        while len(ids) > 1:
            pairs = [
                (self._ranks.get(pair, -1), i) for i, pair in enumerate(itertools.pairwise(ids))
            ]
            ranked = [(rank, i) for rank, i in pairs if rank >= 0]
            if not ranked:
                break
            rank, _ = min(ranked)
            pair = self.merges[rank]
            merged: list[int] = []
            i = 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
                    merged.append(256 + rank)
                    i += 2
                else:
                    merged.append(ids[i])
                    i += 1
            ids = merged
        return ids

    def save(self, path: Path) -> None:
        data = {
            "type": "byte-bpe",
            "merges": [list(pair) for pair in self.merges],
            "special_tokens": list(self.special_tokens),
            "chunk_pattern": CHUNK.pattern,
        }
        path.write_text(json.dumps(data, separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: Path) -> Tokenizer:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise CheckpointError(f"{path} does not exist; the model needs its tokenizer") from exc
        if data.get("type") != "byte-bpe":
            raise CheckpointError(f"{path} has type {data.get('type')!r}; expected 'byte-bpe'")
        merges = [(int(a), int(b)) for a, b in data["merges"]]
        return cls(merges=merges, special_tokens=tuple(data["special_tokens"]))

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> Tokenizer:
        """Learn `vocab_size - 256 - len(SPECIAL_TOKENS)` merges from `texts`; deterministic."""
        words = Counter(chunk for text in texts for chunk in CHUNK.findall(text))
        return cls(merges=_learn_merges(words, vocab_size - 256 - len(SPECIAL_TOKENS)))


class Detokenizer:
    """Ids in, text out as soon as it is whole UTF-8 (a character may span tokens)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, ids: Iterable[int]) -> str:
        return self._decoder.decode(self.tokenizer.decode_bytes(ids))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


def _learn_merges(words: Mapping[str, int], count: int) -> list[tuple[int, int]]:
    """Greedy BPE: merge the most frequent pair (ties: smallest pair), update counts in place."""
    seqs = [list(word.encode()) for word in words]
    freqs = list(words.values())
    pair_counts: Counter[tuple[int, int]] = Counter()
    where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
    for index, seq in enumerate(seqs):
        for pair in itertools.pairwise(seq):
            pair_counts[pair] += freqs[index]
            where[pair].add(index)
    merges: list[tuple[int, int]] = []
    for _ in range(count):
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        new_id = 256 + len(merges)
        merges.append(best)
        for index in sorted(where.pop(best, set())):
            seq, freq = seqs[index], freqs[index]
            for pair in itertools.pairwise(seq):
                pair_counts[pair] -= freq
                if pair_counts[pair] <= 0:
                    del pair_counts[pair]
            seqs[index] = seq = _apply(seq, best, new_id)
            for pair in itertools.pairwise(seq):
                pair_counts[pair] += freq
                where[pair].add(index)
    return merges


def _apply(seq: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out: list[int] = []
    i = 0
    while i < len(seq):
        if i + 1 < len(seq) and (seq[i], seq[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return out
