"""Policy YAML as plain data plus where each value was written.

PyYAML's constructed objects forget their source positions, so the node tree from
`compose` is walked here instead: every value and every mapping key gets a `Mark`
under its path (`("deployments", "openai", "timeout_s")`), which is how validation
errors find their line. The walk also rejects what `yaml.safe_load` lets through
silently: duplicate keys and non-scalar keys. Merge keys (`<<: *anchor`) work.
Several files merge section by section (`merge_documents`); a name defined twice is
an error naming both files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from policies.errors import PolicyError, Problem

FieldPath = tuple[str | int, ...]
NodePair = tuple[yaml.Node, yaml.Node]

MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True, slots=True)
class Mark:
    """A 1-based position in a policy file."""

    file: Path
    line: int
    column: int

    @classmethod
    def of(cls, file: Path, mark: yaml.Mark | None) -> Mark:
        if mark is None:
            return cls(file, 1, 1)
        return cls(file, mark.line + 1, mark.column + 1)


@dataclass(slots=True)
class Document:
    """Plain data plus the mark of each value and of each mapping key, by path."""

    data: dict[str, Any]
    values: dict[FieldPath, Mark] = field(default_factory=dict)
    keys: dict[FieldPath, Mark] = field(default_factory=dict)

    def where(self, path: FieldPath) -> Mark | None:
        return self.values.get(path) or self.keys.get(path)


def parse_document(file: Path, raw: bytes) -> Document:
    """Parse one file's bytes; raise PolicyError for anything that is not a mapping."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        message = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise PolicyError([Problem(file, None, None, "", message)]) from exc
    loader = yaml.SafeLoader(text)
    try:
        return _Walker(file, loader).document()
    except yaml.MarkedYAMLError as exc:
        raise PolicyError([_yaml_problem(file, exc, text)]) from exc
    finally:
        loader.dispose()


def merge_documents(documents: list[Document]) -> Document:
    """Merge per-file documents section by section; a name may be defined only once."""
    if len(documents) == 1:
        return documents[0]
    merged = Document({}, {(): documents[0].values[()]})
    problems: list[Problem] = []
    for document in documents:
        for section, value in document.data.items():
            problems.extend(_merge_section(merged, document, section, value))
    if problems:
        raise PolicyError(problems)
    return merged


def _merge_section(
    merged: Document, document: Document, section: str, value: Any
) -> Iterator[Problem]:
    existing = merged.data.get(section)
    top: FieldPath = (section,)
    if section not in merged.data:
        merged.data[section] = _shallow_copy(value)
        _copy_marks(merged, document, top)
    elif isinstance(existing, dict) and isinstance(value, dict):
        for name, item in value.items():
            path: FieldPath = (section, name)
            if name in existing:
                yield _defined_twice(merged, document, path)
            else:
                existing[name] = item
                _copy_marks(merged, document, path)
    elif isinstance(existing, list) and isinstance(value, list):
        _copy_marks(merged, document, top, offset=len(existing))
        existing.extend(value)
    else:
        yield _defined_twice(merged, document, top)


def _shallow_copy(value: Any) -> Any:
    if isinstance(value, dict | list):
        return value.copy()
    return value


def _copy_marks(merged: Document, document: Document, prefix: FieldPath, offset: int = 0) -> None:
    """Copy the marks under `prefix`; `offset` shifts list indices right after it."""
    size = len(prefix)
    for source, target in ((document.values, merged.values), (document.keys, merged.keys)):
        for path, mark in source.items():
            if path[:size] != prefix:
                continue
            index = path[size] if len(path) > size else None
            if offset and isinstance(index, int):
                path = (*prefix, index + offset, *path[size + 1 :])
            target.setdefault(path, mark)


def _defined_twice(merged: Document, document: Document, path: FieldPath) -> Problem:
    first = merged.keys.get(path)
    second = document.keys.get(path) or Mark(document.values[()].file, 1, 1)
    dotted = ".".join(str(part) for part in path)
    first_at = f"{first.file}:{first.line}" if first is not None else "another file"
    message = f"'{dotted}' is defined in {first_at} and again in {second.file}:{second.line}"
    return Problem(second.file, second.line, second.column, dotted, message)


