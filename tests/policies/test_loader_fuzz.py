"""Property tests: no input makes the policy loader crash, hang or exhaust memory.

Whatever a policy's files hold, `load_sources` (the loader `policy check`, `serve` and
reload share) returns a policy or raises PolicyError with located problems; any other
exception is a crash. Each example runs under a CPU-time alarm and a tracemalloc bound
on its peak memory. Inputs: random bytes, YAML-ish token soup, documents built from the
policy's real sections and fields, alias bombs of random shapes, and deep nesting.

Two Hypothesis profiles: "fuzz-ci", the default (about 200 examples in all, seconds),
and "fuzz-long" (200 times as many, for a soak), chosen by CASCADE_FUZZ_LONG=1:

    CASCADE_FUZZ_LONG=1 pytest tests/policies/test_loader_fuzz.py

They are applied test by test, never loaded: Hypothesis' own "ci" profile is active
under CI, and re-registering or loading a profile would change every property test.
"""

from __future__ import annotations

import os
import signal
import tracemalloc
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from policies import PolicyError
from policies.document import MAX_ALIASES, MAX_DEPTH, MAX_NODES
from policies.loader import load_sources
from policies.schema import Policy

# Read at import: the autouse fixture clears CASCADE_* before each test runs.
LONG = os.environ.get("CASCADE_FUZZ_LONG") == "1"
settings.register_profile(
    "fuzz-ci",
    max_examples=100,  # for a whole share(1.0): about 200 examples in all
    derandomize=True,  # the same examples every run: CI fails on a change, not on luck
    database=None,
    deadline=timedelta(seconds=10),  # wall time, so generous; the CPU alarm is strict
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz-long",
    max_examples=20_000,
    database=None,
    deadline=timedelta(seconds=10),
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile("fuzz-long" if LONG else "fuzz-ci")

CPU_SECONDS = 5  # per example: the largest bomb is refused in well under one
PEAK_BYTES = 64 << 20  # per example; a refused bomb peaks near 25 MiB
ENV = {"X": "value-of-x", "EMPTY": ""}
FILES = (Path("fuzz/0.yaml"), Path("fuzz/1.yaml"))


def share(part: float) -> settings:
    """The profile with `part` of its examples (expensive tests run fewer)."""
    return settings(PROFILE, max_examples=max(1, int(PROFILE.max_examples * part)))


class Stalled(Exception):
    """An example spent more than CPU_SECONDS."""


@contextmanager
def bounded() -> Iterator[None]:
    """Interrupt the block after CPU_SECONDS of CPU; fail it if it peaked past PEAK_BYTES.

    A CPU-time alarm (SIGVTALRM) leaves pytest-timeout's SIGALRM alone, and unlike a
    Hypothesis deadline it interrupts a loop that never ends.
    """

    def expire(signum: int, frame: types.FrameType | None) -> None:
        raise Stalled(f"more than {CPU_SECONDS} s of CPU")

    previous = signal.signal(signal.SIGVTALRM, expire)
    signal.setitimer(signal.ITIMER_VIRTUAL, CPU_SECONDS)
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)
    assert peak < PEAK_BYTES, f"the load peaked at {peak >> 20} MiB"


def load(*files: bytes) -> PolicyError | None:
    """Load `files` as one policy's files: None if it is valid, else its PolicyError,
    whose problems name those files at real positions. Anything else propagates."""
    sources = list(zip(FILES, files, strict=False))
    with bounded():
        try:
            load_sources(sources, ENV)
        except PolicyError as exc:
            error = exc
        else:
            return None
    assert error.problems
    for problem in error.problems:
        assert problem.file in FILES, problem
        assert problem.line is None or problem.line >= 1, problem
        assert problem.column is None or problem.column >= 1, problem
    assert str(error)
    return error


# Random bytes and token soup --------------------------------------------------------

