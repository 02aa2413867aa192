"""The closed-form verifier's features: cheap signals read from a prompt and an answer
(format, refusals, truncation, requested JSON, repetition, worked arithmetic, token
logprobs, second opinions, code runs), keyed by ``FEATURE_NAMES``, the artifact's
column order. ``router.verifier`` weighs them; code answers are read by
``router.verifier_code_features``.

    extract_features("What is 2 + 3?", "2 + 3 = 5", Signals(finish_reason="stop"))
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.answers import (
    MC_OPTION,
    NUMBER,
    PromptKind,
    agreement,
    chosen_options,
    code_agreement,
    final_number,
    parse_number,
    prompt_kind,
)
from router.arithmetic import check_arithmetic
from router.code_examples import ExampleRun
from router.text import head_and_tail
from router.verifier_code_features import (
    CODE_RUN_FEATURES,
    NO_CODE_FEATURES,
    code_features,
    code_run_features,
)

# Order is the artifact's column order; changing it means retraining.
FEATURE_NAMES: tuple[str, ...] = (
    "empty",
    "very_short",
    "log_answer_chars",
    "finish_length",
    "ends_mid_sentence",
    "unbalanced_fences",
    "unbalanced_brackets",
    "refusal",
    "hedge",
    "json_requested",
    "json_invalid",
    "json_schema_mismatch",
    "mc_prompt",
    "mc_no_clear_option",
    "math_prompt",
    "math_no_number",
    "math_final_marker",
    "code_prompt",
    "code_missing",
    "code_other_language",
    "code_lines",
    "code_no_function",
    "code_stub",
    "repetition",
    "degenerate_loop",
    "no_logprobs",
    "logprob_mean",
    "logprob_min",
    "logprob_low_share",
    "math_steps",
    "math_wrong_step",
    "math_unused_numbers",
    "math_final_not_derived",
    "math_fractional_count",
    "prompt_difficulty",
    "sample_agreement",
    "code_agreement",
    *CODE_RUN_FEATURES,
)


MAX_ANALYSED_CHARS = 4000  # word and repetition statistics look at the head only
# A long prompt is read at its head (a system prompt) and tail (the question): its scans
# stay bounded (unbounded, a 4 MB conversation took 1.1 s). Training prompts are shorter.
MAX_PROMPT_CHARS = 16_000
MAX_ARITHMETIC_CHARS = 8000  # worked steps are checked in the head of long answers
BARE_ANSWER_WORDS = 8  # up to this, an answer without worked steps is a bare answer
LOW_LOGPROB = math.log(0.1)  # a token the model gave under 10% probability
# Logprob features are centred on typical values so that "absent" (0.0) is neutral.
TYPICAL_MEAN_LOGPROB = -0.3
TYPICAL_MIN_LOGPROB = -4.0
TYPICAL_LOW_SHARE = 0.05

JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
    "null": type(None),
}
# An answer that opens by declining. "Unfortunately" only before "I" (the shipped data's
# cut-off "Unfortunately I"; "Unfortunately for Pluto fans, no." answers), and "I do not"
# only as not having or knowing ("I don't think so; it is 4" answers).
_REFUSAL = re.compile(
    r"^\W*(?:i'?m sorry|i am sorry|sorry,|i apologi[sz]e|as an ai\b|unfortunately,? i\b|"
    r"i (?:cannot|can'?t|can not|won'?t|will not|am unable|am not able)\b|"
    r"i'?m (?:unable|not able)\b|i (?:do not|don'?t) (?:have|know)\b)"
)
_AS_AN_AI = re.compile(r"\bas an ai(?: language model)?\b")
_HEDGE = re.compile(
    r"\b(i'?m not sure|i am not sure|not certain|it depends|hard to say|difficult to say|"
    r"cannot be determined|can'?t be determined|unclear|i'?m not able to)\b"
)
_PLAIN_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# A maths answer without digits may still give a number ("Four.") or answer a yes/no
# question ("Is 7 * 8 greater than 50?" "Yes.").
_NUMBER_WORD = re.compile(
    r"\b(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|"
    r"fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|"
    r"seventy|eighty|ninety|hundred|thousand|million|billion|half|quarter|none)\b",
    re.IGNORECASE,
)
# (Its runs of text are possessive: one that gave back its spaces to the `\s*` after it
# matched nothing more, in time quadratic in the run of spaces.)
_YES_NO_QUESTION = re.compile(
    r"\byes or no\b|\btrue or false\b|(?:^|[.!?]\s+)(?:is|are|was|were|does|do|did|can|could|"
    r"will|would|should|has|have)\b[^.!?]*+\?\s*(?:answer\b[^.!?]*+[.!?]?\s*)?$",
    re.IGNORECASE,
)
_STEP_RESULT = re.compile(r"=\s*\$?(-?\d[\d,]*(?:\.\d+)?)")  # what a worked step computed
_COUNT_QUESTION = re.compile(r"\bhow many\b", re.IGNORECASE)
_FINAL_MARKER = re.compile(r"####|\\boxed|answer is|answer:|final answer|total of|= *\$?\d")
_JSON_PROMPT = re.compile(r"\bjson\b", re.IGNORECASE)
# A prompt that asks for JSON output, not one about JSON ("What is JSON?", "parse JSON in
# Python"): "respond in JSON", "return it as a JSON object", "valid JSON", "JSON only".
_JSON_REQUEST = re.compile(
    r"\b(?:respond|reply|answer|output|return|give|provide|format|write|produce|generate|"
    r"print|emit|express)\w*\b[^.?!\n]{0,60}?\b(?:in|as|with|using|into)\s+"
    r"(?:(?:a|an|the|valid|strict|proper|pure|plain)\s+)*json\b"
    r"|\bvalid json\b|\bjson only\b|\bonly (?:valid )?json\b"
    r"|\bjson (?:object|array)s? (?:with|that|containing)\b|\bfollowing json schema\b",
    re.IGNORECASE,
)
# An answer that tries to be JSON: it opens with an object or array, or a json fence.
_JSON_ATTEMPT = re.compile(r"^\s*[\[{]|```json", re.IGNORECASE)
# (Possessive `\s*+`: the lazy body is looked for once, not once per space given back.)
_JSON_FENCE = re.compile(r"```(?:json)?\s*+(.*?)```", re.DOTALL | re.IGNORECASE)
_WORD = re.compile(r"\w+")
_TERMINAL = frozenset(".!?)]}\"'`*:;>")
_BRACKETS = {"(": ")", "[": "]", "{": "}"}


@dataclass(frozen=True)
class Signals:
    """What a verifier sees besides the text: the upstream's metadata."""

    logprobs: Sequence[float] | None = None
    response_format: Mapping[str, Any] | None = None
    finish_reason: str | None = None
    # The complexity classifier's score of the prompt: on answers whose text says
    # nothing (a bare option letter), how hard the question is decides the order.
    prompt_score: float | None = None
    # Other answers to the same request (second opinions, or more samples of the same
    # model): agreeing on the final answer (or code alike) is evidence the answer is right.
    samples: Sequence[str] = ()
    # The question itself (a chat's user turns), where its kind and numbers are read;
    # None or empty: the prompt. A route's system prompt ("put code in ``` fences") is
    # shared by every request on the route and says nothing about what this one asks.
    question: str | None = None
    # The answer's code run against the examples it claims (`router.sandbox`, where the
    # route or caller switches it on); None: not run, the two features unknown.
    code_run: ExampleRun | None = None


