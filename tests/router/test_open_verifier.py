"""The verifier's open-ended judgement: the kind dispatch, its scores, the `router verify`
contract on chat rows, the artifact, and training by grouped cross-validation (on
fixture rows written here, never the shipped data)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from router import cli
from router.answers import open_ended
from router.errors import RoutingError
from router.open_verifier import LOOP_CAP, SCORE_CAPS, OpenVerifier, judges
from router.training.open_evaluation import figures, saving_at
from router.training.open_verifier_train import (
    ARENA_FILE,
    STRONG_MODEL,
    WEAK_MODEL,
    ArenaData,
    Recipe,
    fit,
    graded_answers,
    is_final,
    out_of_fold,
    prompt_folds,
    scores,
)
from router.training.verifier_train import train_open
from router.verifier import DEFAULT_PATH, Verifier

MATHS = "Tom has 3 boxes with 12 apples each. He eats 5 apples. How many apples are left?"
CHOICE = (
    "Which gas do plants absorb?\nA) oxygen\nB) carbon dioxide\nC) nitrogen\nD) helium\nAnswer:"
)
# Scores of closed-form answers by the verifier as it was before the open-ended model
# (commit 494bf3c, artifact cascade-verifier/1): they must not move by a bit.
CLOSED_FORM_SNAPSHOT = [
    (
        "Grace weighs 125 pounds. Alex weighs 2 pounds less than 4 times what Grace weighs. "
        "What are their combined weights in pounds?",
        "Alex weighs 4 * 125 - 2 = 498 pounds. Together they weigh 125 + 498 = 623 pounds."
        "\n#### 623",
        {},
        0.8413537764047258,
    ),
    (MATHS, "3 * 12 = 36 apples. 36 - 5 = 30.\n#### 30", {"prompt_score": 0.4}, 0.3),
    (CHOICE, "B", {"prompt_score": 0.6}, 0.5327517247502599),
    (CHOICE, "B", {"samples": ["D"]}, 0.40179612048250357),
    (
        "Write a function to remove all elements from a given list present in another list.",
        "```python\ndef remove_elements(a, b):\n    return [x for x in a if x not in b]\n```",
        {},
        0.840599466656143,
    ),
    (
        "Write a python function to find the first repeated character in a given string.",
        "def first_repeated(s):\n    seen = set()\n    for c in s:\n        if c in seen:\n"
        "            return c\n        seen.add(c)",
        {"logprobs": [-0.1, -2.0], "finish_reason": "stop"},
        0.6309762143149544,
    ),
]
CHAT = "Explain how a hash map works and when to use one instead of a sorted tree."
GOOD = (
    "A hash map stores each key in a bucket chosen by the key's hash, so a lookup, an "
    "insert or a delete takes constant time on average.\n\n"
    "- Collisions are resolved by chaining or open addressing.\n"
    "- The table grows and rehashes when it fills up.\n\n"
    "Use a hash map when you only need lookups by key. Use a sorted tree when you need "
    "the keys in order, range queries, or a guaranteed logarithmic worst case."
)


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    return Verifier.load()


@pytest.mark.parametrize(("prompt", "answer", "signals", "before"), CLOSED_FORM_SNAPSHOT)
def test_closed_form_answers_score_exactly_as_before(
    verifier: Verifier, prompt: str, answer: str, signals: dict[str, object], before: float
) -> None:
    assert verifier.score(prompt, answer, **signals) == before  # type: ignore[arg-type]


def test_open_ended_prompts_are_judged_by_the_open_model(verifier: Verifier) -> None:
    assert verifier.open_model is not None
    closed_only = Verifier.from_dict({**verifier.to_dict(), "format": "cascade-verifier/1"})
    assert closed_only.open_model is None
    assert verifier.score(MATHS, "#### 31") == closed_only.score(MATHS, "#### 31")
    assert verifier.score(CHAT, GOOD) != closed_only.score(CHAT, GOOD)


@pytest.mark.parametrize(
    ("worse", "capped_at"),
    [
        ("I'm sorry, but I can't help with that.", SCORE_CAPS["short_refusal"]),
        (GOOD[:200], None),  # cut off mid-sentence
        (GOOD[:150] + "\n```python\ndef lookup(table, key):\n    return table[", None),
        ("Bananas are yellow.", None),  # a short reply on another subject
        ("", SCORE_CAPS["empty"]),
        ("\n".join(["A hash map is a map and a map is a hash map."] * 12), LOOP_CAP),
    ],
)
def test_a_good_open_ended_answer_scores_above_a_poor_one(
    verifier: Verifier, worse: str, capped_at: float | None
) -> None:
    good = verifier.score(CHAT, GOOD)
    poor = verifier.score(CHAT, worse)
    assert poor < good
    if capped_at is not None:
        assert poor <= capped_at


def test_a_short_right_answer_is_not_escalated_for_its_length(verifier: Verifier) -> None:
    """The graded answers are all to hard, long requests; the answer's length is read
    relative to the prompt's, so a one-line answer to a one-line question is no outlier."""
    prompt = "What is the capital of France, and which river runs through it?"
    right = verifier.score(prompt, "Paris, on the Seine.")
    assert right > verifier.score(prompt, "I'm sorry, but I cannot help with that request.")
    assert right > 0.3


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [("hi", "Hello! How can I help you today?"), ("What is the capital of France?", "Paris.")],
)
def test_prompts_shorter_than_any_graded_one_keep_the_closed_form_judgement(
    verifier: Verifier, prompt: str, answer: str
) -> None:
    closed_only = Verifier.from_dict({**verifier.to_dict(), "format": "cascade-verifier/1"})
    assert open_ended(prompt) and not judges(prompt)
    assert verifier.score(prompt, answer) == closed_only.score(prompt, answer)


