"""The YAML limits: no policy file can stall or exhaust the process that reads it.

`policy check`, `serve` and hot reload share one loader, so each limit is tested
through it, and `policy check` once end to end. A bomb is loaded in a child process
under a memory limit, so that a regression fails in seconds instead of swapping the
machine to a halt. The reload tests prove that parsing happens off the event loop: a
heartbeat keeps ticking while a deliberately slow parse runs.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import shutil
import string
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from gateway.settings import Settings
from policies import LoadedPolicy, PolicyError, PolicyReloader, load_policy
from policies import reloader as reloader_module
from policies.document import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NODES,
    MAX_TOTAL_BYTES,
    parse_document,
)
from policies.errors import Problem
from policies.loader import read_sources
from tests.gateway.server import GatewayServer

T = TypeVar("T")

EXE = shutil.which("cascade-gateway") or str(Path(sys.executable).parent / "cascade-gateway")
CHILD_MEMORY = 1 << 30  # address space a child parsing a bomb may use
ADMIN_KEY = "fake-admin-key"
TOO_MANY_NODES = f"the policy expands to more than {MAX_NODES} values and keys"
TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep"

POLICY = """\
deployments:
  a:
    model: m1
    api_base: http://127.0.0.1:9/v1
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  auto:
    deployments: [a]
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
"""


def laughs(levels: int = 10, width: int = 9, kind: str = "list") -> str:
    """A "billion laughs": each anchor holds `width` aliases of the one before it, so
    the last stands for width**levels values."""
    names = [string.ascii_lowercase[n] if n < 26 else f"z{n}" for n in range(levels)]
    rows = [f"{names[0]}: &{names[0]} [" + ",".join(["lol"] * width) + "]"]
    for before, name in itertools.pairwise(names):
        aliases = [f"*{before}"] * width
        if kind == "list":
            body = "[" + ",".join(aliases) + "]"
        elif kind == "mapping":
            body = "{" + ",".join(f"k{n}: {alias}" for n, alias in enumerate(aliases)) + "}"
        else:  # merge keys: a mapping that inherits the one before, `width` times over
            body = "{<<: [" + ",".join(aliases) + "], own: 1}"
        rows.append(f"{name}: &{name} {body}")
    if kind == "merge":  # a merge needs mappings all the way down
        rows[0] = f"{names[0]}: &{names[0]} {{lol: 1}}"
    return "\n".join(rows) + "\n"


# The report's 366 bytes: nine aliases of nine aliases ... ten deep, 9**10 values.
BOMB = "# bomb\n" + laughs()


def write(directory: Path, text: str, name: str = "policy.yaml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


def only_problem(text: str, file: Path = Path("policy.yaml")) -> Problem:
    with pytest.raises(PolicyError) as caught:
        parse_document(file, text.encode())
    [problem] = caught.value.problems
    return problem


CHILD = f"""
import asyncio, resource, sys, time
from pathlib import Path
from policies import PolicyError, PolicyReloader, load_policy
mode, path = sys.argv[1], Path(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, ({CHILD_MEMORY}, {CHILD_MEMORY}))
start = time.perf_counter()
if mode == "reload":
    reloader = PolicyReloader(path, lambda _: None, env={{}}, settle_s=0)  # time the parse
    asyncio.run(reloader.check_now())
    error = str(reloader.last_error)
else:
    try:
        load_policy(path, env={{}})
        error = "loaded"
    except PolicyError as exc:
        error = str(exc)
