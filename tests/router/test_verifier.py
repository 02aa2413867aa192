"""The cascade verifier: shipped artifact, signals, caps and deterministic training."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from router import verifier as verifier_module
from router import verifier_code_features
from router.code_examples import ExampleRun
from router.errors import RoutingError
from router.training.dataset import DEFAULT_DATA_DIR
from router.training.verifier_examples import build_examples
from router.training.verifier_train import signal_variants, train
from router.verifier import SCORE_CAPS, Verifier, code_job
from router.verifier_features import (
    FEATURE_NAMES,
    MAX_PROMPT_CHARS,
    Signals,
    extract_features,
    schema_matches,
)

MATHS = "Tom has 3 boxes with 12 apples each. He eats 5 apples. How many apples are left?"
MATHS_ANSWER = "3 boxes * 12 apples = 36 apples. 36 - 5 = 31.\n#### 31"
CHOICE = (
    "Which gas do plants absorb?\nA) oxygen\nB) carbon dioxide\nC) nitrogen\nD) helium\n"
    'Print only a single choice from "A" or "B" or "C" or "D".\nAnswer:'
)
PERSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "person",
        "schema": {
            "type": "object",
            "required": ["name", "age"],
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        },
    },
}


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    return Verifier.load()


def test_scores_are_probabilities(verifier: Verifier) -> None:
    cases = [("", ""), (MATHS, MATHS_ANSWER), (CHOICE, "B"), ("hi", "x" * 5000)]
    for prompt, response in cases:
        assert 0.0 <= verifier.score(prompt, response) <= 1.0


def test_invalid_json_scores_below_valid(verifier: Verifier) -> None:
    prompt = "Give me the person as JSON."
    json_mode = {"type": "json_object"}
    valid = verifier.score(prompt, '{"name": "Ada", "age": 36}', response_format=json_mode)
    broken = verifier.score(prompt, '{"name": "Ada", "age": 36', response_format=json_mode)
    assert broken <= 0.05 < valid


def test_schema_mismatch_scores_below_match(verifier: Verifier) -> None:
    prompt = "Describe Ada."
    good = verifier.score(prompt, '{"name": "Ada", "age": 36}', response_format=PERSON_SCHEMA)
    missing = verifier.score(prompt, '{"name": "Ada"}', response_format=PERSON_SCHEMA)
    wrong_type = verifier.score(
        prompt, '{"name": "Ada", "age": "36"}', response_format=PERSON_SCHEMA
    )
    assert max(missing, wrong_type) <= 0.1 < good


def test_schema_check_is_minimal_but_strict_on_types() -> None:
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    assert schema_matches({"n": 1}, schema)
    assert not schema_matches({"n": True}, schema)
    assert not schema_matches([1], schema)
    assert schema_matches([1], {"type": ["array", "null"]})


def test_refusal_scores_below_direct_answer(verifier: Verifier) -> None:
    prompt = "What is the capital of France?"
    direct = verifier.score(prompt, "The capital of France is Paris.")
    refusal = verifier.score(prompt, "I'm sorry, but I cannot help with that request.")
    assert refusal < direct


def features_of(prompt: str, response: str, **signals: object) -> dict[str, float]:
    return extract_features(prompt, response, Signals(**signals))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prompt", "response", "requested", "invalid"),
    [
        ("What is JSON?", "JSON is a lightweight text format for exchanging data.", 0, 0),
        ("How do I parse JSON in Python?", "Call json.loads on the text.", 0, 0),
        ("Compare JSON and XML.", "JSON is terser; XML has attributes.", 0, 0),
        ("Return the user as a JSON object with name and age.", "The name is Bob.", 1, 1),
        ("Answer in valid JSON: who wrote Hamlet?", '{"author": "Shakespeare"}', 1, 0),
        ("Describe JSON.", '{"broken": ', 1, 1),  # named, and the answer tries it: checked
        # A code question's answer is code, even when the code is about JSON.
        ("Write a function in Python that parses JSON.", "def f(t):\n    return t", 0, 0),
        ("Write a Python function that returns its input as JSON.", "def f(x): ...", 0, 0),
    ],
)
def test_json_is_checked_when_asked_for_not_when_named(
    prompt: str, response: str, requested: int, invalid: int
) -> None:
    features = features_of(prompt, response)
    assert (features["json_requested"], features["json_invalid"]) == (requested, invalid)


def test_an_answer_nested_past_the_parsers_depth_is_invalid_json_not_an_error() -> None:
    features = features_of("Reply in JSON.", "[" * 100_000)
    assert features["json_invalid"] == 1.0


@pytest.mark.parametrize(
    ("response", "refusal"),
    [
        ("Unfortunately for Pluto fans, no. It is a dwarf planet.", 0),
        ("I don't think so: 7 is prime.", 0),
        ("I do not agree; the answer is 4.", 0),
        ("Unfortunately I", 1),  # the shipped data's cut-off refusal
        ("Unfortunately, I cannot share that.", 1),
        ("I can't help with that.", 1),
        ("I'm unable to provide information on that topic.", 1),
        ("Im not able to answer that.", 1),
        ("I\u2019m unable to help.", 1),
        ("I don't have access to real-time data.", 1),
        ("As an AI, I have no opinion.", 1),
    ],
)
def test_a_refusal_is_an_answer_that_declines(response: str, refusal: int) -> None:
    assert features_of("Is Pluto a planet?", response)["refusal"] == refusal


@pytest.mark.parametrize(
    ("prompt", "response"),
    [
        ("Is 7 * 8 greater than 50? Answer yes or no.", "Yes."),
        ("What is 2 + 2?", "Four."),
    ],
)
def test_a_maths_answer_in_words_or_yes_no_has_its_number(prompt: str, response: str) -> None:
    features = features_of(prompt, response)
    assert features["math_prompt"] == 1.0
    assert features["math_no_number"] == 0.0
    assert features["math_unused_numbers"] == 0.0  # a bare answer restates none by nature


@pytest.mark.parametrize(
    "prompt",
    [
        "What is 6 times 7?",
        "What is 6 times 7? Answer with a number.",
        "How much is 12 divided by 4",
        "What's 9 squared?",
    ],
)
def test_arithmetic_in_words_is_maths_and_a_non_answer_is_capped(
    verifier: Verifier, prompt: str
) -> None:
    """A greeting in place of the result scored 0.998 while "6 times 7" read as chat."""
    features = features_of(prompt, "Hello! This is a fake upstream answering your request.")
    assert (features["math_prompt"], features["math_no_number"]) == (1.0, 1.0)
    non_answer = verifier.score(prompt, "Hello! This is a fake upstream answering your request.")
    assert non_answer <= verifier_module.SCORE_CAPS["math_no_number"]
    assert verifier.score(prompt, "42") > non_answer


def test_a_maths_answer_that_shows_no_working_is_not_a_skipped_fact() -> None:
    bare = features_of("What is 12 * 7?", "84")
    worked = features_of(MATHS, "3 boxes make 36 apples, so 31 are left.\n#### 31")
    assert bare["math_unused_numbers"] == 0.0
    assert worked["math_unused_numbers"] > 0.0  # 5 was never used


def test_a_wrong_step_caps_a_maths_answer_but_not_code(verifier: Verifier) -> None:
    right = verifier.score("What is 12 * 7?", "12 * 7 = 84")
    wrong = verifier.score("What is 12 * 7?", "12 * 7 = 85")
    assert wrong <= verifier_module.MATH_SCORE_CAPS["math_wrong_step"] < right
    code = "Write a Python function that adds one."
    answer = "```python\ndef add_one(x):\n    return x + 1  # 2 + 1 = 4? no: 3\n```"
    features = features_of(code, answer)
    assert (features["math_prompt"], features["math_wrong_step"]) == (0.0, 1.0)
    assert verifier.score(code, answer) > verifier_module.MATH_SCORE_CAPS["math_wrong_step"]


def test_truncated_answer_scores_below_complete(verifier: Verifier) -> None:
    prompt = "Explain briefly why the sky is blue."
    complete = "Sunlight scatters off air molecules, and blue light scatters the most."
    truncated = "Sunlight scatters off air molecules, and blue light scatters the"
    assert verifier.score(prompt, truncated, finish_reason="length") < verifier.score(
        prompt, complete, finish_reason="stop"
    )


def test_maths_answer_needs_a_final_number(verifier: Verifier) -> None:
    vague = "He has some apples left after eating a few of them."
    assert verifier.score(MATHS, vague) < verifier.score(MATHS, MATHS_ANSWER)


def test_a_wrong_arithmetic_step_lowers_the_score(verifier: Verifier) -> None:
    wrong = "3 * 12 = 38 apples. 38 - 5 = 33.\n#### 33"
    features = extract_features(MATHS, wrong, Signals())
    assert features["math_wrong_step"] == 1.0
    assert features["math_steps"] > 0
    assert verifier.score(MATHS, wrong) < verifier.score(MATHS, MATHS_ANSWER)


def test_a_skipped_number_of_the_question_is_counted() -> None:
    skipped = extract_features(MATHS, "3 * 12 = 36 apples.\n#### 36", Signals())
    used = extract_features(MATHS, MATHS_ANSWER, Signals())
    assert used["math_unused_numbers"] == 0.0
    assert skipped["math_unused_numbers"] == pytest.approx(1 / 3)  # 5 was never used


def test_a_final_answer_no_step_computed_is_flagged() -> None:
    derived = extract_features(MATHS, MATHS_ANSWER, Signals())
    assert derived["math_final_not_derived"] == 0.0
    from_nowhere = extract_features(MATHS, "3 * 12 = 36 apples.\n#### 29", Signals())
    assert from_nowhere["math_final_not_derived"] == 1.0
    # No worked steps: nothing to compare the final answer with.
    assert extract_features(MATHS, "#### 29", Signals())["math_final_not_derived"] == 0.0


def test_a_fractional_count_is_flagged() -> None:
    """ "How many" asks for a count; 30.5 apples is a slip somewhere."""
    half = extract_features(MATHS, "36 - 5.5 = 30.5\n#### 30.5", Signals())
    assert half["math_fractional_count"] == 1.0
    assert extract_features(MATHS, MATHS_ANSWER, Signals())["math_fractional_count"] == 0.0
    price = "A pen costs $1.25 and a pad $2. What is the total cost?"
    assert extract_features(price, "1.25 + 2 = 3.25", Signals())["math_fractional_count"] == 0.0


def test_the_prompt_prior_orders_answers_that_say_nothing(verifier: Verifier) -> None:
    """A bare option letter tells nothing; the harder prompt (by the classifier) is
    trusted less, so the cascade escalates it first."""
    easy = verifier.score(CHOICE, "B", prompt_score=0.2)
    hard = verifier.score(CHOICE, "B", prompt_score=0.8)
    assert hard < easy
    unknown = extract_features(CHOICE, "B", Signals())
    assert math.isnan(unknown["prompt_difficulty"])  # neutral: scored at the mean
    assert 0.0 < verifier.score(CHOICE, "B") < 1.0


def test_a_second_opinion_moves_the_score(verifier: Verifier) -> None:
    """Agreeing with another answer on the final answer is strong evidence; disagreeing
    sends the answer up the cascade. A learned weight, so it must come out positive."""
    assert verifier.coefficients[FEATURE_NAMES.index("sample_agreement")] > 0.5
    alone = verifier.score(CHOICE, "B")
    assert verifier.score(CHOICE, "B", samples=["B"]) > alone
    assert verifier.score(CHOICE, "B", samples=["D"]) < min(alone, verifier.threshold)
    assert verifier.score(MATHS, MATHS_ANSWER, samples=["So 31 apples."]) > verifier.score(
        MATHS, MATHS_ANSWER, samples=["#### 26"]
    )
    assert math.isnan(extract_features(CHOICE, "B", Signals())["sample_agreement"])


FUNCTION_ASKED = "Write a python function to add two numbers."


def adder(op: str) -> str:
    return f"```python\ndef add(a, b):\n    return a {op} b\n\nprint(add(2, 3))  # Output: 5\n```"


def test_a_code_run_whose_examples_fail_scores_below_one_whose_examples_hold(
    verifier: Verifier,
) -> None:
    """The answer's own claims, checked by running its code (a learned weight: a failed
    example must count against it); not run, the two signals are unknown (neutral)."""
    held, failed = ExampleRun(passed=2, failed=0), ExampleRun(passed=0, failed=2)
    answer = adder("+")
    assert verifier.score(FUNCTION_ASKED, answer, code_run=failed) < verifier.score(
        FUNCTION_ASKED, answer, code_run=held
    )
    assert verifier.coefficients[FEATURE_NAMES.index("code_examples_failed_share")] < 0
    features = extract_features(FUNCTION_ASKED, answer, Signals())
    assert math.isnan(features["code_examples_held"])
    assert math.isnan(features["code_examples_failed_share"])
    nothing = extract_features(FUNCTION_ASKED, answer, Signals(code_run=ExampleRun(0, 0)))
    assert math.isnan(nothing["code_examples_failed_share"])  # nothing was checked


def test_only_python_code_answers_are_run() -> None:
    job = code_job(FUNCTION_ASKED, adder("+"))
    assert job is not None and job.examples == (("add(2, 3)", "5"),)
    assert code_job("What is 2 + 3?", adder("+")) is None  # not a code question
    assert code_job("Write a JavaScript function to add two numbers.", adder("+")) is None
    js = "```javascript\nfunction add(a, b) { return a + b; }\nadd(2, 3)  // 5\n```"
    assert code_job(FUNCTION_ASKED, js) is None  # fenced as another language
    # The question, when given apart from the prompt, is what is read.
    system = "You are a helpful assistant.\n\n" + FUNCTION_ASKED
    assert code_job(system, adder("+"), question=FUNCTION_ASKED) is not None


def test_each_mix_of_optional_signals_is_fitted_and_shares_its_rows_weight() -> None:
    """An answer with a second opinion and a code run is fitted four times (neither,
    either, both) at a quarter of its weight; one with neither, once at all of it."""
    both = extract_features(
        FUNCTION_ASKED,
        adder("+"),
        Signals(samples=(adder("-"),), code_run=ExampleRun(1, 0)),
    )
    neither = extract_features(MATHS, MATHS_ANSWER, Signals())
    features = np.array([list(both.values()), list(neither.values())])
    rows, origin, share = signal_variants(features)
    assert sorted(origin.tolist()) == [0, 0, 0, 0, 1]
    assert {round(float(share[origin == i].sum()), 9) for i in (0, 1)} == {1.0}
    columns = [FEATURE_NAMES.index(n) for n in ("code_agreement", "code_examples_held")]
    kept = {tuple(~np.isnan(r[columns])) for r in rows[origin == 0]}
    assert kept == {(True, True), (True, False), (False, True), (False, False)}


def test_training_pairs_each_answer_with_a_second_opinion() -> None:
    """RouterBench answers carry another model's answer to the same prompt; GSM8K has
    no third model, so its answers carry none."""
    examples = build_examples(DEFAULT_DATA_DIR, limit=3)
    by_prompt: dict[tuple[str, str], set[str]] = {}
    for e in examples:
        by_prompt.setdefault((e.source, e.prompt_id), set()).add(e.response)
    for e in examples:
        if e.source == "gsm8k":
            assert e.samples == ()
        else:
            assert len(e.samples) == 1 and e.samples[0] in by_prompt[e.source, e.prompt_id]


def test_multiple_choice_needs_one_clear_option() -> None:
    clear = extract_features(CHOICE, "B", Signals())
    unclear = extract_features(CHOICE, "It could be A or maybe C.", Signals())
    assert clear["mc_prompt"] == 1.0
    assert clear["mc_no_clear_option"] == 0.0
    assert unclear["mc_no_clear_option"] == 1.0


def test_code_prompt_without_code_is_flagged() -> None:
    prompt = "Write a python function to reverse a string."
    with_code = extract_features(
        prompt, "```python\ndef rev(s):\n    return s[::-1]\n```", Signals()
    )
    without = extract_features(prompt, "You can reverse it with slicing.", Signals())
    assert (with_code["code_missing"], without["code_missing"]) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("prompt", "answer", "flagged"),
    [
        ("Write a function to reverse a string.", "def rev(s):\n    return s[::-1]", 0.0),
        ("Write a function to reverse a string.", "```\nrev = lambda s: s[::-1]\n```", 0.0),
        # Another language's code without a fence tag, or a bare expression.
        ("Write a function to reverse a string.", "```\nfunction rev(s) {\n}\n```", 1.0),
        ("Write a function that matches 'ab'.", "Use this pattern:\n```\nr'ab'\n```", 1.0),
        # Asked in another language, or for a program rather than a function.
        ("Write a JavaScript function to reverse a string.", "function rev(s) {}", 0.0),
        ("Write a function in Go to reverse a string.", "func rev(s string) {}", 0.0),
        (
            "Write a C function to reverse a string in place.",
            "```c\nvoid rev(char *s) {}\n```",
            0.0,
        ),
        ("Write a Go function to reverse a string.", "func rev(s string) string {}", 0.0),
        ("Write an R function to reverse a vector.", "rev2 <- function(x) rev(x)", 0.0),
        ("Write a Julia function to add two numbers.", "add(a, b) = a + b", 0.0),
        ("Write a function in C++17 to add.", "int add(int a, int b) { return a + b; }", 0.0),
        # Letters and words that are no language: still Python, still flagged.
        ("Write a function to pick option c.", "function pick() {}", 1.0),
        ("Write a function to go through a list.", "function walk(xs) {}", 1.0),
        ("Write a function for https://x.org/sort.php input.", "function s() {}", 1.0),
        ("Write a program that prints hello.", "```\nprint('hello')\n```", 0.0),
        ("Write a function to add two numbers.", "```python\nasync def add(a, b): ...\n```", 0.0),
        ("Write a function to add two numbers.", "Define add(a, b) to return a + b.", 1.0),
        # Markdown-escaped, "def add\\_two(" would not run.
        ("Write a function to add two numbers.", "```\ndef add\\_two(a, b):\n```", 1.0),
    ],
)
def test_a_function_asked_for_and_none_written_is_flagged(
    prompt: str, answer: str, flagged: float
) -> None:
    assert extract_features(prompt, answer, Signals())["code_no_function"] == flagged


def test_the_code_and_language_checks_are_linear_on_hostile_input() -> None:
    """The patterns themselves, on 200k characters each (the verifier reads less)."""
    hostile = [
        ("def" + " " * 1000 + "\n") * 200,
        " " * 200_000 + "def",
        "in " * 70_000,
        "C " * 100_000,
        "c+" * 100_000,
        "http://" + "x" * 200_000,
        "java" * 50_000,
    ]
    started = time.perf_counter()
    for text in hostile:
        assert not verifier_code_features._PYTHON_FUNCTION.search(text)
        verifier_code_features.named_languages(text)
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize(
    ("prompt", "fence", "flagged"),
    [
        ("Write a function to add.", "cpp", 1.0),  # C++ unasked
        ("Write a C++ function to add.", "cpp", 0.0),  # asked, spelled otherwise
        ("Write a Go function to add.", "golang", 0.0),
        ("Write a JavaScript function to add.", "ruby", 1.0),  # another than the one asked
        ("Write a function to add.", "python", 0.0),
        ("Write a function to add.", "objective-c", 1.0),  # the tag read whole
        ("Write a function to add.", "node.js", 1.0),
        # An untagged fence: its first line is code, not a language ("r <- 1" is no R).
        ("Write a function to add.", "\nr", 0.0),
    ],
)
def test_code_fenced_as_a_language_not_asked_for_is_flagged(
    prompt: str, fence: str, flagged: float
) -> None:
    answer = f"```{fence}\nadd(a, b)\n```"
    assert extract_features(prompt, answer, Signals())["code_other_language"] == flagged


def test_a_long_prompt_is_read_at_its_head_and_tail() -> None:
    """A system prompt at the head and the question at the tail are read however long the
    pasted text between them; the middle is not (its scans stay bounded)."""
    middle = "The report covers the year's deliveries in some detail. " * 20_000
    question = "Write a function to count the deliveries."
    answer = "```\nfunction count(deliveries) { return deliveries.length; }\n```"
    system_named = f"You write TypeScript.\n\n{middle}\n\n{question}"
    middle_named = f"{middle} It was kept in TypeScript. {middle}\n\n{question}"
    assert len(system_named) > 2 * MAX_PROMPT_CHARS
    started = time.perf_counter()
    heard = extract_features(system_named, answer, Signals(question=f"{middle}\n\n{question}"))
    unheard = extract_features(middle_named, answer, Signals())
    assert time.perf_counter() - started < 5.0
    assert (heard["code_prompt"], heard["code_no_function"]) == (1.0, 0.0)
    assert (unheard["code_prompt"], unheard["code_no_function"]) == (1.0, 1.0)


def test_a_system_prompt_naming_a_language_is_heard() -> None:
    conversation = "You are a TypeScript assistant.\n\nWrite a function to reverse a string."
    question = "Write a function to reverse a string."
    answer = "```\nfunction rev(s: string) { return s; }\n```"
    features = extract_features(conversation, answer, Signals(question=question))
    assert features["code_no_function"] == 0.0


def test_the_length_of_an_answers_code_is_counted_on_code_prompts() -> None:
    """Non-blank lines of the answer's code (fenced, or unfenced code), not its prose."""
    prompt = "Write a python function to reverse a string."
    short = "Use slicing:\n```python\ndef rev(s):\n\n    return s[::-1]\n```\nThat is all."
    long = "```python\n" + "".join(f"x{i} = {i}\n" for i in range(20)) + "```"
    unfenced = "def rev(s):\n    return s[::-1]"
    lines = {
        name: extract_features(prompt, answer, Signals())["code_lines"]
        for name, answer in (("short", short), ("long", long), ("unfenced", unfenced))
    }
    assert lines == {"short": math.log1p(2), "long": math.log1p(20), "unfenced": math.log1p(2)}
    assert extract_features(prompt, "Reverse it with slicing.", Signals())["code_lines"] == 0.0
    maths = extract_features("How many is 3 + 4?", "def f():\n    return 7", Signals())
    assert maths["code_lines"] == 0.0  # not a code question