def extract_features(prompt: str, response: str, signals: Signals) -> dict[str, float]:
    """All verifier features for one answer, keyed by ``FEATURE_NAMES``."""
    answer = response.strip()
    lowered = answer.lower().replace("\u2019", "'")
    words = _WORD.findall(lowered[:MAX_ANALYSED_CHARS])
    prompt = head_and_tail(prompt, MAX_PROMPT_CHARS)
    question = head_and_tail(signals.question, MAX_PROMPT_CHARS) if signals.question else prompt
    kind = prompt_kind(question)
    features = {
        **_length_features(prompt, answer, len(words)),
        **_truncation_features(answer, len(words), signals.finish_reason),
        "refusal": float(bool(_REFUSAL.match(lowered) or _AS_AN_AI.search(lowered))),
        "hedge": float(bool(_HEDGE.search(lowered))),
        **_json_features(prompt, answer, signals.response_format, kind),
        **_format_features(prompt, question, answer, kind),
        **_repetition_features(words, lowered[:MAX_ANALYSED_CHARS]),
        **_logprob_features(signals.logprobs),
        **_arithmetic_features(question, answer, kind),
        "prompt_difficulty": _logit(signals.prompt_score),
        # NaN (neutral) without samples, or when no final answers can be compared.
        "sample_agreement": agreement(question, answer, signals.samples),
        "code_agreement": code_agreement(question, answer, signals.samples),
        **code_run_features(signals.code_run),
    }
    return {name: features[name] for name in FEATURE_NAMES}