def test_upstream_signals_still_count_on_open_ended_answers(verifier: Verifier) -> None:
    assert verifier.score(CHAT, GOOD, finish_reason="length") <= SCORE_CAPS["finish_length"]
    confident = verifier.score(CHAT, GOOD, logprobs=[-0.05] * 50)
    unsure = verifier.score(CHAT, GOOD, logprobs=[-3.0] * 50)
    assert unsure < verifier.score(CHAT, GOOD) < confident
    json_mode = {"type": "json_object"}
    assert verifier.score(CHAT, "{broken", response_format=json_mode) <= SCORE_CAPS["json_invalid"]


def test_the_verify_contract_on_open_ended_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"id": "good", "prompt": CHAT, "response": GOOD, "finish_reason": "stop"},
        {"id": "cut", "prompt": CHAT, "response": GOOD[:200], "finish_reason": "length"},
        {"id": 7, "prompt": CHAT, "response": GOOD, "samples": [GOOD[:300]], "logprobs": [-0.1]},
        {"id": "maths", "prompt": MATHS, "response": "#### 31"},
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    assert cli.main(["verify", str(source)]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["id"] for row in out] == ["good", "cut", 7, "maths"]
    assert all(set(row) == {"id", "score"} and 0.0 <= row["score"] <= 1.0 for row in out)
    scored = {row["id"]: row["score"] for row in out}
    assert scored["cut"] <= SCORE_CAPS["finish_length"] < scored["good"]


def test_an_open_section_with_unknown_features_is_refused(verifier: Verifier) -> None:
    document = verifier.to_dict()
    document["open_ended"]["feature_names"][0] = "telepathy"
    with pytest.raises(RoutingError, match="telepathy"):
        Verifier.from_dict(document)
    document["open_ended"] = {"format": "open-verifier/0"}
    with pytest.raises(RoutingError, match="open-ended verifier format"):
        Verifier.from_dict(document)


def arena_rows(prompts: int = 40) -> list[dict[str, Any]]:
    """Fixture arena rows: four models, Mixtral's answer sometimes cut off (graded low)."""
    rows = []
    for k in range(prompts):
        full = f"Topic {k} works in three steps. First it reads. Then it sorts. Then it writes."
        cut = full[:40] if k % 3 == 0 else full
        rows.append(
            {
                "id": f"arena-{k:03d}",
                "prompt": f"Explain in detail how topic {k} works, with an example.",
                "models": {
                    STRONG_MODEL: {"score": 9.0, "cost_usd": 0.02, "response": full * 3},
                    WEAK_MODEL: {
                        "score": 2.0 if cut != full else 8.0 - k % 2,
                        "cost_usd": 0.0004,
                        "response": cut,
                    },
                    "model-short": {"score": 3.0, "cost_usd": 0.001, "response": "It works."},
                    "model-mid": {"score": 7.0, "cost_usd": 0.002, "response": full * 2},
                },
            }
        )
    return rows