# Fragments of YAML syntax and of what PyYAML's resolvers and constructors treat
# specially: the soup is mostly near-YAML, which reaches further than random text.
TOKENS = [
    *"abkx01-_.:/ \n\t,[]{}&*!|>'\"#?%@`~$\\\x01",
    ": ", "- ", "? ", "\n  ", "\n    ", "&a ", "*a", "&b ", "*b", "<<: ", "<<: *a",
    "!!int ", "!!float ", "!!bool ", "!!null ", "!!str ", "!!binary ", "!!timestamp ",
    "!!set ", "!!omap ", "!!pairs ", "!!seq ", "!!map ", "!!python/object:os.system ",
    "!local ", "%YAML 1.1\n", "%TAG ! tag:x,2000:\n", "---\n", "...\n", "|\n  ", ">-\n  ",
    "${X}", "${EMPTY}", "${UNSET}", "${X:-d}", "$${", "${", "1:2:3", "2020-13-45",
    "2001-12-14t21:59:43.10-05:00", "0x1f", "0o17", "0b101", "1_000", ".inf", ".nan",
    "1e999", "~", "null", "yes", "No", "on", "=", "\u00e9", "\u2028", "\ufeff", "\x85",
    "deployments:", "routes:", "keys:", "budgets:", "gateway:", "engines:", "teams:",
    "model: m", "api_base: http://127.0.0.1:9/v1", "deployments: [a]", "secret: ${X}",
]  # fmt: skip


@share(0.4)
@given(st.binary(max_size=2_000))
def test_random_bytes(raw: bytes) -> None:
    load(raw)


@share(0.4)
@given(st.lists(st.sampled_from(TOKENS), max_size=80).map("".join))
def test_yaml_token_soup(text: str) -> None:
    load(text.encode())


@share(0.2)
@given(st.lists(st.text(max_size=200), min_size=1, max_size=2))
def test_random_text_files(texts: list[str]) -> None:
    load(*(text.encode("utf-8", "surrogatepass") for text in texts))


# Documents shaped like policies -----------------------------------------------------

NAMES = st.sampled_from(["a", "b", "cheap", "premium", "auto", "gpt-4o", "gpt-4o-mini", ""])
STRINGS = st.one_of(
    NAMES,
    st.sampled_from(["${X}", "${UNSET}", "${EMPTY}", "x${UNSET}y", "${X:-d}", "$${", "${"]),
    st.sampled_from(["http://127.0.0.1:9/v1", "https://api.openai.com/v1", "openai", "vllm"]),
    st.text(max_size=12),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(),
    STRINGS,
)
ANY = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=10,
)


def values_for(annotation: Any) -> st.SearchStrategy[Any]:
    """Values mostly of the annotated type (to get past the first check), sometimes not."""
    return st.one_of(_typed(annotation), ANY) if annotation is not Any else ANY


def _typed(annotation: Any) -> st.SearchStrategy[Any]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _typed(args[0])
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_typed(arg) for arg in args])
    if origin is list:
        return st.lists(values_for(args[0] if args else Any), max_size=3)
    if origin is dict:
        return st.dictionaries(NAMES, values_for(args[1] if args else Any), max_size=3)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return st.deferred(lambda: documents_of(annotation))
    simple = {type(None): st.none(), bool: st.booleans(), str: STRINGS}
    if annotation in (int, float):
        return st.integers(-5, 10**6) | st.floats(-1, 10**6)
    return simple.get(annotation, SCALARS)


