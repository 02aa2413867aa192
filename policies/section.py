"""What every policy section shares: unknown fields are errors, cross-section problems
carry their field paths, and the common number types.

Every number is finite (`.inf` and `.nan` are refused) and bounded well past any real
setting, so that what passes `policy check` also works where it is used: dollars as
integer nano-dollars, seconds as milliseconds, token counts in a request's JSON.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

Loc = tuple[str | int, ...]

MAX_USD = 1e9  # a budget: 1e18 nano-dollars, well within a 64-bit integer
MAX_USD_RATE = 1e6  # USD per million tokens ($1 a token), or per GPU-hour
# A timeout, interval, window, backoff or cooldown: 30 days, past "no timeout" for a batch
# job (as milliseconds, far within a 64-bit integer).
MAX_SECONDS = 30 * 86_400.0
MAX_MS = MAX_SECONDS * 1000
MIN_INTERVAL_S = 0.05  # polling more often burns a core for nothing
MIN_RELOAD_INTERVAL_S = 0.1  # a reload poll reads and hashes every policy file
MAX_COUNT = 10**9  # tokens, sequences, probes, restarts
MAX_RATE = 10**15  # requests or tokens a minute: past any limit, exact as a double
MAX_BYTES = 2**30  # a request body: 1 GiB
MIN_TOKENS_PER_SECOND = 0.01  # an assumed throughput: slower prices a token past reason


def empty_as_unset(value: object) -> object:
    """None for an empty string (a `${VAR:-}` whose VAR is unset), else `value`."""
    return None if value == "" else value


def unset_or_empty(names: Sequence[str], empty: Collection[str], verb: str = "") -> str:
    """How env vars `names` gave no value, `verb` before each state: `A, B unset`,
    `A empty` (set to ""), or one by one when they differ, `A unset, B empty`."""
    states = ["empty" if name in empty else "unset" for name in names]
    if len(set(states)) == 1:
        return f"{', '.join(names)} {verb}{states[0]}"
    return ", ".join(f"{name} {verb}{state}" for name, state in zip(names, states, strict=True))


PositiveInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
PerMinute = Annotated[int, Field(gt=0, le=MAX_RATE)]
Bytes = Annotated[int, Field(gt=0, le=MAX_BYTES)]
Usd = Annotated[float, Field(gt=0, le=MAX_USD)]
UsdRate = Annotated[float, Field(ge=0, le=MAX_USD_RATE)]
GpuHourUsd = Annotated[float, Field(gt=0, le=MAX_USD_RATE)]
TokensPerSecond = Annotated[float, Field(ge=MIN_TOKENS_PER_SECOND, le=MAX_COUNT)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
Milliseconds = Annotated[float, Field(gt=0, le=MAX_MS)]
Interval = Annotated[float, Field(ge=MIN_INTERVAL_S, le=MAX_SECONDS)]
# A value the environment may leave out (a secret, a URL): `${VAR:-}` with VAR unset
# means none, as an unset `${VAR}` does, never an empty string.
UnsetWhenEmpty = Annotated[str | None, BeforeValidator(empty_as_unset)]
Secret = UnsetWhenEmpty


class CrossReferenceError(ValueError):
    """Several problems between sections (or between a model's fields), each with the
    field path it concerns, relative to the model that raised it."""

    def __init__(self, problems: list[tuple[Loc, str]]) -> None:
        super().__init__("; ".join(message for _, message in problems))
        self.problems = problems


class Section(BaseModel):
    """A policy section: unknown fields are errors, with their path; floats are finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
