"""`router verify` rows as an evaluator writes them: answers stored as RouterBench stores
them (the text of a one-string list), `messages` instead of `prompt` (scored as the
gateway scores that conversation), answers with no letter or digit; and `router
predict`'s error for an unknown model."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.pipeline.scoring import AnswerVerifier
from router import cli, conversation
from router.cli import add_router_commands
from router.open_verifier import judges
from router.quality import ALIASES
from router.rows import unwrap_response
from router.training import calibration, cascade_evaluation, verifier_examples
from router.verifier import NO_TEXT_CAP, Verifier, says_nothing

ARC = (
    "Which gas do plants absorb from the air to make food?\nA) oxygen\nB) nitrogen\n"
    'C) helium\nD) carbon dioxide\nPrint only a single choice from "A" or "B" or "C" or "D" '
    "without explanation.\nAnswer:"
)
MBPP = "Write a python function to add two numbers.\nassert add(2, 3) == 5"
CODE = "```python\ndef add(a, b):\n    return a + b\n```"
SYSTEM = {"role": "system", "content": "When you write a program, put it in ``` fences."}
MATHS = "Tom has 3 bags of 12 apples and eats 5. How many apples are left?"
WORKED = "3 * 12 = 36 apples, 36 - 5 = 31.\n#### 31"


def write_rows(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run(argv: list[str]) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of `cascade-gateway router ...`."""
    parser = argparse.ArgumentParser(prog="cascade-gateway")
    add_router_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["router", *argv])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status: int = args.func(args)
    return status, out.getvalue(), err.getvalue()


def verify(rows: Sequence[dict[str, Any]], tmp_path: Path) -> dict[Any, float]:
    status, out, err = run(["verify", str(write_rows(tmp_path / "in.jsonl", rows))])
    assert (status, err) == (0, "")
    return {line["id"]: line["score"] for line in map(json.loads, out.splitlines())}


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("['D']", "D"),
        ('["D"]', "D"),
        (" ['D']\n", "D"),
        ("['It\\'s B']", "It's B"),
        ('["```python\\ndef f():\\n    return 1\\n```"]', "```python\ndef f():\n    return 1\n```"),
        ("['']", ""),
    ],
)
def test_a_one_string_list_reads_as_its_string(text: str, answer: str) -> None:
    assert unwrap_response(text) == answer


@pytest.mark.parametrize(
    "text",
    [
        "D",
        "['A', 'B']",
        "[1]",
        "[]",
        "[D]",
        "['D'] and ['C']",
        "[b'D']",
        "[['D']]",
        "[x for x in 'ab']",
        "[" * 10_000 + "]" * 10_000,
        "[" + "-" * 100_000 + "1]",
        '{"answer": "D"}',
    ],
)
def test_any_other_text_is_the_answer_itself(text: str) -> None:
    assert unwrap_response(text) == text


def test_training_reads_the_data_with_the_same_rule() -> None:
    """One copy of the rule: the training, calibration and eval code read RouterBench's
    answers as the CLI reads a row's."""
    for module in (verifier_examples, calibration, cascade_evaluation):
        assert vars(module)["unwrap_response"] is unwrap_response
        assert "literal_eval" not in Path(module.__file__ or "").read_text()


def test_a_routerbench_answer_scores_as_its_string(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"id": "plain", "prompt": ARC, "response": "D", "samples": ["D"]},
        {"id": "listed", "prompt": ARC, "response": "['D']", "samples": ["['D']"]},
        {"id": "bare", "prompt": ARC, "response": "D"},
        {"id": "bare listed", "prompt": ARC, "response": '["D"]'},
    ]
    scores = verify(rows, tmp_path)
    assert scores["listed"] == scores["plain"] and scores["bare listed"] == scores["bare"]
    assert scores["bare"] > 0.3  # not the ~0.003 of the list's text read as the answer


def test_calibrate_verify_reads_routerbench_answers_alike(tmp_path: Path) -> None:
    answers = ["D", "B", "I think it is D.", CODE]
    plain = [{"id": i, "prompt": ARC, "response": a} for i, a in enumerate(answers)]
    listed = [{**row, "response": repr([row["response"]])} for row in plain]
    outputs = []
    for name, rows in (("plain", plain), ("listed", listed)):
        path = write_rows(tmp_path / f"{name}.jsonl", rows)
        status, out, _ = run(["calibrate-verify", str(path), "--escalate", "0.5"])
        outputs.append((status, out))
    assert outputs[0] == outputs[1] and outputs[0][0] == 0