def test_degenerate_loop_is_capped(verifier: Verifier) -> None:
    loop = "\n".join(["The answer is the answer is the answer."] * 8)
    assert verifier.score("Tell me a story about a cat.", loop) <= 0.3


def test_low_logprobs_lower_the_score(verifier: Verifier) -> None:
    prompt, response = "What is the capital of France?", "The capital of France is Paris."
    confident = verifier.score(prompt, response, logprobs=[-0.01, -0.05, -0.02, -0.1])
    unsure = verifier.score(prompt, response, logprobs=[-2.5, -3.0, -1.8, -4.0])
    absent = extract_features(prompt, response, Signals())
    assert unsure < confident
    assert absent["no_logprobs"] == 1.0
    assert absent["logprob_mean"] == 0.0
    # A positive "log probability" (a broken upstream) is no surer than certainty.
    certain = verifier.score(prompt, response, logprobs=[0.0] * 4)
    assert verifier.score(prompt, response, logprobs=[5.0] * 4) == certain


def test_scoring_is_fast(verifier: Verifier) -> None:
    response = MATHS_ANSWER * 20
    start = time.perf_counter()
    for _ in range(200):
        verifier.score(MATHS, response, logprobs=[-0.1] * 200, finish_reason="stop")
    assert (time.perf_counter() - start) / 200 < 0.005  # < 1 ms typical; slack for busy CI