print(time.perf_counter() - start)
print(error)
"""


def load_in_child(path: Path, mode: str = "load") -> tuple[float, str]:
    """Load `path` in a child process with limited memory (`mode` "reload": through the
    reloader's periodic check): the seconds the load took, and its error."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seconds, _, error = done.stdout.partition("\n")
    return float(seconds), error.strip()


# A wrapper that runs the real console script under the same memory limit.
LIMITED = f"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({2 * CHILD_MEMORY}, {2 * CHILD_MEMORY}))
os.execv(sys.argv[1], sys.argv[1:])
"""


def policy_check(path: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", LIMITED, EXE, "policy", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return time.perf_counter() - start, done


def test_the_billion_laughs_of_the_report_is_refused_in_under_a_second(tmp_path: Path) -> None:
    assert len(BOMB.encode()) == 366
    path = write(tmp_path, BOMB)
    seconds, error = load_in_child(path)
    assert re.fullmatch(rf"{re.escape(str(path))}:\d+:\d+: [\w.]+: {TOO_MANY_NODES}; .*", error)
    assert seconds < 1.0


def test_policy_check_refuses_the_billion_laughs_in_under_a_second(tmp_path: Path) -> None:
    startup, _ = policy_check(write(tmp_path, "[", "broken.yaml"))  # the command's own cost
    path = write(tmp_path, BOMB)
    seconds, done = policy_check(path)
    assert done.returncode == 1, done.stderr
    assert re.match(rf"{re.escape(str(path))}:\d+:\d+: [\w.]+: {TOO_MANY_NODES}", done.stderr)
    assert seconds - startup < 1.0


@pytest.mark.parametrize(
    "text",
    [
        laughs(levels=10, width=9, kind="mapping"),
        laughs(levels=10, width=9, kind="merge"),
        laughs(levels=40, width=2),  # narrow and deep: 2**40, within the alias limit
        laughs(levels=4, width=MAX_ALIASES // 3),  # 33**4, all the aliases allowed
    ],
    ids=["mapping", "merge-keys", "narrow", "wide"],
)
def test_other_alias_bombs_are_refused_in_under_a_second(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    seconds, error = load_in_child(path)
    assert f"{path}:" in error
    assert TOO_MANY_NODES in error or "aliases" in error, error
    assert seconds < 1.0


def test_hot_reload_rejects_the_billion_laughs_in_under_a_second(tmp_path: Path) -> None:
    path = write(tmp_path, POLICY + BOMB)
    seconds, error = load_in_child(path, mode="reload")
    assert re.match(rf"{re.escape(str(path))}:\d+:\d+: [\w.]+: {TOO_MANY_NODES}", error)
    assert seconds < 1.0


# Nesting, aliases and nodes --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ("a: " + "[" * 10_000, 4 + MAX_DEPTH - 1),
        ("a: " + "[" * 10_000 + "]" * 10_000, 4 + MAX_DEPTH - 1),
        ("a: " + "{a: " * 5_000, 4 + 4 * (MAX_DEPTH - 1)),
        ("a:\n" + "".join(" " * n + "- \n" for n in range(1, 200)), None),
        ("- " * 5_000 + "x", 1 + 2 * MAX_DEPTH),
    ],
    ids=["flow-lists", "closed-flow-lists", "flow-mappings", "block-lists", "dash-lists"],
)
def test_deep_nesting_is_a_located_policy_error(text: str, column: int | None) -> None:
    """The composer recursed once a level: ten thousand `[` were a RecursionError."""
    problem = only_problem(text)
    assert TOO_DEEP in problem.message
    assert problem.line is not None
    if column is not None:
        assert (problem.line, problem.column) == (1, column)


def test_nesting_up_to_the_limit_is_allowed() -> None:
    levels = MAX_DEPTH - 1  # below the top-level mapping
    document = parse_document(Path("p.yaml"), ("a: " + "[" * levels + "]" * levels).encode())
    assert "a" in document.data


def test_aliases_cannot_nest_past_the_depth_limit() -> None:
    """Each anchor is shallow enough, but an alias puts one inside the other."""
    half = MAX_DEPTH - 10
    text = f"a: &a {'[' * half}x{']' * half}\nb: &b {'[' * half}*a{']' * half}\n"
    problem = only_problem(text)
    assert f"{TOO_DEEP}; at most {MAX_DEPTH} levels are allowed" in problem.message
    assert "counting what aliases name" in problem.message
    assert problem.field.startswith("b.0.0.")
    assert problem.line == 1  # where the list nested too deep was written


def test_more_than_the_alias_limit_is_refused_at_the_first_alias_past_it() -> None:
    rows = ["x: &x 1", *(f"k{n}: *x" for n in range(MAX_ALIASES + 1))]
    problem = only_problem("\n".join(rows))
    assert str(problem) == (
        f"policy.yaml:{MAX_ALIASES + 2}:{rows[-1].index('*') + 1}: more than {MAX_ALIASES} "
        f"aliases (*name) in one file; at most {MAX_ALIASES} are allowed"
    )
    assert len(parse_document(Path("p.yaml"), "\n".join(rows[:-1]).encode()).data) == 101


def test_the_node_limit_spans_the_files_of_a_directory(tmp_path: Path) -> None:
    """Two files of 60,000 values each: the second passes the limit while composing."""
    items = ",".join(["0"] * 60_000)
    write(tmp_path, f"one: [{items}]\n", "1.yaml")
    second = write(tmp_path, f"two: [{items}]\n", "2.yaml")
    with pytest.raises(PolicyError) as caught:
        load_policy(tmp_path, env={})
    [problem] = caught.value.problems
    assert (problem.file, problem.line) == (second, 1)
    assert problem.message.startswith(TOO_MANY_NODES)


# Sizes ----------------------------------------------------------------------------


def test_a_file_over_the_size_limit_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    with path.open("wb") as stream:
        stream.truncate(64 << 20)  # sparse: 64 MiB of NULs
    [(_, raw)] = read_sources(path)
    assert len(raw) == MAX_FILE_BYTES + 1
    with pytest.raises(PolicyError) as caught:
        load_policy(path, env={})
    assert str(caught.value) == (
        f"{path}: the file is larger than 1 MiB; a policy file may have at most "
        f"{MAX_FILE_BYTES} bytes"
    )


def test_a_directory_is_bounded_in_total(tmp_path: Path) -> None:
    comment = "# " + "x" * (MAX_FILE_BYTES - 3) + "\n"  # each file just under its limit
    files = [write(tmp_path, comment, f"{n}.yaml") for n in range(5)]
    with pytest.raises(PolicyError) as caught:
        load_policy(tmp_path, env={})
    assert str(caught.value) == (
        f"{files[4]}: with this file the policy's files are larger than 4 MiB; together "
        f"they may have at most {MAX_TOTAL_BYTES} bytes"
    )


# Values PyYAML cannot build --------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2020-13-45", "'2020-13-45' is not a valid timestamp (month must be in 1..12)"),
        ("!!int x", "'x' is not a valid int (invalid literal for int() with base 10: 'x')"),
        ("!!float x", "'x' is not a valid float"),
        ("!!bool x", "'x' is not a valid bool"),
        ("!!timestamp 20", "'20' is not a valid timestamp"),
        ("9" * 5_000, "an integer of 5000 characters; at most 100 are allowed"),
        ("1" + ":0" * 50_000, "an integer of 100001 characters; at most 100 are allowed"),
    ],
    ids=["date", "int", "float", "bool", "timestamp", "long-int", "base-60"],
)
def test_a_scalar_pyyaml_cannot_build_is_located(value: str, message: str) -> None:
    """PyYAML raised ValueError, KeyError or AttributeError for these: a crash."""
    problem = only_problem(f"a: 1\nb: {value}\n")
    assert (problem.line, problem.column, problem.field) == (2, 4, "b")
    assert problem.message.startswith(message)


def test_a_bad_scalar_is_reported_at_each_alias_of_it() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_document(Path("p.yaml"), b"a: &d 2020-13-45\nb: *d\n")
    assert [(p.field, p.line) for p in caught.value.problems] == [("a", 1), ("b", 1)]


def test_a_control_character_is_located() -> None:
    problem = only_problem("a: 1\nb: \u00e9\x07\n")
    assert str(problem) == (
        "policy.yaml:2:5: YAML does not allow the character U+0007 (special characters "
        "are not allowed)"
    )


# Work that grew with the square of the problems ------------------------------------


def test_many_problems_are_collected_in_linear_time(tmp_path: Path) -> None:
    """Each problem was compared with every one before it: 8,000 took minutes."""
    rows = "".join(f"  d{n}: {{model: m, bogus: 1}}\n" for n in range(8_000))
    path = write(tmp_path, "deployments:\n" + rows)
    start = time.perf_counter()
    with pytest.raises(PolicyError) as caught:
        load_policy(path, env={})
    assert len(caught.value.problems) >= 8_000
    assert time.perf_counter() - start < 15


def test_merging_many_names_takes_linear_time(tmp_path: Path) -> None:
    """Each merged name copied its marks by a scan of all the file's marks."""
    for part in range(2):
        rows = "".join(f"  d{part}_{n}: {{}}\n" for n in range(10_000))
        write(tmp_path, "deployments:\n" + rows, f"{part}.yaml")
    start = time.perf_counter()
    with pytest.raises(PolicyError):
        load_policy(tmp_path, env={})
    assert time.perf_counter() - start < 15


# Reload parses off the event loop ----------------------------------------------------


def slow_parse(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Make the reloader's parse block its thread for `seconds` first."""
    real = reloader_module.load_sources

    def slow(
        sources: list[tuple[Path, bytes]], env: Mapping[str, str], **checks: Any
    ) -> LoadedPolicy:
        time.sleep(seconds)
        return real(sources, env, **checks)

    monkeypatch.setattr(reloader_module, "load_sources", slow)


async def longest_stall(work: Awaitable[T]) -> tuple[T, float]:
    """Await `work` while a heartbeat ticks every 10 ms; the longest gap between ticks."""
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            gaps.append(time.perf_counter() - last)
            last += gaps[-1]

    beat = asyncio.create_task(heartbeat())
    try:
        result = await work
    finally:
        beat.cancel()
    return result, max(gaps)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", ADMIN_KEY)
    return write(tmp_path, POLICY)


async def test_reload_now_parses_off_the_event_loop(
    served: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(served, applied.append)
    slow_parse(monkeypatch, 0.5)
    loaded, stall = await longest_stall(reloader.reload_now())
    assert applied == [loaded]
    assert stall < 0.25


async def test_the_periodic_check_parses_off_the_event_loop(
    served: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(served, applied.append)
    slow_parse(monkeypatch, 0.5)
    changed, stall = await longest_stall(reloader.check_now())
    assert changed and len(applied) == 1
    assert stall < 0.25


def test_admin_reload_keeps_serving_while_it_parses(
    served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(policy=served, redis_url=None, spool_path=tmp_path / "ledger.spool")
    with GatewayServer(settings) as server:
        slow_parse(monkeypatch, 1.0)
        replies: list[httpx.Response] = []
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        reload = threading.Thread(
            target=lambda: replies.append(
                httpx.post(f"{server.url}/admin/reload", headers=headers, timeout=30)
            )
        )
        reload.start()
        latencies: list[float] = []
        while reload.is_alive():
            start = time.perf_counter()
            assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.02)
        reload.join()
    assert replies[0].status_code == 200, replies[0].text
    assert len(latencies) > 5 and max(latencies) < 0.5
