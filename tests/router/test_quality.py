"""The shipped quality predictor and `router predict`."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from router.cli import add_router_commands
from router.errors import RoutingError
from router.quality import (
    ALIASES,
    DEFAULT_PATH,
    STRONG_MODEL,
    QualityPredictor,
    UnknownModelError,
    canonical,
)

MIXTRAL = "mistralai/mixtral-8x7b-chat"
PROMPTS = [
    "hi, what's the capital of France?",
    "Write a python function to find the shared elements from the given two lists.",
    "Please answer with the letter of the correct answer.\n\nWhich gas do plants take in?\n"
    "A) oxygen\nB) carbon dioxide\nC) helium\nD) neon\nAnswer:",
    "",
    "数学の問題を解いてください。" * 50,
    "x" * 200_000,
]


@pytest.fixture(scope="module")
def predictor() -> QualityPredictor:
    return QualityPredictor.load()


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cascade-gateway")
    add_router_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def write_rows(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_shipped_artifact_is_small_json_with_a_card(predictor: QualityPredictor) -> None:
    assert DEFAULT_PATH.stat().st_size < 200_000
    assert json.loads(DEFAULT_PATH.read_text())["format"] == "cascade-gateway/quality"
    assert DEFAULT_PATH.with_suffix(".card.md").is_file()
    assert len(predictor.models) >= 15 and STRONG_MODEL in predictor.models


def test_loads_and_predicts_without_scikit_learn() -> None:
    code = (
        "import sys\n"
        "from router.quality import QualityPredictor\n"
        "q = QualityPredictor.load().predict([{'role': 'user', 'content': 'hello'}])\n"
        "assert q and 'sklearn' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_predictions_are_qualities_for_every_model(predictor: QualityPredictor) -> None:
    for prompt in PROMPTS:
        quality = predictor.predict([{"role": "user", "content": prompt}])
        assert list(quality) == list(predictor.models)
        assert all(0.0 <= q <= 1.0 for q in quality.values())


def test_strong_model_leads_on_average(predictor: QualityPredictor) -> None:
    """A sanity check of the shipped table: GPT-4 ahead of Mixtral on a quiz question."""
    quality = predictor.predict([{"role": "user", "content": PROMPTS[2]}])
    assert quality[STRONG_MODEL] > quality[MIXTRAL]


def test_batch_matches_single_requests(predictor: QualityPredictor) -> None:
    requests = [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS[:3]]
    models = [STRONG_MODEL, MIXTRAL]
    batch = predictor.predict_batch(requests, models)
    single = [predictor.predict(r["messages"], models=models) for r in requests]
    assert [list(b) for b in batch] == [list(s) for s in single]
    flat = [q for s in single for q in s.values()]
    assert [q for b in batch for q in b.values()] == pytest.approx(flat, abs=1e-12)
    assert predictor.predict_batch([], models) == []


def test_aliases_name_one_model(predictor: QualityPredictor) -> None:
    messages = [{"role": "user", "content": PROMPTS[1]}]
    names = ["mistralai/Mixtral-8x7B-Instruct-v0.1", MIXTRAL, "MISTRALAI/MIXTRAL-8X7B-CHAT"]
    quality = predictor.predict(messages, models=names)
    assert list(quality) == names  # keyed as asked
    assert len(set(quality.values())) == 1
    assert all(
        canonical(alias) == name and name in predictor.models for alias, name in ALIASES.items()
    )
    # Alike but distinct models keep their own profiles.
    assert predictor.resolve(["gpt-4-0314"]) != predictor.resolve([STRONG_MODEL])
    assert predictor.resolve(["gpt-3.5-turbo"]) != predictor.resolve(["gpt-3.5-turbo-1106"])


def test_unknown_model_lists_the_known_ones(predictor: QualityPredictor) -> None:
    with pytest.raises(UnknownModelError, match="unknown model 'gpt-5'") as caught:
        predictor.predict([{"role": "user", "content": "hi"}], models=[STRONG_MODEL, "gpt-5"])
    assert all(m in str(caught.value) for m in predictor.models)
    assert isinstance(caught.value, RoutingError)


def test_json_round_trip_is_exact(predictor: QualityPredictor, tmp_path: Path) -> None:
    path = tmp_path / "quality.json"
    predictor.save(path)
    assert path.read_bytes() == DEFAULT_PATH.read_bytes()
    again = QualityPredictor.load(path)
    messages = [{"role": "user", "content": PROMPTS[2]}]
    assert again.predict(messages) == predictor.predict(messages)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "cascade-gateway/classifier"}, "format"),
        ({"feature_version": -1}, "feature_version"),
        ({"deviation": [[0.0]]}, "malformed"),
        ({"task_quality": None}, "malformed"),
        ({"models": ["a", "a"]}, "malformed"),
    ],
)
def test_a_model_file_that_does_not_fit_is_refused(
    predictor: QualityPredictor, change: dict[str, object], message: str
) -> None:
    with pytest.raises(RoutingError, match=message):
        QualityPredictor.from_dict({**predictor.to_dict(), **change})


def test_predict_prints_one_line_per_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], predictor: QualityPredictor
) -> None:
    rows: list[object] = [
        {"id": "a", "prompt": PROMPTS[0]},
        {"id": 7, "messages": [{"role": "user", "content": PROMPTS[1]}]},
    ]
    path = write_rows(tmp_path / "in.jsonl", rows)
    models = f"{STRONG_MODEL},mistralai/Mixtral-8x7B-Instruct-v0.1"
    assert run(["router", "predict", str(path), "--models", models]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["id"] for line in lines] == ["a", 7]
    assert all(list(line["quality"]) == models.split(",") for line in lines)
    expected = predictor.predict([{"role": "user", "content": PROMPTS[0]}])[STRONG_MODEL]
    assert lines[0]["quality"][STRONG_MODEL] == pytest.approx(expected, abs=1e-6)

    assert run(["router", "predict", str(path)]) == 0  # --models omitted: every model
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(list(line["quality"]) == list(predictor.models) for line in lines)


@pytest.mark.parametrize("models", ["gpt-5", f"{STRONG_MODEL},nope", ","])
def test_predict_refuses_unknown_models_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], models: str
) -> None:
    path = write_rows(tmp_path / "in.jsonl", [{"id": 1, "prompt": "hi"}])
    assert run(["router", "predict", str(path), "--models", models]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ")
    if models != ",":
        assert STRONG_MODEL in captured.err and MIXTRAL in captured.err


def test_predict_names_a_bad_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_rows(tmp_path / "in.jsonl", [{"id": 1, "prompt": "hi"}, {"id": 2}])
    assert run(["router", "predict", str(path)]) == 1
    assert f"{path}:2:" in capsys.readouterr().err


def test_predict_from_a_real_process(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "in.jsonl", [{"id": "x", "prompt": PROMPTS[1]}])
    command = [sys.executable, "-m", "router.cli", "predict", str(path), "--models", MIXTRAL]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=Path(__file__).parents[2], check=False
    )
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert line["id"] == "x" and set(line["quality"]) == {MIXTRAL}
    bad = subprocess.run(
        [*command[:-1], "nobody"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        check=False,
    )
    assert bad.returncode == 2 and "unknown model 'nobody'" in bad.stderr


def test_standardised_features_are_clipped(predictor: QualityPredictor) -> None:
    """A request far outside training (a huge prompt) weighs as the most extreme one."""
    dense = np.full((1, predictor.dense_mean.shape[0]), 1e9)
    quality = predictor.predict_dense(dense)
    assert np.isfinite(quality).all() and (quality >= 0).all() and (quality <= 1).all()