def test_artifact_round_trips(verifier: Verifier, tmp_path: Path) -> None:
    path = tmp_path / "verifier.json"
    path.write_text(json.dumps(verifier.to_dict()), encoding="utf-8")
    assert Verifier.load(path) == verifier
    assert verifier.feature_names == FEATURE_NAMES


def test_bad_artifact_is_a_routing_error(tmp_path: Path) -> None:
    path = tmp_path / "verifier.json"
    path.write_text('{"format": "pickle"}', encoding="utf-8")
    with pytest.raises(RoutingError, match="verifier format"):
        Verifier.load(path)
    with pytest.raises(RoutingError, match="cannot read"):
        Verifier.load(tmp_path / "missing.json")


def test_training_is_deterministic(tmp_path: Path) -> None:
    first, second = tmp_path / "a" / "verifier.json", tmp_path / "b" / "verifier.json"
    # The closed-form data only: the open-ended section has its own (test_open_verifier).
    data = tmp_path / "data"
    data.mkdir()
    for source in DEFAULT_DATA_DIR.glob("*.jsonl.gz"):
        if source.name != "arena_chat.jsonl.gz":
            (data / source.name).symlink_to(source)
    # Without prompt scores (the full held-out classifier run is tested with the eval).
    train(data, first, limit=60, prompt_scores={})
    train(data, second, limit=60, prompt_scores={})
    assert first.read_bytes() == second.read_bytes()
    assert (tmp_path / "a" / "verifier.card.md").is_file()
    Verifier.load(first)