def test_run_code_finds_the_code_of_a_listed_answer() -> None:
    """What `--run-code` would run (no sandbox needed to see it is found)."""
    plain = cli._verify_request({"prompt": MBPP, "response": CODE})
    listed = cli._verify_request({"prompt": MBPP, "response": json.dumps([CODE])})
    assert listed == plain
    assert cli._code_job(listed) is not None


def test_the_gateway_scores_a_live_listed_answer_as_it_came() -> None:
    """The rule is the CLI's reading of data: a live answer `["D"]` is not unwrapped."""
    body = {"messages": [{"role": "user", "content": ARC}]}

    def live(text: str) -> float:
        return AnswerVerifier()("chat", body, {"choices": [{"message": {"content": text}}]})

    assert live('["D"]') != live("D")


# Conversations the gateway serves: each row of them scores as its request did.
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], str]] = {
    "system and user": ([SYSTEM, {"role": "user", "content": MATHS}], WORKED),
    "parts": (
        [{"role": "system", "content": [{"type": "text", "text": SYSTEM["content"]}]},
         {"role": "user", "content": [{"type": "text", "text": "Tom has 3 bags of 12 apples."},
                                      {"type": "image_url", "image_url": {"url": "x.png"}},
                                      {"type": "text", "text": "He eats 5. How many are left?"}]}],
        WORKED,
    ),
    "turns": (
        [SYSTEM, {"role": "user", "content": "Hi!"},
         {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": MBPP}],
        CODE,
    ),
    "no user text": ([{"role": "system", "content": ARC}, {"role": "user", "content": None}], "D"),
    "open-ended": (
        [SYSTEM, {"role": "user", "content": "Explain why the sky is blue to a ten-year-old."}],
        "Sunlight is made of many colours. Air scatters blue light the most, so the sky "
        "looks blue.",
    ),
}  # fmt: skip


@pytest.mark.parametrize("response_format", [None, {"type": "json_object"}])
@pytest.mark.parametrize("case", CONVERSATIONS)
def test_a_messages_row_scores_as_the_gateway_scores_its_request(
    case: str, response_format: dict[str, Any] | None, tmp_path: Path
) -> None:
    messages, answer = CONVERSATIONS[case]
    row: dict[str, Any] = {"id": case, "messages": messages, "response": answer}
    body: dict[str, Any] = {"messages": messages}
    if response_format is not None:
        row["response_format"] = body["response_format"] = response_format
    reply = {"choices": [{"message": {"content": answer}, "finish_reason": "stop"}]}
    gateway = AnswerVerifier()("chat", body, reply)
    assert verify([{**row, "finish_reason": "stop"}], tmp_path)[case] == round(gateway, 6)


def test_a_messages_rows_question_is_its_user_turns(tmp_path: Path) -> None:
    """Not the whole conversation: the route's system prompt asking for fenced code does
    not make a maths question a code question (as a `prompt` row of the whole text)."""
    messages = [SYSTEM, {"role": "user", "content": MATHS}]
    whole = conversation.prompt_text(messages)
    scores = verify(
        [
            {"id": "messages", "messages": messages, "response": WORKED},
            {"id": "one prompt", "prompt": whole, "response": WORKED},
        ],
        tmp_path,
    )
    assert scores["messages"] > scores["one prompt"]


def test_a_prompt_wins_over_messages_as_in_score_rows() -> None:
    row = cli._verify_request(
        {"prompt": "Hi", "messages": [{"role": "user", "content": "Bye"}], "response": "x"}
    )
    assert row.texts() == ("Hi", "Hi")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"messages": [{"role": "bot", "content": "hi"}]}, "'messages[0].role' must be one of"),
        ({"messages": [{"role": "user", "content": 5}]}, "'messages[0].content' must be"),
        ({"messages": []}, "'messages' must be a non-empty list"),
        ({}, "expected 'prompt' (a string) or 'messages'"),
        ({"prompt": 5}, "expected 'prompt' (a string) or 'messages'"),
    ],
)
def test_bad_messages_are_refused_naming_the_field(
    row: dict[str, Any], message: str, tmp_path: Path
) -> None:
    rows = [{"id": 0, "prompt": "fine", "response": "Fine."}, {"id": 1, **row, "response": "x"}]
    path = write_rows(tmp_path / "in.jsonl", rows)
    for command in (["verify"], ["calibrate-verify", "--escalate", "0.5"]):
        status, out, err = run([*command, str(path)])
        assert (status, out) == (1, "")
        assert err.startswith(f"error: {path}:2: {message}")


