"""`router calibrate-verify` on tied scores, `messages` rows (exactly those the gateway's
request validation takes, scored as their text), too-long integers and output that cannot
be written: what each command prints and its exit status."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import subprocess
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.http import validation
from router import cli
from router.cli import LedgerScores, add_router_commands
from router.verifier import Verifier

ROOT = Path(__file__).resolve().parents[2]
TIED = {"a": 0.011, "b": 0.011, "c": 0.998}  # response -> its verifier score
SCORE_ROWS = [
    {"id": 1, "prompt": "What is 2+2?"},
    {"id": 2, "messages": [{"role": "user", "content": "Prove that sqrt(2) is irrational."}]},
]


def write_rows(path: Path, rows: Sequence[object]) -> Path:
    """`rows` as JSONL (a string row as written)."""
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def run(argv: list[str], ledger_scores: LedgerScores | None = None) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of `cascade-gateway router ...`."""
    parser = argparse.ArgumentParser(prog="cascade-gateway")
    add_router_commands(parser.add_subparsers(dest="command", required=True), ledger_scores)
    args = parser.parse_args(["router", *argv])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status: int = args.func(args)
    return status, out.getvalue(), err.getvalue()


def ledger(scores: list[float]) -> LedgerScores:
    return lambda route, last, field: scores


def escalates(score: float, threshold: float) -> bool:
    """As the gateway's cascade decides (gateway/pipeline/cascade.py): accepted at or
    above the threshold."""
    return not score >= threshold


def printed(stdout: str) -> tuple[float, str]:
    """The threshold as a policy reads the line (YAML), and the share its comment gives."""
    threshold = yaml.safe_load(stdout)["verify_threshold"]
    assert isinstance(threshold, float)
    return threshold, stdout.split("# escalates ")[1].split(" of ")[0]


