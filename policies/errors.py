"""What is wrong with a policy, located in its YAML.

Hierarchy (one exception for the package):

    PolicyError            a policy that cannot be used; `.problems` lists every finding
      (each a Problem: file, line, column, dotted field path, message)

`str(PolicyError)` is one `FILE:LINE:COL: FIELD: MESSAGE` line per problem, the form
editors and CI logs turn into links. Messages never contain values taken from the
environment; they name the `${VAR}` instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding. `line` and `column` are 1-based; None when there is no line (a
    missing file). `field` is a dotted path such as `deployments.openai.timeout_s`."""

    file: Path
    line: int | None
    column: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = str(self.file)
        if self.line is not None:
            where = f"{where}:{self.line}:{self.column or 1}"
        if self.field:
            return f"{where}: {self.field}: {self.message}"
        return f"{where}: {self.message}"


class PolicyError(Exception):
    """A policy that failed to load; `problems` has every finding, in file order."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


def closest_spelling(name: str, names: Iterable[str]) -> str | None:
    """The name of `names` spelt most like `name`, if any is close."""
    guess = difflib.get_close_matches(name, list(names), n=1)
    return guess[0] if guess else None


def did_you_mean(guess: str | None, suffix: str = "") -> str:
    """The end of a message that suggests `guess` (then `suffix`); "" without one."""
    return f"; did you mean '{guess}{suffix}'?" if guess else ""