def test_examples_cover_every_source() -> None:
    examples = build_examples(DEFAULT_DATA_DIR, limit=3)
    sources = {e.source for e in examples}
    assert "gsm8k" in sources and "routerbench_mbpp" in sources
    assert all(not e.response.startswith("['") for e in examples)


@pytest.mark.parametrize(
    ("answer", "stub"),
    [
        ("```python\ndef add(a, b):\n    pass\n```", 1.0),
        ('```python\ndef add(a, b):\n    """Add a and b."""\n    ...\n```', 1.0),
        ("```python\ndef add(a, b): raise NotImplementedError('todo')\n```", 1.0),
        (
            "```python\ndef add(a, b):\n    # TODO: implement\n    pass\n\nprint(add(1, 2))\n```",
            1.0,
        ),
        # A constant returned under a comment that says the work is still to do.
        ("```python\ndef add(a, b):\n    # TODO: implement\n    return None\n```", 1.0),
        ("```python\ndef add(a, b):\n    return 0  # your code here\n```", 1.0),
        ('```python\ndef evens(xs):\n    """Even items."""\n    return []  # FIXME\n```', 1.0),
        ("```python\ndef find(xs, x):\n    return -1  # TODO: search\n```", 1.0),
        # A constant is an answer where nothing says it is unfinished, or it is computed.
        ('```python\ndef header():\n    return "# TODO list"\n```', 0.0),  # in a string
        (
            "```python\ndef is_windows():\n    # not implemented upstream\n    return False\n```",
            0.0,
        ),
        ("```python\ndef answer():\n    return 42\n```", 0.0),
        ("```python\ndef add(a, b):\n    # TODO: check types\n    return a + b\n```", 0.0),
        ("```python\ndef add(a, b):\n    return [a, b]  # TODO: sum\n```", 0.0),
        # Some function does something: an answer, maybe wrong, not a placeholder.
        ("```python\ndef add(a, b):\n    if a is None:\n        pass\n    return a + b\n```", 0.0),
        ("```python\ndef helper():\n    pass\n\ndef add(a, b):\n    return a + b\n```", 0.0),
        ("```python\ndef add(a, b):\n    raise ValueError('no')\n```", 0.0),
        # Not Python, or no function: the check has nothing to say.
        ("```c\nint add(int a, int b) { pass; }\n```", 0.0),
        ("```python\npass\n```", 0.0),
    ],
)
def test_code_whose_every_function_is_a_placeholder_is_a_stub(answer: str, stub: float) -> None:
    prompt = "Write a python function to add two numbers."
    assert extract_features(prompt, answer, Signals())["code_stub"] == stub


def test_a_stub_is_capped_however_well_it_reads(verifier: Verifier) -> None:
    prompt = "Write a python function to add two numbers."
    working = "```python\ndef add(a, b):\n    return a + b\n```"
    stub = "```python\ndef add(a, b):\n    # add the two numbers\n    pass\n```"
    assert verifier.score(prompt, stub, finish_reason="stop") <= SCORE_CAPS["code_stub"]
    assert verifier.score(prompt, working, finish_reason="stop") > SCORE_CAPS["code_stub"]


def test_the_stub_check_stays_cheap_on_long_code() -> None:
    """Code without a placeholder line is not parsed; hostile nesting is no verdict."""
    long_code = "def f(x):\n    return x\n" * 2000
    nested = "def f():\n    pass\n    return " + "(" * 5000 + ")" * 5000
    banner = "def f(s):\n    return s[::-1]\n" + "#" * 8000 + "\n" + "# x " * 2000  # no TODO
    started = time.perf_counter()
    assert not verifier_code_features._only_stubs(long_code)
    assert not verifier_code_features._only_stubs(nested)
    assert not verifier_code_features._only_stubs(banner)
    assert time.perf_counter() - started < 2.0