@pytest.mark.parametrize("escalate", ["0.5", "0.4"])
def test_tied_scores_get_the_nearest_share_they_allow_from_a_file_and_the_ledger(
    escalate: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two answers tie at 0.011: 66.7% (above the tie) is nearer 50% or 40% than 0%."""
    monkeypatch.setattr(Verifier, "score", lambda self, prompt, response, **kw: TIED[response])
    rows = [{"id": i, "prompt": "q", "response": r} for i, r in enumerate(TIED)]
    path = write_rows(tmp_path / "in.jsonl", rows)
    expected = "verify_threshold: 0.0111  # escalates 66.7% of 3 answers\n"
    warning = (
        f"warning: the nearest share to {float(escalate):.1%} that these 3 answers allow "
        "(2 distinct scores) is 66.7%\n"
    )
    from_file = run(["calibrate-verify", str(path), "--escalate", escalate])
    from_ledger = run(
        ["calibrate-verify", "--from-ledger", "careful", "--escalate", escalate],
        ledger(list(TIED.values())),
    )
    assert from_file == from_ledger == (0, expected, warning)


def test_no_warning_when_the_sample_gives_the_share_asked() -> None:
    status, out, err = run(
        ["calibrate-verify", "--from-ledger", "r", "--escalate", "0.5"],
        ledger([0.011, 0.011, 0.998, 0.998]),
    )
    assert (status, out, err) == (
        0,
        "verify_threshold: 0.0111  # escalates 50.0% of 4 answers\n",
        "",
    )


def test_equally_near_shares_escalate_more() -> None:
    """25% lies as near 0% as 50%: the threshold escalating 50% is chosen."""
    status, out, _ = run(
        ["calibrate-verify", "--from-ledger", "r", "--escalate", "0.25"],
        ledger([0.3, 0.3, 0.7, 0.7]),
    )
    assert status == 0 and out == "verify_threshold: 0.3001  # escalates 50.0% of 4 answers\n"


def test_rounding_never_moves_an_answer_across_the_threshold() -> None:
    """Scores 0.00001 apart: 0.1235 would escalate both, so more digits are printed."""
    status, out, _ = run(
        ["calibrate-verify", "--from-ledger", "r", "--escalate", "0.5"],
        ledger([0.12341, 0.12342]),
    )
    assert status == 0 and printed(out) == (0.12342, "50.0%")


def test_scores_outside_zero_to_one_are_refused() -> None:
    for bad in (math.nan, 1.5, -0.1):
        status, out, err = run(
            ["calibrate-verify", "--from-ledger", "r", "--escalate", "0.5"], ledger([0.2, bad])
        )
        assert (status, out) == (1, "") and err.startswith("error: verifier scores are in [0, 1]")


POOL = [0.0, 0.011, 0.5, 0.5000001, 0.99999, 1.0]  # ties, near neighbours and the ends
scores = st.lists(st.sampled_from(POOL) | st.floats(0, 1), min_size=1, max_size=30)


@given(scores, st.floats(0, 1) | st.sampled_from([0.0, 0.25, 1 / 3, 0.5, 1.0]))
def test_the_printed_threshold_escalates_the_reported_share_nearest_the_target(
    sample: list[float], target: float
) -> None:
    """Read back as a policy reads it, the threshold escalates what the comment says, and
    no threshold in a policy's range [0, 1] escalates a share nearer the target (of two
    as near, it escalates the larger)."""
    status, out, err = run(
        ["calibrate-verify", "--from-ledger", "r", "--escalate", repr(target)], ledger(sample)
    )
    assert status == 0
    threshold, shown = printed(out)
    assert 0.0 <= threshold <= 1.0
    escalated = sum(escalates(score, threshold) for score in sample)
    assert shown == f"{escalated / len(sample):.1%}"
    assert (err == "") == (shown == f"{target:.1%}")
    candidates = {0.0, 1.0, *sample, *(math.nextafter(s, 2.0) for s in sample if s < 1.0)}
    reachable = {sum(escalates(score, t) for score in sample) for t in candidates}

    def distance(count: int) -> Fraction:
        return abs(Fraction(count, len(sample)) - Fraction(target))

    for count in reachable:
        assert distance(escalated) <= distance(count)
        if distance(escalated) == distance(count):
            assert escalated >= count


def test_calibrate_takes_percentages_as_the_docs_say() -> None:
    """`local=70,premium=30` is `local=0.7,premium=0.3` (shares are scaled to sum to 1)."""
    sample = ledger([i / 10 for i in range(10)])
    outputs = [
        run(["calibrate", "--from-ledger", "auto", "--shares", shares], sample)
        for shares in ("local=70,premium=30", "local=0.7,premium=0.3")
    ]
    assert outputs[0] == outputs[1] and outputs[0][0] == 0


def gateway_refusal(messages: Any) -> str | None:
    """The field the gateway's request validation names refusing a chat request with
    these messages (`param`), or None when it accepts them."""
    body = json.dumps({"model": "m", "messages": messages}).encode()
    try:
        validation.parse_body(body, "chat")
    except InvalidRequest as exc:
        assert exc.param is not None
        return exc.param
    return None


def test_the_router_takes_the_gateways_chat_roles() -> None:
    """router/cli.py keeps a copy of the gateway's roles (router/ cannot import it)."""
    assert cli.CHAT_ROLES == validation.CHAT_ROLES


Q = "Prove that sqrt(2) is irrational."
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
# Messages the gateway serves, each with the same messages as plain strings (the text
# the scorers read): a row of either scores the same. No content, null, an empty list
# and parts without text are no text.
ACCEPTED: dict[str, tuple[list[Any], list[Any]]] = {
    "text": ([{"role": "user", "content": Q}], [{"role": "user", "content": Q}]),
    "every role": (
        [{"role": r, "content": f"{r}: {Q}"} for r in sorted(validation.CHAT_ROLES)],
        [{"role": r, "content": f"{r}: {Q}"} for r in sorted(validation.CHAT_ROLES)],
    ),
    "null on system, user and tool": (
        [{"role": "system", "content": None}, {"role": "user", "content": Q},
         {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
         {"role": "tool", "tool_call_id": "c1", "content": None},
         {"role": "user", "content": None}],
        [{"role": "system", "content": ""}, {"role": "user", "content": Q},
         {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
         {"role": "tool", "tool_call_id": "c1", "content": ""},
         {"role": "user", "content": ""}],
    ),
    "an assistant's null beside audio": (
        [{"role": "user", "content": Q},
         {"role": "assistant", "content": None, "audio": {"id": "audio_1"}},
         {"role": "user", "content": "And sqrt(3)?"}],
        [{"role": "user", "content": Q},
         {"role": "assistant", "content": "", "audio": {"id": "audio_1"}},
         {"role": "user", "content": "And sqrt(3)?"}],
    ),
    "parts without type": (
        [{"role": "user", "content": [{"text": Q}]}], [{"role": "user", "content": Q}]
    ),
    "text and image parts": (
        [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            {"type": "text", "text": Q},
        ]}],
        [{"role": "user", "content": f"What is in this picture?\n{Q}"}],
    ),
    "an empty list": (
        [{"role": "system", "content": []}, {"role": "user", "content": Q}],
        [{"role": "system", "content": ""}, {"role": "user", "content": Q}],
    ),
    "a part without text": (
        [{"role": "user", "content": [{"type": "text"}, {"type": "input_audio"}]}],
        [{"role": "user", "content": ""}],
    ),
    "no content": ([{"role": "user"}], [{"role": "user", "content": ""}]),
}  # fmt: skip


