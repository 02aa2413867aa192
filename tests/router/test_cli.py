from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from router import sandbox
from router.cli import add_router_commands
from router.embedding_classifier import shipped


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cascade-gateway")
    add_router_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def write_rows(path: Path, rows: list[object]) -> Path:
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


@pytest.mark.skipif(sandbox.available() is not None, reason="no sandbox on this host")
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