def _length_features(prompt: str, answer: str, words: int) -> dict[str, float]:
    # The answer's own length only: its length relative to the prompt would smuggle in
    # the prompt's length, a prompt-level signal that prompt_difficulty carries.
    short = words < 3 and not MC_OPTION.search(prompt)
    return {
        "empty": float(not answer),
        "very_short": float(bool(answer) and short),
        "log_answer_chars": math.log1p(len(answer)),
    }


def _truncation_features(answer: str, words: int, finish_reason: str | None) -> dict[str, float]:
    long_form = words >= 8
    mid_sentence = long_form and answer[-1] not in _TERMINAL and not answer[-1].isdigit()
    return {
        "finish_length": float(finish_reason == "length"),
        "ends_mid_sentence": float(mid_sentence),
        "unbalanced_fences": float(answer.count("```") % 2 == 1),
        "unbalanced_brackets": float(_brackets_unbalanced(_code_text(answer))),
    }


def _code_text(answer: str) -> str:
    """The fenced code if there is any (prose often has stray ``1)`` list markers)."""
    parts = answer.split("```")
    return "".join(parts[1::2]) if len(parts) > 1 else answer


def _brackets_unbalanced(text: str) -> bool:
    """Counts, not nesting order: a C-speed check that catches cut-off code."""
    return any(text.count(opener) != text.count(closer) for opener, closer in _BRACKETS.items())


def _json_features(
    prompt: str, answer: str, response_format: Mapping[str, Any] | None, prompt_kind: PromptKind
) -> dict[str, float]:
    kind = (response_format or {}).get("type")
    strict = kind in ("json_object", "json_schema")
    # Asked for JSON, or a prompt that names JSON answered with an attempt at it; on a
    # code question ("write a Python function that returns JSON") the answer is code.
    requested = strict or (
        prompt_kind != "code"
        and (
            bool(_JSON_REQUEST.search(prompt))
            or bool(_JSON_ATTEMPT.search(answer) and _JSON_PROMPT.search(prompt))
        )
    )
    if not requested:
        return {"json_requested": 0.0, "json_invalid": 0.0, "json_schema_mismatch": 0.0}
    parsed, ok = _parse_json(answer, lenient=not strict)
    schema = _schema_of(response_format) if ok else None
    mismatch = (kind == "json_object" and not isinstance(parsed, dict)) or (
        schema is not None and not schema_matches(parsed, schema)
    )
    return {
        "json_requested": 1.0,
        "json_invalid": float(not ok),
        "json_schema_mismatch": float(ok and mismatch),
    }


def breaks_format(answer: str, response_format: Mapping[str, Any] | None) -> bool:
    """Does the answer break the JSON a strict `response_format` asks for (does not
    parse, or does not fit its schema)? No reading of its content can redeem that."""
    if (response_format or {}).get("type") not in ("json_object", "json_schema"):
        return False
    found = _json_features("", answer, response_format, None)
    return bool(found["json_invalid"] or found["json_schema_mismatch"])


def _parse_json(answer: str, *, lenient: bool) -> tuple[Any, bool]:
    """Parse the answer; ``lenient`` also accepts JSON inside a code fence."""
    candidates = [answer]
    if lenient:
        candidates += [match.strip() for match in _JSON_FENCE.findall(answer)]
    for text in candidates:
        try:
            return json.loads(text), True
        except (ValueError, RecursionError):  # nested past the parser's depth: not usable
            continue
    return None, False


