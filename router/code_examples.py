"""The examples a code answer claims about itself, as a job for the sandbox.

Answers to "write a function" often show it at work: a doctest (``>>> f(2)`` then
``4``) or a call with its result in a comment (``print(f(2))  # Output: 4``). Running
the code and checking those claims (`router.sandbox`) tells a right answer from a wrong
one better than reading it. Pure text work, standard library only.

    job = code_job(answer)  # CodeJob(code="def f(x): ...", examples=(("f(2)", "4"),))
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from router.answers import MAX_CODE_CHARS, code_text

MAX_EXAMPLES = 10
MAX_EXAMPLE_CHARS = 500
_PROMPT = re.compile(r"^[ \t]*>>>[ \t]?(.*)$")
_CONTINUATION = re.compile(r"^[ \t]*\.\.\.[ \t]?(.*)$")
_FENCE_LINE = re.compile(r"^[ \t]*```")
# A call and its claimed result in a trailing comment: "print(f(2))  # Output: 4",
# "f(2)  # returns 4", "f(2)  # -> 4". The line is split at its last "#" first, so
# that neither pattern backtracks over the other's part (linear on any line).
_CALL = re.compile(r"print\((?P<printed>.+)\)|(?P<call>[A-Za-z_][\w.]*\(.*\))")
_RESULT_WORD = re.compile(
    r"(?:(?:output|outputs|returns?|expected(?: output)?|prints?|result)\b:?|->|=>|:)?",
    re.IGNORECASE,
)
# Comments that describe rather than state a result ("# call the function").
_PROSE = ("this", "the ", "should", "call", "example", "test", "check", "print", "output")


@dataclass(frozen=True, slots=True)
class CodeJob:
    """Code to define, and (source, expected) examples to check against it."""

    code: str
    examples: tuple[tuple[str, str], ...]
    stated: int = 0  # the first `stated` examples are the prompt's tests, not the answer's


@dataclass(frozen=True, slots=True)
class ExampleRun:
    """What running a job found: examples that held and that failed. Code that does
    not even define (it raises, or the run is killed first) fails every example."""

    passed: int
    failed: int
    tests: int = 0  # of those checked, the prompt's stated tests (`CodeJob.stated`)
    tests_failed: int = 0

    @property
    def checked(self) -> int:
        return self.passed + self.failed

    @property
    def held(self) -> bool:
        """Every example checked held (none failed)."""
        return self.failed == 0


def code_job(answer: str, tests: tuple[tuple[str, str], ...] = ()) -> CodeJob | None:
    """The answer's code (doctest lines taken out) and the examples it claims, after
    ``tests`` (the prompt's own); None when it has no code or nothing checkable."""
    if len(answer) > MAX_CODE_CHARS:
        return None  # its code would be cut, and fail for that alone
    code = code_text(answer)
    if not code.strip():
        return None
    doctests, code = _doctests(code)
    claimed = doctests + _doctests(_prose(answer))[0] + _commented(code)
    claimed = [e for e in dict.fromkeys(claimed) if max(map(len, e)) <= MAX_EXAMPLE_CHARS]
    examples = [*tests, *(e for e in claimed if e not in tests)][: len(tests) + MAX_EXAMPLES]
    if not examples:
        return None
    return CodeJob(code, tuple(examples), stated=len(tests))


def _prose(answer: str) -> str:
    """The answer outside its code fences (doctests are often shown there)."""
    return "\n".join(answer.split("```")[::2])


def _doctests(text: str) -> tuple[list[tuple[str, str]], str]:
    """Doctest examples in ``text`` and the text without them: ``>>> source`` (with
    ``...`` continuations), then the expected lines up to a blank line or the next
    prompt."""
    examples: list[tuple[str, str]] = []
    kept: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        prompt = _PROMPT.match(lines[i])
        if not prompt:
            kept.append(lines[i])
            i += 1
            continue
        source = [prompt.group(1)]
        i += 1
        while i < len(lines) and (more := _CONTINUATION.match(lines[i])):
            source.append(more.group(1))
            i += 1
        want = []
        while (
            i < len(lines)
            and lines[i].strip()
            and not _PROMPT.match(lines[i])
            and not _FENCE_LINE.match(lines[i])
        ):
            want.append(lines[i].strip())
            i += 1
        if want and source[0].strip():
            examples.append(("\n".join(source).strip(), "\n".join(want)))
    return examples, "\n".join(kept)


def _commented(code: str) -> list[tuple[str, str]]:
    examples = []
    for line in code.splitlines():
        source, hash_sign, comment = line.rpartition("#")
        call = _CALL.fullmatch(source.strip()) if hash_sign else None
        if call is None:
            continue
        claim = comment.strip()
        word = _RESULT_WORD.match(claim)  # always matches, if only the empty string
        want = claim[word.end() if word else 0 :].strip().strip("`").strip()
        if want and not want.lower().startswith(_PROSE):
            examples.append((call.group("printed") or call.group("call"), want))
    return examples