@pytest.mark.parametrize("case", ACCEPTED)
@pytest.mark.parametrize("command", ["score", "predict"])
def test_what_the_gateway_takes_scores_as_its_text(case: str, command: str, tmp_path: Path) -> None:
    messages, as_text = ACCEPTED[case]
    assert gateway_refusal(messages) is None
    rows = [{"id": "given", "messages": messages}, {"id": "text", "messages": as_text}]
    status, out, err = run([command, str(write_rows(tmp_path / "in.jsonl", rows))])
    assert (status, err) == (0, "")
    given_row, text_row = (json.loads(line) for line in out.splitlines())
    assert (given_row.pop("id"), text_row.pop("id")) == ("given", "text")
    assert given_row == text_row


# Messages the gateway refuses: the router refuses them too, naming the same field.
REFUSED: list[Any] = [
    [{"role": "user", "content": 123}],
    [{"role": "user", "content": True}],
    [{"role": "user", "content": {"type": "text", "text": "hi"}}],
    [{"role": "user", "content": ["hi"]}],
    [{"role": "user", "content": [{"type": "text", "text": "hi"}, 5]}],
    [{"role": "assistant", "content": 0, "tool_calls": [TOOL_CALL]}],
    [{"role": "user", "content": "hi"}, "hi"],
    [{"role": "user", "content": "hi"}, None],
    [{"content": "hi"}],
    [{"role": None, "content": "hi"}],
    [{"role": ["user"], "content": "hi"}],
    [{"role": "bot", "content": "hi"}],
    [{"role": "User", "content": "hi"}],
    [],
    "hi",
    None,
    {"role": "user", "content": "hi"},
]


@pytest.mark.parametrize("messages", REFUSED)
@pytest.mark.parametrize("command", ["score", "predict"])
def test_what_the_gateway_refuses_is_an_error_naming_its_line_and_field(
    messages: Any, command: str, tmp_path: Path
) -> None:
    field = gateway_refusal(messages)
    assert field is not None
    path = write_rows(
        tmp_path / "in.jsonl", [{"id": 0, "prompt": "fine"}, {"id": 1, "messages": messages}]
    )
    status, out, err = run([command, str(path)])
    assert (status, out) == (1, "")
    assert err.startswith(f"error: {path}:2: '{field}' must be ")
    assert err.count("\n") == 1


