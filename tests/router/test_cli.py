from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from router import sandbox
from router.classifier import Classifier
from router.cli import add_router_commands
from router.embedding_classifier import shipped
from router.verifier import Verifier
from tests.support import requires


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cascade-gateway")
    add_router_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def write_rows(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_score_prints_one_line_per_row_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"id": "b", "prompt": "hi, what's the capital of France?"},
        {"id": 7, "messages": [{"role": "user", "content": "Prove that sqrt(2) is irrational."}]},
        {"id": "c", "prompt": "Write JSON.", "response_format": {"type": "json_object"}},
    ]
    assert run(["router", "score", str(write_rows(tmp_path / "in.jsonl", rows))]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["id"] for line in lines] == ["b", 7, "c"]
    assert all(set(line) == {"id", "score"} and 0 <= line["score"] <= 1 for line in lines)


def test_score_and_calibrate_take_the_routes_classifier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--classifier minilm` scores as a route with `classifier: minilm` does, so
    thresholds calibrated from a sample fit that route."""
    prompts = ["hi, what's the capital of France?", "Prove that sqrt(2) is irrational."]
    path = write_rows(
        tmp_path / "in.jsonl", [{"id": i, "prompt": p} for i, p in enumerate(prompts)]
    )
    assert run(["router", "score", str(path), "--classifier", "minilm"]) == 0
    scores = [json.loads(line)["score"] for line in capsys.readouterr().out.splitlines()]
    model = shipped()
    expected = [model.score([{"role": "user", "content": p}]) for p in prompts]
    assert scores == pytest.approx(expected, abs=1e-6)
    assert (
        run(["router", "calibrate", str(path), "--shares", "a=0.5,b=0.5", "--classifier", "minilm"])
        == 0
    )
    below = float(capsys.readouterr().out.split("below:")[1].split("}")[0])
    assert min(scores) <= below <= max(scores)


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        json.dumps({"prompt": "no id"}),
        json.dumps({"id": 1}),
        json.dumps({"id": 1, "messages": "not a list"}),
        json.dumps({"id": 1, "prompt": "x", "max_tokens": "lots"}),
    ],
)
def test_score_names_the_bad_line(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_rows(tmp_path / "in.jsonl", [{"id": 0, "prompt": "fine"}, "", bad])
    assert run(["router", "score", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{path}:3:" in captured.err


def test_score_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["router", "score", str(tmp_path / "absent.jsonl")]) == 1
    assert "absent.jsonl" in capsys.readouterr().err


@requires(sandbox.available(), "the sandbox")
def test_verify_run_code_tells_apart_answers_alike_to_the_eye(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`router verify --run-code`: the answer whose own example fails scores lower; without
    the flag (the contract's default) nothing is run and the two score alike."""
    prompt = "Write a python function to add two numbers."
    rows = [
        {"id": op, "prompt": prompt, "response": f"```python\ndef add(a, b):\n    return a {op} b"
         "\n\nprint(add(2, 3))  # Output: 5\n```"}
        for op in ("+", "-")
    ]  # fmt: skip
    path = write_rows(tmp_path / "in.jsonl", rows)

    def scores(*flags: str) -> dict[str, float]:
        assert run(["router", "verify", str(path), *flags]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        return {line["id"]: line["score"] for line in lines}

    plain, ran = scores(), scores("--run-code")
    assert abs(plain["+"] - plain["-"]) < 0.01
    assert ran["-"] < ran["+"] - 0.01


def out_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


SCORE_ROWS = [
    {"id": 1, "prompt": "line\u2028separator"},
    {"id": 2, "prompt": "para\u2029graph and next\u0085line"},
    {"id": 3, "messages": [{"role": "user", "content": "Prove that sqrt(2) is irrational."}]},
]
VERIFY_ROWS = [
    {"id": 1, "prompt": "What is 2+2?\u2028Answer briefly.", "response": "4\u2029That is all."},
    {"id": 2, "prompt": "Name a primary colour.", "response": "Red\u0085is one."},
]
COMMANDS = {
    "score": (SCORE_ROWS, []),
    "verify": (VERIFY_ROWS, []),
    "calibrate": (SCORE_ROWS, ["--shares", "local=0.5,premium=0.5"]),
    "calibrate-verify": (VERIFY_ROWS, ["--escalate", "0.5"]),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_bom_crlf_and_unicode_line_separators_read_as_plain_jsonl(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Windows tools write a BOM and CRLF; `json.dumps(ensure_ascii=False)` and JS write
    U+2028, U+2029 and U+0085 raw inside strings: the rows read as their escaped form."""
    rows, options = COMMANDS[command]
    plain = write_rows(tmp_path / "plain.jsonl", rows)
    text = "\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\r\n"
    odd = tmp_path / "odd.jsonl"
    odd.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert run(["router", command, str(plain), *options]) == 0
    expected = out_lines(capsys)
    assert run(["router", command, str(odd), *options]) == 0
    assert out_lines(capsys) == expected
    if command in ("score", "verify"):
        assert [json.loads(line)["id"] for line in expected] == [r["id"] for r in rows]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_dash_reads_the_rows_from_stdin(
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows, options = COMMANDS[command]
    path = write_rows(tmp_path / "in.jsonl", rows)
    assert run(["router", command, str(path), *options]) == 0
    expected = out_lines(capsys)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    assert run(["router", command, "-", *options]) == 0
    assert out_lines(capsys) == expected


def test_a_bad_row_on_stdin_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"id": 1, "prompt": "a"}\n{')))
    assert run(["router", "score", "-"]) == 1
    assert capsys.readouterr().err.startswith("error: <stdin>:2: ")


def test_a_file_not_in_utf8_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": 1, "prompt": "fine"}\n\n{"id": 2, "prompt": "caf\xe9"}\n')
    assert run(["router", "score", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"error: {path}:3: not UTF-8: byte 0xe9 at byte 25 ")


@pytest.mark.parametrize(
    "bad",
    [
        '{"id": 1, "prompt": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"id": NaN, "prompt": "x"}',
        '{"id": 1e400, "prompt": "x"}',
        '{"id": [1, -Infinity], "prompt": "x"}',
    ],
)
@pytest.mark.parametrize("command", ["score", "verify"])
def test_rows_that_cannot_be_read_or_echoed_name_their_line(
    bad: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row nested too deeply to parse, and an id JSON cannot write (NaN, Infinity, a
    number beyond a double's range), are errors on their line, not a traceback or an
    invalid output line."""
    fine = {"id": 0, "prompt": "fine", "response": "Fine."}
    assert run(["router", command, str(write_rows(tmp_path / "in.jsonl", [fine, bad]))]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"error: {tmp_path / 'in.jsonl'}:2: ")
    assert "'id'" in captured.err or "nested too deeply" in captured.err


def test_other_ids_come_back_as_json_dumps_writes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids: list[object] = [1, "x", None, 1.5, True, [1, 2], {"a": 1}, 10**30, -0.0, 1e300, "\u2028"]
    path = write_rows(tmp_path / "in.jsonl", [{"id": i, "prompt": "hi"} for i in ids])
    assert run(["router", "score", str(path)]) == 0
    lines = out_lines(capsys)
    assert [line.split(', "score": ')[0] for line in lines] == [
        json.dumps({"id": i})[:-1] for i in ids
    ]


def test_out_of_range_numbers_are_read_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `max_tokens` beyond a float's range is read as the largest one (the features take
    its log); an integer logprob beyond it as the float that number is (-10**400 as
    -1e400, -inf, which the verifier skips)."""
    huge = "1" + "0" * 400
    score_path = write_rows(
        tmp_path / "score.jsonl",
        [f'{{"id": 1, "prompt": "x", "max_tokens": {huge}}}', {"id": 2, "prompt": "x"}],
    )
    assert run(["router", "score", str(score_path)]) == 0
    assert [0 <= json.loads(line)["score"] <= 1 for line in out_lines(capsys)] == [True, True]
    row = '{{"id": 1, "prompt": "What is 2+2?", "response": "4", "logprobs": [-0.1, {}]}}'
    verify_path = write_rows(
        tmp_path / "verify.jsonl", [row.format("-" + huge), row.format("-1e400")]
    )
    assert run(["router", "verify", str(verify_path)]) == 0
    first, second = (json.loads(line)["score"] for line in out_lines(capsys))
    assert first == second


@pytest.mark.parametrize(
    ("shares", "message"),
    [
        ("local=nan,premium=0.3", "share nan"),
        ("local=inf,premium=0", "share inf"),
        ("local=-0.5,premium=1.5", "share -0.5"),
        ("local=0,premium=0", "sum above 0"),
        ("local=0.5,local=0.5", "given twice"),
        ("=0.5,premium=0.5", "no tier name"),
        ("local", "not tier=share"),
        ("", "give each tier a share"),
    ],
)
def test_calibrate_refuses_bad_shares(
    shares: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_rows(tmp_path / "in.jsonl", SCORE_ROWS)
    assert run(["router", "calibrate", str(path), "--shares", shares]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and message in captured.err


@pytest.mark.parametrize(
    ("shares", "local_rows"), [("local=1,premium=0", 3), ("local=0,premium=1", 0)]
)
def test_calibrate_a_whole_share_takes_every_row_and_none_takes_none(
    shares: str, local_rows: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_rows(tmp_path / "in.jsonl", SCORE_ROWS)
    assert run(["router", "score", str(path)]) == 0
    scores = [json.loads(line)["score"] for line in out_lines(capsys)]
    assert run(["router", "calibrate", str(path), "--shares", shares]) == 0
    below = float(capsys.readouterr().out.split("below: ")[1].split("}")[0])
    assert sum(score < below for score in scores) == local_rows


@pytest.mark.parametrize("command", ["score", "verify"])
def test_a_row_the_scorer_fails_on_is_named_not_a_traceback(
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unexpected exception while scoring one row (a bug) is an error naming its line;
    nothing is printed for any row."""

    def broken(text: str) -> None:
        if "boom" in text:
            raise RecursionError("maximum recursion depth exceeded")

    if command == "score":
        score_batch = Classifier.score_batch

        def classifier_scores(self: Classifier, requests: list[dict[str, Any]]) -> list[float]:
            for request in requests:
                broken(json.dumps(request))
            return score_batch(self, requests)

        monkeypatch.setattr(Classifier, "score_batch", classifier_scores)
    else:
        score = Verifier.score

        def verifier_score(self: Verifier, prompt: str, response: str, **kwargs: Any) -> float:
            broken(response)
            return score(self, prompt, response, **kwargs)

        monkeypatch.setattr(Verifier, "score", verifier_score)
    rows = [{"id": i, "prompt": f"q{i}", "response": f"a{i}"} for i in range(3)]
    rows[1] = {"id": 1, "prompt": "boom", "response": "boom"}
    path = write_rows(tmp_path / "in.jsonl", rows)
    assert run(["router", command, str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"error: {path}:2: cannot score this row: RecursionError: maximum recursion depth "
        "exceeded\n"
    )


def test_a_score_json_cannot_write_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Verifier, "score", lambda *args, **kwargs: math.nan)
    path = write_rows(tmp_path / "in.jsonl", VERIFY_ROWS)
    assert run(["router", "verify", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: {path}:1: cannot score this row: its score is nan\n"


def test_a_reader_that_goes_ends_the_output_quietly(tmp_path: Path) -> None:
    """`router score IN | head -1`: the reader closes the pipe; no BrokenPipeError
    traceback, exit status 1 (as Python's docs do it)."""
    path = write_rows(tmp_path / "in.jsonl", SCORE_ROWS)
    with subprocess.Popen(
        [sys.executable, "-m", "router.cli", "score", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    ) as child:
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()  # before the child, still starting, writes anything
        err = child.stderr.read()
    assert child.returncode == 1
    assert err == b""