def test_a_response_must_be_a_string(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "in.jsonl", [{"id": 0, "prompt": "hi", "response": ["x"]}])
    assert run(["verify", str(path)]) == (
        1,
        "",
        f"error: {path}:1: expected 'response' as a string\n",
    )


OPEN = "Explain to a ten-year-old why the sky is blue during the day but red at sunset."
NO_TEXT = [".", "...", "-", "?!", " . ", "", "\u2014", "\u3002", ".\n.", "-\t-"]


def test_an_answer_without_a_letter_or_digit_is_capped(tmp_path: Path) -> None:
    """To a short question (the closed-form model) and an open-ended one (its model)."""
    assert judges(OPEN) and not judges("What is the capital of France?")
    rows = [
        {"id": f"{prompt[:4]}{i}", "prompt": prompt, "response": answer}
        for prompt in ("What is the capital of France?", OPEN)
        for i, answer in enumerate(NO_TEXT)
    ]
    rows.append({"id": "paris", "prompt": "What is the capital of France?", "response": "Paris."})
    scores = verify(rows, tmp_path)
    assert scores.pop("paris") > 0.5
    assert all(score <= NO_TEXT_CAP for score in scores.values()), scores


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ('Which sign makes "3 _ 5" true? Answer with "<", ">" or "=".', "<"),
        ("Which sign makes 3 _ 5 true? Answer with `<` or `>`.", "<"),
        ("Which sign makes 3 _ 5 true?\nA) >\nB) <\nC) =\nAnswer:", "<"),
        ("Which sign makes 3 _ 5 true?\n1. >\n2. <\nAnswer:", " < "),
    ],
)
def test_an_option_the_question_offers_is_not_capped(question: str, answer: str) -> None:
    assert not says_nothing(question, answer)


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("What is the capital of France?", "?"),
        ("What is the capital of France?", ""),
        ("List three fruits:\n- apple\n- pear", "-"),
        ('Which sign makes "3 _ 5" true? Answer with "<", ">" or "=".', "..."),
    ],
)
def test_other_answers_without_text_say_nothing(question: str, answer: str) -> None:
    assert says_nothing(question, answer)


@pytest.mark.parametrize(
    "answer", ["<", "+", "\u20ac", "\u2205", "\U0001f44d", "\u5317\u4eac", "\u0968"]
)
def test_a_symbol_or_any_script_s_word_is_an_answer(answer: str) -> None:
    """Only punctuation says nothing: a sign, a currency, an emoji, a word or digit in any
    script answers something (right or wrong is the models' to judge)."""
    assert not says_nothing("Which one? Answer with one symbol or word.", answer)


def test_the_live_verifier_caps_an_answer_without_text() -> None:
    verifier = Verifier.load()
    assert verifier.score("What is the capital of France?", ".") <= NO_TEXT_CAP
    assert verifier.score(OPEN, "...", question=OPEN) <= NO_TEXT_CAP


def test_predict_names_the_aliases_it_accepts(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "in.jsonl", [{"id": 1, "prompt": "hi"}])
    status, out, err = run(["predict", str(path), "--models", "nobody"])
    assert (status, out) == (2, "")
    assert err.startswith("error: unknown model 'nobody'; the quality predictor knows ")
    assert "also accepted: " in err
    assert all(f"{alias} -> {name}" in err for alias, name in ALIASES.items())
    status, _, err = run(["predict", str(path), "--models", next(iter(ALIASES))])
    assert (status, err) == (0, "")


def test_a_positive_logprob_is_refused_naming_its_place(tmp_path: Path) -> None:
    """Logprobs are at most 0; a positive one is some other number (a probability, a
    count) that the verifier would read as a confident answer."""
    row = {"id": 1, "prompt": "What is 2+2?", "response": "4", "logprobs": [-0.5, 0, 5]}
    path = write_rows(tmp_path / "in.jsonl", [row])
    status, out, err = run(["verify", str(path)])
    assert (status, out) == (1, "")
    assert err == f"error: {path}:1: 'logprobs[2]' is 5: a token's logprob is at most 0\n"
    assert verify([{**row, "logprobs": [-0.5, 0, -5]}], tmp_path)[1] > 0