def _yaml_problem(file: Path, exc: yaml.MarkedYAMLError, text: str) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    where = Mark.of(file, mark)
    message = " ".join(part for part in (exc.context, exc.problem) if part) or "invalid YAML"
    lines = text.splitlines()
    line = lines[where.line - 1] if where.line <= len(lines) else ""
    if "flow" in message and "${" in line:
        message += " (inside [...] or {...}, quote values with ${VAR}: '${VAR}')"
    return Problem(file, where.line, where.column, "", f"YAML syntax error: {message}")


class _Walker:
    """Turns one composed node tree into a Document, collecting every problem."""

    def __init__(self, file: Path, loader: yaml.SafeLoader) -> None:
        self.file = file
        self.loader = loader
        self.values: dict[FieldPath, Mark] = {}
        self.keys: dict[FieldPath, Mark] = {}
        self.problems: list[Problem] = []
        self._active: set[int] = set()

    def document(self) -> Document:
        node = self.loader.get_single_node()
        self.values[()] = Mark(self.file, 1, 1)
        if node is None:  # an empty file
            return Document({}, self.values, self.keys)
        if not isinstance(node, yaml.MappingNode):
            self._problem(node, (), "the top level must be a mapping (deployments:, routes:, ...)")
            raise PolicyError(self.problems)
        data = self._mapping(node, ())
        if self.problems:
            raise PolicyError(self.problems)
        return Document(data, self.values, self.keys)

    def _value(self, node: yaml.Node, path: FieldPath) -> Any:
        self.values[path] = Mark.of(self.file, node.start_mark)
        if id(node) in self._active:
            self._problem(node, path, "an alias refers to a node that contains it")
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            if isinstance(node, yaml.SequenceNode):
                return [self._value(item, (*path, index)) for index, item in enumerate(node.value)]
            return self.loader.construct_object(node, deep=True)
        finally:
            self._active.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: FieldPath) -> dict[str, Any]:
        explicit, inherited = self._entries(node)
        result: dict[str, Any] = {}
        for key_node, value_node in explicit:
            key = self._key(key_node, path)
            if key is None:
                continue
            child = (*path, key)
            if key in result:
                first = self.keys[child].line
                self._problem(key_node, child, f"duplicate key '{key}' (first on line {first})")
                continue
            self.keys[child] = Mark.of(self.file, key_node.start_mark)
            result[key] = self._value(value_node, child)
        for key_node, value_node in inherited:
            key = self._key(key_node, path)
            if key is not None and key not in result:
                self.keys[(*path, key)] = Mark.of(self.file, key_node.start_mark)
                result[key] = self._value(value_node, (*path, key))
        return result

    def _entries(self, node: yaml.MappingNode) -> tuple[list[NodePair], list[NodePair]]:
        """The mapping's own entries, and those it inherits through `<<` (nearest first)."""
        explicit: list[NodePair] = []
        inherited: list[NodePair] = []
        for key_node, value_node in node.value:
            if key_node.tag != MERGE_TAG:
                explicit.append((key_node, value_node))
                continue
            sources = (
                value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            )
            for source in sources:
                if not isinstance(source, yaml.MappingNode) or id(source) in self._active:
                    self._problem(source, (), "'<<' merges only mappings, or a list of them")
                    continue
                self._active.add(id(source))
                own, more = self._entries(source)
                self._active.discard(id(source))
                inherited.extend([*own, *more])
        return explicit, inherited

    def _key(self, node: yaml.Node, path: FieldPath) -> str | None:
        if isinstance(node, yaml.ScalarNode):
            return str(node.value)
        self._problem(node, path, "mapping keys must be plain names, not lists or mappings")
        return None

    def _problem(self, node: yaml.Node, path: FieldPath, message: str) -> None:
        mark = Mark.of(self.file, node.start_mark)
        dotted = ".".join(str(part) for part in path)
        self.problems.append(Problem(self.file, mark.line, mark.column, dotted, message))