def documents_of(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    """Mappings with some of `model`'s fields, and now and then a field it lacks."""
    fields = {name: values_for(info.annotation) for name, info in model.model_fields.items()}
    return st.fixed_dictionaries({}, optional={**fields, "bogus": ANY})


def dump(data: Any) -> bytes:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()


@share(0.6)
@given(documents_of(Policy), st.integers(0, 12))
def test_policy_shaped_documents(document: dict[str, Any], split: int) -> None:
    """Sections split between two files at `split` (0: one file), some in both."""
    sections = list(document.items())
    if not split:
        load(dump(document))
    else:
        load(dump(dict(sections[:split])), dump(dict(sections[split // 2 :])))


# Alias bombs and deep nesting -------------------------------------------------------

BOMB_KINDS = ("list", "mapping", "merge", "block-list", "block-mapping")


@dataclass(frozen=True)
class Bomb:
    """A file where each anchor holds `width` aliases of the one before it."""

    text: str
    kind: str
    aliases: int  # the uses of `*name` in the file
    leaves: int  # the values its last anchor stands for: width**levels


@st.composite
def bombs(draw: st.DrawFn) -> Bomb:
    levels, width = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    kind = draw(st.sampled_from(["list", "mapping", "merge", "block-list", "block-mapping"]))
    leaf = draw(st.sampled_from(["lol", "1", "${X}", "'x'", "{}", "[]"]))
    section = draw(st.sampled_from(["", "deployments", "routes", "keys", "gateway"]))
    if kind == "merge":  # `<<` merges mappings only
        first = "{" + ",".join(f"m{n}: {leaf}" for n in range(width)) + "}"
    else:
        first = "[" + ",".join([leaf] * width) + "]"
    rows = [f"n0: &n0 {first}"]
    for level in range(1, levels):
        alias = f"*n{level - 1}"
        bodies = {
            "list": "[" + ",".join([alias] * width) + "]",
            "mapping": "{" + ",".join(f"k{n}: {alias}" for n in range(width)) + "}",
            "merge": "{<<: [" + ",".join([alias] * width) + "], own: 1}",
            "block-list": "".join(f"\n  - {alias}" for _ in range(width)),
            "block-mapping": "".join(f"\n  k{n}: {alias}" for n in range(width)),
        }
        rows.append(f"n{level}: &n{level} {bodies[kind]}")
    if section:
        rows.append(f"{section}: *n{levels - 1}")
    text = "\n".join(rows) + "\n"
    return Bomb(text, kind, (levels - 1) * width + bool(section), width**levels)


@share(0.1)
@given(bombs())
def test_alias_bombs(bomb: Bomb) -> None:
    """What expands past the node limit is refused, whatever its shape."""
    error = load(bomb.text.encode())
    if bomb.aliases > MAX_ALIASES:
        assert error is not None
        assert f"more than {MAX_ALIASES} aliases" in str(error)
    elif bomb.leaves > MAX_NODES:
        assert error is not None
        assert f"more than {MAX_NODES} values and keys" in str(error)


STYLES = st.sampled_from(["list", "mapping"])


@st.composite
def nestings(draw: st.DrawFn) -> tuple[str, int, bool]:
    """Block levels, then flow levels on one line: the text, its depth (the top-level
    mapping included), and whether every bracket is closed."""
    block = [draw(STYLES) for _ in range(draw(st.integers(0, 2 * MAX_DEPTH)))]
    flow = [draw(STYLES) for _ in range(draw(st.integers(0, 3 * MAX_DEPTH)))]
    closed = draw(st.booleans())
    rows, indent = ["root:"], 2
    for style in block:
        rows.append(" " * indent + ("-" if style == "list" else "k:"))
        indent += 2
    opening = "".join("[" if style == "list" else "{k: " for style in flow)
    closing = "".join("]" if style == "list" else "}" for style in reversed(flow))
    rows.append(" " * indent + opening + "x" + (closing if closed else ""))
    return "\n".join(rows) + "\n", 1 + len(block) + len(flow), closed


@share(0.3)
@given(nestings())
def test_deep_nesting(nesting: tuple[str, int, bool]) -> None:
    text, depth, closed = nesting
    error = load(text.encode())
    if depth > MAX_DEPTH:
        assert error is not None
        assert f"nested more than {MAX_DEPTH} levels deep" in str(error)
    elif closed:  # within the limit and valid YAML: only the schema can object
        assert error is None or "levels deep" not in str(error)
