"""`${VAR}` and `${VAR:-default}` in policy strings, filled from an env mapping.

Rules, shell-like:
- `${VAR}` is VAR's value; `${VAR:-text}` falls back to `text` when VAR is unset or empty.
- A value that is exactly `${VAR}` with VAR unset (or empty) becomes null: the field is
  left unset, recorded so the gateway can say why (a key disabled, a provider without
  its API key). Inside a longer string an unset VAR without default is an error.
- `$$` is a literal `$`.
Mapping keys are names, never substituted. Values read from the environment are kept
so error messages can be scrubbed of them, and the variables set but empty so that
messages can tell them from unset ones. Linear in the text, hostile text too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.document import FieldPath

VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")
# Past a text's last '}' no variable can close, so only these match there; VARIABLE
# would scan on to the end from every `${NAME:-` there, quadratic in a hostile value.
UNCLOSED = re.compile(r"\$\$|\$\{")
WHOLE_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(slots=True)
class Substitution:
    """The substituted data and what happened along the way, by path."""

    data: Any = None
    references: dict[FieldPath, list[str]] = field(default_factory=dict)
    unset: dict[FieldPath, list[str]] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)  # env value -> var name
    empty: set[str] = field(default_factory=set)  # vars referenced that are set to ""
    problems: list[tuple[FieldPath, str]] = field(default_factory=list)


def substitute(data: Any, env: Mapping[str, str]) -> Substitution:
    """Replace variables in every string value of `data` (which is not modified)."""
    result = Substitution()
    result.data = _Substituter(env, result).value(data, ())
    return result


class _Substituter:
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
        whole = WHOLE_VARIABLE.fullmatch(text)
        if whole is not None and self.lookup(whole[1]) is None:
            self.result.references[path] = [whole[1]]
            self.result.unset[path] = [whole[1]]
            return None
        names: list[str] = []
        missing: list[str] = []

        def replace(match: re.Match[str]) -> str:
            if match[0] == "$$":
                return "$"
            if match[0] == "${":  # no `NAME}` or `NAME:-...}` follows
                self.result.problems.append((path, _MALFORMED))
                return match[0]
            name, default = match[1], match[2]
            names.append(name)
            value = self.lookup(name)
            if value:
                self.result.secrets[value] = name
                return value
            if default is None:
                missing.append(name)
            return default or ""

        end = text.rfind("}") + 1
        substituted = VARIABLE.sub(replace, text[:end]) + UNCLOSED.sub(replace, text[end:])
        if names:
            self.result.references[path] = names
        for name in missing:
            message = (
                f"${{{name}}} is not set; inside a longer string it needs a value or a"
                f" default (${{{name}:-default}})"
            )
            self.result.problems.append((path, message))
        return substituted

    def lookup(self, name: str) -> str | None:
        """VAR's value; None when it is unset or empty (an empty one is noted)."""
        value = self.env.get(name)
        if value == "":
            self.result.empty.add(name)
        return value or None


_MALFORMED = "'${' must start ${NAME} or ${NAME:-default} (write $${ for a literal '${')"
