"""Reading a shipped model file: plain JSON, never a pickle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from router.errors import RoutingError


def read_artifact(source: Path, what: str) -> dict[str, Any]:
    """A model file's JSON; a RoutingError naming `what` when it cannot be read."""
    try:
        document: dict[str, Any] = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RoutingError(f"cannot read {what} {source}: {exc}") from exc
    return document


# The last line of the generated model cards: what is written by hand beside them.
DEFAULTS_LINK = (
    "\nShipped thresholds and fixed rules beside this model: [defaults.md](defaults.md).\n"
)
