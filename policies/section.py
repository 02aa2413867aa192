"""What every policy section shares: unknown fields are errors, cross-section problems
carry their field paths, and the common number types."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Loc = tuple[str | int, ...]
PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


class CrossReferenceError(ValueError):
    """Several problems between sections (or between a model's fields), each with the
    field path it concerns, relative to the model that raised it."""

    def __init__(self, problems: list[tuple[Loc, str]]) -> None:
        super().__init__("; ".join(message for _, message in problems))
        self.problems = problems


class Section(BaseModel):
    """A policy section: unknown fields are errors, with their path."""

    model_config = ConfigDict(extra="forbid")