# JSON values (integers within what the gateway reads exactly), and messages near and
# far from what the gateway takes: most lists hold objects with one of its roles.
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(validation.INT64_MIN, validation.INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
TEXT_PARTS = st.dictionaries(
    st.sampled_from(["type", "text", "image_url"]), st.none() | st.text(max_size=4), max_size=3
)
CONTENTS = st.one_of(
    st.none(),
    st.text(max_size=4),
    st.lists(TEXT_PARTS, max_size=3),
    JSON_SCALARS,
    st.lists(TEXT_PARTS | JSON_SCALARS, min_size=1, max_size=3),
    st.dictionaries(st.text(max_size=2), JSON_SCALARS, max_size=2),
)
GATEWAY_ROLES = st.sampled_from(sorted(validation.CHAT_ROLES))
ROLES = st.one_of(
    GATEWAY_ROLES,
    st.sampled_from(["bot", "User", ""]),
    JSON_SCALARS,
    st.lists(GATEWAY_ROLES, max_size=2),
)
EXTRA_FIELDS = {"tool_calls": st.just([TOOL_CALL]), "audio": st.just({"id": "audio_1"})}
WITH_ROLE = st.fixed_dictionaries(
    {"role": GATEWAY_ROLES}, optional={"content": CONTENTS, **EXTRA_FIELDS}
)
ANY_MESSAGE = st.one_of(
    st.fixed_dictionaries({}, optional={"role": ROLES, "content": CONTENTS, **EXTRA_FIELDS}),
    JSON_SCALARS,
    st.lists(JSON_SCALARS, max_size=2),
)
MESSAGES = st.one_of(
    st.lists(WITH_ROLE, min_size=1, max_size=3),
    st.tuples(st.lists(WITH_ROLE, max_size=2), ANY_MESSAGE, st.lists(WITH_ROLE, max_size=2)).map(
        lambda parts: [*parts[0], parts[1], *parts[2]]
    ),
    st.lists(ANY_MESSAGE, max_size=2),
    JSON_SCALARS,
    st.dictionaries(st.sampled_from(["role", "content"]), st.text(max_size=4)),
)


@given(MESSAGES)
def test_the_router_refuses_exactly_the_messages_the_gateway_refuses(messages: Any) -> None:
    """Any `messages`: a row is refused, naming the field, where the gateway's request
    validation refuses it and names that field; otherwise it is a request to score."""
    field = gateway_refusal(messages)
    try:
        request = cli._score_request({"id": 0, "messages": messages})
    except ValueError as exc:
        assert field is not None, f"the gateway takes it, the router does not: {exc}"
        assert str(exc).startswith(f"'{field}' must be ")
    else:
        assert field is None, f"the gateway refuses '{field}', the router does not"
        assert request["messages"] == messages


@pytest.mark.parametrize("max_tokens", [-5, 0])
def test_max_tokens_must_be_positive(max_tokens: int, tmp_path: Path) -> None:
    path = write_rows(tmp_path / "in.jsonl", [{"id": 1, "prompt": "x", "max_tokens": max_tokens}])
    status, out, err = run(["score", str(path)])
    assert (status, out) == (1, "")
    assert err == f"error: {path}:1: 'max_tokens' must be a positive integer, not {max_tokens}\n"


LONG = "1" * 5000  # beyond Python's 4300-digit limit on converting an integer


@pytest.mark.parametrize(
    ("command", "row", "field"),
    [
        ("score", f'{{"id": {LONG}, "prompt": "x"}}', "'id'"),
        ("verify", f'{{"id": -{LONG}, "prompt": "x", "response": "y"}}', "'id'"),
        ("score", f'{{"id": 1, "prompt": "x", "max_tokens": {LONG}}}', "'max_tokens'"),
        ("verify", f'{{"id": 1, "prompt": "x", "response": "y", "logprobs": [-1, -{LONG}]}}',
         "'logprobs[1]'"),
        ("score", f'{{"id": 1, "messages": [{{"role": "user", "content": [{LONG}]}}]}}',
         "'messages[0].content[0]'"),
        ("score", LONG, "the row"),
    ],
)  # fmt: skip
def test_an_integer_too_long_to_read_names_its_field(
    command: str, row: str, field: str, tmp_path: Path
) -> None:
    path = write_rows(tmp_path / "in.jsonl", [row])
    status, out, err = run([command, str(path)])
    assert (status, out) == (1, "")
    assert (
        err == f"error: {path}:1: {field} is an integer of 5,000 digits; at most 4,300 are read\n"
    )


def test_4300_digits_still_read(tmp_path: Path) -> None:
    path = write_rows(
        tmp_path / "in.jsonl", [f'{{"id": 1, "prompt": "x", "max_tokens": {"9" * 4300}}}']
    )
    status, _, err = run(["score", str(path)])
    assert (status, err) == (0, "")


def router_cli(path: Path, **streams: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "router.cli", "score", str(path)], cwd=ROOT, **streams
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_that_cannot_be_written_is_a_one_line_error(tmp_path: Path) -> None:
    """`router score IN > /dev/full`: why, on stderr, exit status 1; no traceback."""
    path = write_rows(tmp_path / "in.jsonl", SCORE_ROWS)
    with Path("/dev/full").open("wb") as full:
        child = router_cli(path, stdout=full, stderr=subprocess.PIPE)
        _, err = child.communicate()
    assert child.returncode == 1
    assert err == b"error: cannot write the output: No space left on device\n"


def test_a_reader_that_goes_after_a_line_ends_the_output_quietly(tmp_path: Path) -> None:
    """`router score IN | head -1` on more rows than a pipe holds: exit status 1, no
    traceback."""
    rows = [{"id": i, "prompt": f"What is {i} + {i}?"} for i in range(3000)]
    path = write_rows(tmp_path / "in.jsonl", rows)
    with router_cli(path, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        assert child.stdout is not None and child.stderr is not None
        assert json.loads(child.stdout.readline())["id"] == 0
        child.stdout.close()
        err = child.stderr.read()
    assert child.returncode == 1
    assert err == b""