@pytest.fixture(scope="module")
def arena(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("routing")
    lines = "".join(json.dumps(row) + "\n" for row in arena_rows())
    (directory / ARENA_FILE).write_text(lines, encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def data(arena: Path) -> ArenaData:
    return ArenaData.load(arena, prompt_scores={})


def test_grouped_folds_never_split_a_prompt(data: ArenaData) -> None:
    prompts = data.train_prompts
    folds = prompt_folds(prompts, 5, seed=0)
    assert sorted(p for fold in folds for p in fold) == sorted(prompts)  # each exactly once
    ids = data.prompt_ids
    for fold in folds:
        inside = data.rows_of(fold)
        # Every answer of a prompt lands with it: no prompt on both sides.
        assert not set(ids[inside]) & set(ids[~inside])
        assert inside.sum() == sum(a.prompt_id in fold for a in data.answers)
    recipe = Recipe("truncation", None, 1e4)
    result = out_of_fold(recipe, data, prompts, seed=0)
    assert not np.isnan(result[data.rows_of(prompts)]).any()
    assert np.isnan(result[data.rows_of(data.final_prompts)]).all()


def test_the_final_split_holds_whole_prompts_out(data: ArenaData) -> None:
    assert data.final_prompts and data.train_prompts
    assert not data.final_prompts & data.train_prompts
    for answer in data.answers:
        assert (answer.prompt_id in data.final_prompts) == is_final(answer.prompt_id)


def test_training_scores_match_the_shipped_scoring(data: ArenaData) -> None:
    for recipe in (Recipe("truncation", None, 1e4), Recipe("all", 8.0, 0.1)):
        model = fit(recipe, data, data.train_prompts)
        everything = np.ones(len(data.answers), dtype=np.bool_)
        fast = scores(model, data, everything)
        for i, answer in enumerate(data.answers):
            slow = model.score(answer.prompt, answer.response, data.closed_features[i])
            assert fast[i] == pytest.approx(slow, abs=1e-12)
        # Cut-off answers (the fixture's bad ones) are learned to score lower.
        cut = [i for i, a in enumerate(data.answers) if a.grade == 2.0]
        fine = [i for i, a in enumerate(data.answers) if a.model == WEAK_MODEL and a.grade >= 7]
        assert fast[cut].mean() < fast[fine].mean()


def test_the_open_section_is_retrained_alone_and_deterministically(
    arena: Path, tmp_path: Path
) -> None:
    shipped = json.loads(DEFAULT_PATH.read_text(encoding="utf-8"))
    closed_part = {k: v for k, v in shipped.items() if k != "open_ended"}
    outputs = []
    for name in ("a", "b"):
        out = tmp_path / name / "verifier.json"
        out.parent.mkdir()
        out.write_text(json.dumps({**closed_part, "format": "cascade-verifier/1"}), "utf-8")
        train_open(arena, out)
        outputs.append(out)
    assert outputs[0].read_bytes() == outputs[1].read_bytes()
    first = json.loads(outputs[0].read_text(encoding="utf-8"))
    assert first["format"] == "cascade-verifier/2"
    assert {k: v for k, v in first.items() if k not in ("open_ended", "format")} == {
        k: v for k, v in closed_part.items() if k != "format"
    }
    section = first["open_ended"]
    assert section["evaluation"]["folds"] == 10
    assert set(section["evaluation"]["cv"]) >= {"prompt length", "closed-form verifier (before)"}
    card = (tmp_path / "a" / "verifier.card.md").read_text(encoding="utf-8")
    assert "## Open-ended answers" in card and "CV APGR" in card
    loaded = Verifier.load(outputs[0])
    assert isinstance(loaded.open_model, OpenVerifier)


def test_the_saving_is_read_where_the_curve_reaches_95_percent() -> None:
    quality = np.array([6.0, 8.0, 9.0])
    cost = np.array([0.1, 0.5, 1.0])
    strong = np.full(4, 9.0)  # 95% of 9 = 8.55: 55% of the way from 8 to 9
    assert saving_at(quality, cost, strong) == pytest.approx(1 - (0.5 + 0.55 * 0.5))
    assert math.isnan(saving_at(np.array([6.0, 7.0]), np.array([0.1, 1.0]), strong))
    tied = figures(np.ones(5), np.full(5, 5.0), np.full(5, 9.0), np.ones(5), np.ones(5))
    assert math.isnan(tied.apgr)


def test_graded_answers_keep_every_model() -> None:
    answers = graded_answers(arena_rows(2))
    assert len(answers) == 8
    assert {a.model for a in answers} == {STRONG_MODEL, WEAK_MODEL, "model-short", "model-mid"}