def _schema_of(response_format: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not response_format or response_format.get("type") != "json_schema":
        return None
    wrapper = response_format.get("json_schema") or {}
    schema = wrapper.get("schema") if isinstance(wrapper, Mapping) else None
    return schema if isinstance(schema, Mapping) else None


def schema_matches(value: Any, schema: Mapping[str, Any]) -> bool:
    """A minimal JSON Schema check: top-level ``type``, ``required`` keys, property types."""
    if not _type_matches(value, schema.get("type")):
        return False
    if not isinstance(value, dict):
        return True
    if any(key not in value for key in schema.get("required", ())):
        return False
    properties = schema.get("properties") or {}
    return all(
        _type_matches(value[key], sub.get("type"))
        for key, sub in properties.items()
        if key in value and isinstance(sub, Mapping)
    )


def _type_matches(value: Any, expected: Any) -> bool:
    if expected is None:
        return True
    names = expected if isinstance(expected, list) else [expected]
    return any(_is_json_type(value, name) for name in names)


def _is_json_type(value: Any, name: str) -> bool:
    python_type = JSON_TYPES.get(name)
    if python_type is None or not isinstance(value, python_type):
        return False
    # bool is an int subclass in Python but not a JSON number.
    return not (isinstance(value, bool) and name in ("number", "integer"))


def _format_features(prompt: str, question: str, answer: str, kind: PromptKind) -> dict[str, float]:
    mc, math_prompt, code = kind == "mc", kind == "math", kind == "code"
    return {
        "mc_prompt": float(mc),
        "mc_no_clear_option": float(mc and len(chosen_options(answer)) != 1),
        "math_prompt": float(math_prompt),
        "math_no_number": float(
            math_prompt
            and not NUMBER.search(answer)
            and not _NUMBER_WORD.search(answer)
            and not _YES_NO_QUESTION.search(_last_block(question))
        ),
        "math_final_marker": float(math_prompt and bool(_FINAL_MARKER.search(answer.lower()))),
        "code_prompt": float(code),
        **(code_features(prompt, question, answer) if code else NO_CODE_FEATURES),
    }


def _repetition_features(words: list[str], lowered: str) -> dict[str, float]:
    grams = [tuple(words[i : i + 4]) for i in range(len(words) - 3)]
    repeated = 1.0 - len(set(grams)) / len(grams) if len(grams) >= 20 else 0.0
    lines = [line.strip() for line in lowered.splitlines() if len(line.strip()) > 10]
    most = max(Counter(lines).values(), default=0)
    return {"repetition": repeated, "degenerate_loop": float(most >= 4 or repeated > 0.6)}


def _logprob_features(logprobs: Sequence[float] | None) -> dict[str, float]:
    # A log probability is at most 0: a larger one (a broken upstream) counts as certain.
    values = [min(0.0, max(-20.0, float(v))) for v in logprobs or () if math.isfinite(v)]
    if not values:
        return {
            "no_logprobs": 1.0,
            "logprob_mean": 0.0,
            "logprob_min": 0.0,
            "logprob_low_share": 0.0,
        }
    low_share = sum(v < LOW_LOGPROB for v in values) / len(values)
    return {
        "no_logprobs": 0.0,
        "logprob_mean": sum(values) / len(values) - TYPICAL_MEAN_LOGPROB,
        "logprob_min": max(-10.0, min(values)) - TYPICAL_MIN_LOGPROB,
        "logprob_low_share": low_share - TYPICAL_LOW_SHARE,
    }


def _arithmetic_features(prompt: str, answer: str, kind: PromptKind) -> dict[str, float]:
    """Worked steps checked (``router.arithmetic``) and, on maths questions: the share
    of the question's numbers the answer never uses (a skipped fact), a final answer
    that no step computed (worked steps, then a number from nowhere), and a fractional
    answer to "how many" (a count)."""
    head = answer[:MAX_ARITHMETIC_CHARS]
    checked, wrong = check_arithmetic(head)
    features = {
        "math_steps": math.log1p(checked),
        "math_wrong_step": float(wrong > 0),
        "math_unused_numbers": 0.0,
        "math_final_not_derived": 0.0,
        "math_fractional_count": 0.0,
    }
    if kind != "math":
        return features
    question = _numbers(_last_block(prompt))
    # A bare answer ("4" to "What is 2 + 2?") restates none of the question's numbers by
    # nature: only an answer that shows its working can skip a fact.
    bare = checked == 0 and len(head.split()) <= BARE_ANSWER_WORDS
    if question and not bare:
        features["math_unused_numbers"] = len(question - _numbers(head)) / len(question)
    value = final_number(head)
    if value is not None:
        results = {parse_number(m) for m in _STEP_RESULT.findall(head)}
        derived = value in results or value in question
        features["math_final_not_derived"] = float(bool(results) and not derived)
        counts = bool(_COUNT_QUESTION.search(_last_block(prompt)))
        features["math_fractional_count"] = float(counts and value != round(value))
    return features


def _last_block(prompt: str) -> str:
    """The question: the last blank-line-separated block (few-shot examples come first)."""
    blocks = [block for block in prompt.split("\n\n") if block.strip()]
    return blocks[-1] if blocks else prompt


def _numbers(text: str) -> set[float]:
    return {float(match) for match in _PLAIN_NUMBER.findall(text.replace(",", ""))}


def _logit(probability: float | None) -> float:
    """The classifier score on the logit scale; NaN (treated as "unknown") when absent."""
    if probability is None or not math.isfinite(probability):
        return math.nan
    p = min(max(probability, 1e-6), 1.0 - 1e-6)
    return math.log(p / (1.0 - p))
