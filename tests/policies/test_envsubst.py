"""`${VAR}` substitution stays linear on hostile text and says the same as it did.

The old substituter, kept inline as the reference, ran its pattern from every `${NAME:-`
to the end of a text with no `}` after it: quadratic (half a second for 16k characters
of `${A:-`). The property checks the new one against it on short random texts; the
timing compares a hostile text with a benign one of the same length, never with a
fixed time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from policies.document import FieldPath
from policies.envsubst import Substitution, substitute

# The substituter as it was (quadratic), the reference for the property.
OLD_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")
OLD_WHOLE_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
OLD_MALFORMED = "'${' must start ${NAME} or ${NAME:-default} (write $${ for a literal '${')"

PIECES = ["$", "{", "}", ":", "-", "A", "_", "x", "1", "${", "$$", ":-", "${A", "${x1"]
NAMES = ["A", "_", "x", "x1", "A_", "_1"]
VALUES = ["", "v", "$", "}", "${A}", "long-enough"]
HOSTILE_CHARS = 64_000
MAX_SLOWDOWN = 20  # linear: a few times the benign text's time; quadratic: thousands


def old_substitute(data: Any, env: Mapping[str, str]) -> Substitution:
    result = Substitution()
    result.data = _OldSubstituter(env, result).value(data, ())
    return result


class _OldSubstituter:
    def __init__(self, env: Mapping[str, str], result: Substitution) -> None:
        self.env = env
        self.result = result

    def value(self, data: Any, path: FieldPath) -> Any:
        if isinstance(data, dict):
            return {key: self.value(item, (*path, key)) for key, item in data.items()}
        if isinstance(data, list):
            return [self.value(item, (*path, index)) for index, item in enumerate(data)]
        if isinstance(data, str) and "$" in data:
            return self.string(data, path)
        return data

    def string(self, text: str, path: FieldPath) -> str | None:
        whole = OLD_WHOLE_VARIABLE.fullmatch(text)
        if whole is not None and not self.env.get(whole[1]):
            self.result.references[path] = [whole[1]]
            self.result.unset[path] = [whole[1]]
            return None
        names: list[str] = []
        missing: list[str] = []

        def replace(match: re.Match[str]) -> str:
            name, default = match[1], match[2]
            if match[0] == "$$":
                return "$"
            if name is None:
                self.result.problems.append((path, OLD_MALFORMED))
                return match[0]
            names.append(name)
            value = self.env.get(name)
            if value:
                self.result.secrets[value] = name
                return value
            if default is None:
                missing.append(name)
            return default or ""

        substituted = OLD_VARIABLE.sub(replace, text)
        if names:
            self.result.references[path] = names
        for name in missing:
            message = (
                f"${{{name}}} is not set; inside a longer string it needs a value or a"
                f" default (${{{name}:-default}})"
            )
            self.result.problems.append((path, message))
        return substituted


def outcome(result: Substitution) -> tuple[Any, ...]:
    """What a substitution said (the old one noted no empty variables)."""
    return result.data, result.references, result.unset, result.secrets, result.problems


texts = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
envs = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), max_size=4)


@given(texts, envs)
def test_substitution_says_what_the_old_one_did(text: str, env: dict[str, str]) -> None:
    data = {"whole": text, "inside": ["a", text, f"{text}}}"]}
    assert outcome(substitute(data, env)) == outcome(old_substitute(data, env))


def best_of(runs: int, work: Callable[[], object]) -> float:
    """The shortest of `runs` timings of `work`: the least disturbed by other load."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def test_a_hostile_text_costs_about_what_a_benign_one_does() -> None:
    """64k characters of `${A:-` with no `}` (the old code: seconds) against as many of
    closed variables."""
    hostile = "${A:-" * (HOSTILE_CHARS // len("${A:-"))
    benign = "${A:-x}" * (len(hostile) // len("${A:-x}"))
    benign += "x" * (len(hostile) - len(benign))
    assert len(hostile) == len(benign) == HOSTILE_CHARS
    result = substitute({"value": hostile}, {})
    assert result.data == {"value": hostile}
    assert len(result.problems) == hostile.count("${")
    slowdown = best_of(3, lambda: substitute(hostile, {})) / best_of(
        3, lambda: substitute(benign, {})
    )
    assert slowdown < MAX_SLOWDOWN


def test_a_text_with_a_close_far_on_is_one_variable() -> None:
    """`${A:-` many times, then `}`: one variable whose default is all the rest."""
    text = "${A:-" * 1000 + "}"
    assert substitute(text, {}).data == text[len("${A:-") : -1]
    assert substitute(text, {"A": "value"}).data == "value"


def test_a_variable_set_but_empty_is_noted_as_empty() -> None:
    """Set to "" it gives no value, as unset does; only the empty ones are noted."""
    data = {"whole": "${A}", "inside": "x${B:-}${C:-}${D:-d}", "set": "${E}"}
    result = substitute(data, {"A": "", "B": "", "E": "value"})
    assert result.data == {"whole": None, "inside": "xd", "set": "value"}
    assert result.unset == {("whole",): ["A"]}
    assert result.empty == {"A", "B"}
