"""Policy YAML as plain data plus where each value was written.

PyYAML's constructed objects forget their source positions, so the node tree from
`compose` is walked here instead: every value and every mapping key gets a `Mark`
under its path (`("deployments", "openai", "timeout_s")`), which is how validation
errors find their line. The walk also rejects what `yaml.safe_load` lets through
silently: duplicate keys and non-scalar keys. Merge keys (`<<: *anchor`) work.
Several files merge section by section (`merge_documents`); a name defined twice is
an error naming both files.

Parsing is bounded by the MAX_ constants below, so that no file can stall or exhaust
the process that reads it. The classic attack is a "billion laughs": a few hundred
bytes of anchors, each a list of aliases of the one before, ten deep, that stand for
9^10 values. Composing it is cheap (an alias is one shared node) but expanding it is
not, so the composer counts nodes, aliases and nesting, the walk counts every value it
visits with aliases expanded, and both stop at the first limit passed, naming the
file, line and column.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from policies.errors import PolicyError, Problem

# Real policies are a few hundred lines; each limit is far above that and far below
# what stalls a process. Aliases are expanded where it says so: each use of one counts
# what it names again.
MAX_FILE_BYTES = 1 << 20  # one policy file
MAX_TOTAL_BYTES = 4 << 20  # all the files of a policy directory together
MAX_ALIASES = 100  # uses of `*name` in one file
MAX_NODES = 100_000  # values and mapping keys of the whole policy, aliases expanded
MAX_DEPTH = 64  # lists and mappings nested in one another, aliases expanded
MAX_INTEGER_CHARS = 100  # PyYAML builds base-60 integers (1:30:00) in quadratic time

FieldPath = tuple[str | int, ...]
NodePair = tuple[yaml.Node, yaml.Node]
Sources = Sequence[tuple[Path, bytes]]

MERGE_TAG = "tag:yaml.org,2002:merge"
INT_TAG = "tag:yaml.org,2002:int"
SCALAR_SHOWN = 40  # characters of a bad scalar quoted in its message

FILE_TOO_BIG = (
    f"the file is larger than {MAX_FILE_BYTES >> 20} MiB; a policy file may have at most "
    f"{MAX_FILE_BYTES} bytes"
)
FILES_TOO_BIG = (
    f"with this file the policy's files are larger than {MAX_TOTAL_BYTES >> 20} MiB; "
    f"together they may have at most {MAX_TOTAL_BYTES} bytes"
)
TOO_MANY_ALIASES = (
    f"more than {MAX_ALIASES} aliases (*name) in one file; at most {MAX_ALIASES} are allowed"
)
TOO_DEEP = (
    f"lists and mappings nested more than {MAX_DEPTH} levels deep; "
    f"at most {MAX_DEPTH} levels are allowed"
)
TOO_MANY_NODES = (
    f"the policy expands to more than {MAX_NODES} values and keys; at most {MAX_NODES} "
    "are allowed (each use of an alias counts what it names again)"
)


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


def parse_documents(sources: Sources) -> list[Document]:
    """Parse a policy's files (path and bytes, in merge order) under one set of limits."""
    total = 0
    for file, raw in sources:
        total += len(raw)
        if len(raw) > MAX_FILE_BYTES or total > MAX_TOTAL_BYTES:
            message = FILE_TOO_BIG if len(raw) > MAX_FILE_BYTES else FILES_TOO_BIG
            raise PolicyError([Problem(file, None, None, "", message)])
    tally = _Tally()
    return [_parse(file, raw, tally) for file, raw in sources]


def parse_document(file: Path, raw: bytes) -> Document:
    """Parse one file's bytes; raise PolicyError for anything that is not a mapping."""
    [document] = parse_documents([(file, raw)])
    return document


def _parse(file: Path, raw: bytes, tally: _Tally) -> Document:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        message = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise PolicyError([Problem(file, None, None, "", message)]) from exc
    loader: _Composer | None = None
    try:
        # checks that every character is printable before composing anything
        loader = _Composer(text, file, MAX_NODES - tally.nodes)
        return _Walker(file, loader, tally).document()
    except yaml.MarkedYAMLError as exc:
        raise PolicyError([_yaml_problem(file, exc, text)]) from exc
    except yaml.reader.ReaderError as exc:
        raise PolicyError([_reader_problem(file, exc, text)]) from exc
    finally:
        if loader is not None:
            loader.dispose()


def merge_documents(documents: list[Document]) -> Document:
    """Merge per-file documents section by section; a name may be defined only once."""
    if len(documents) == 1:
        return documents[0]
    merged = Document({}, {(): documents[0].values[()]})
    problems: list[Problem] = []
    for document in documents:
        taken: dict[str, _Taken] = {}
        for section, value in document.data.items():
            problems.extend(_merge_section(merged, document, section, value, taken))
        _copy_marks(merged, document, taken)
    if problems:
        raise PolicyError(problems)
    return merged


# What a document's section added to the merge: all of it, its list items shifted right
# by an offset (an int), or the names of a mapping it added (a set).
_Taken = int | set[str]


def _merge_section(
    merged: Document, document: Document, section: str, value: Any, taken: dict[str, _Taken]
) -> Iterator[Problem]:
    existing = merged.data.get(section)
    if section not in merged.data:
        merged.data[section] = _shallow_copy(value)
        taken[section] = 0
    elif isinstance(existing, dict) and isinstance(value, dict):
        names: set[str] = set()
        taken[section] = names
        for name, item in value.items():
            if name in existing:
                yield _defined_twice(merged, document, (section, name))
            else:
                existing[name] = item
                names.add(name)
    elif isinstance(existing, list) and isinstance(value, list):
        taken[section] = len(existing)
        existing.extend(value)
    else:
        yield _defined_twice(merged, document, (section,))


def _shallow_copy(value: Any) -> Any:
    if isinstance(value, dict | list):
        return value.copy()
    return value


def _copy_marks(merged: Document, document: Document, taken: dict[str, _Taken]) -> None:
    """Copy the marks of what `document` added to the merge, in one pass over them."""
    for source, target in ((document.values, merged.values), (document.keys, merged.keys)):
        for path, mark in source.items():
            what = taken.get(str(path[0])) if path else None
            if what is None:
                continue
            if isinstance(what, set):
                if len(path) < 2 or path[1] not in what:
                    continue
            elif what and len(path) > 1 and isinstance(path[1], int):
                path = (path[0], path[1] + what, *path[2:])
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


def _reader_problem(file: Path, exc: yaml.reader.ReaderError, text: str) -> Problem:
    position = int(exc.position)
    line = text.count("\n", 0, position) + 1
    column = position - text.rfind("\n", 0, position)
    message = f"YAML does not allow the character U+{int(exc.character):04X} ({exc.reason})"
    return Problem(file, line, column, "", message)


def _limit(file: Path, mark: yaml.Mark | None, path: FieldPath, message: str) -> PolicyError:
    where = Mark.of(file, mark)
    dotted = ".".join(str(part) for part in path)
    return PolicyError([Problem(file, where.line, where.column, dotted, message)])


@dataclass(slots=True)
class _Tally:
    """Values and keys walked so far, across the files of one policy."""

    nodes: int = 0


class _Composer(yaml.SafeLoader):
    """SafeLoader that stops composing at the first limit passed.

    The composer recurses once per level of nesting (ten thousand `[` end in
    RecursionError without the depth limit), and composes the whole file before the walk
    starts, so the nodes are counted here too: `allowed` is what the policy's earlier
    files left. Each alias is one node here; the walk counts what it names.
    """

    def __init__(self, text: str, file: Path, allowed: int) -> None:
        super().__init__(text)
        self.file = file
        self.allowed = allowed
        self.aliases = 0
        self.nodes = 0
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        aliased = self.check_event(yaml.AliasEvent)
        nests = self.check_event(yaml.CollectionStartEvent)
        mark = self.current_event.start_mark  # of the event the checks peeked at
        self.aliases += aliased
        self.nodes += not aliased
        self.depth += nests
        try:
            if self.aliases > MAX_ALIASES:
                raise _limit(self.file, mark, (), TOO_MANY_ALIASES)
            if self.nodes > self.allowed:
                raise _limit(self.file, mark, (), TOO_MANY_NODES)
            if self.depth > MAX_DEPTH:
                raise _limit(self.file, mark, (), TOO_DEEP)
            return super().compose_node(parent, index)
        finally:
            self.depth -= nests


class _Walker:
    """Turns one composed node tree into a Document, collecting every problem."""

    def __init__(self, file: Path, loader: yaml.SafeLoader, tally: _Tally) -> None:
        self.file = file
        self.loader = loader
        self.tally = tally
        self.values: dict[FieldPath, Mark] = {}
        self.keys: dict[FieldPath, Mark] = {}
        self.problems: list[Problem] = []
        self._active: set[int] = set()
        self._marks: dict[int, Mark] = {}  # by node: aliases reuse nodes, and so marks

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
        self._count(node, path)
        self.values[path] = self._mark(node)
        if id(node) in self._active:
            self._problem(node, path, "an alias refers to a node that contains it")
            return None
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if len(path) >= MAX_DEPTH:  # the composer saw less: aliases nest what they name
            raise _limit(
                self.file, node.start_mark, path, f"{TOO_DEEP} (counting what aliases name)"
            )
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            return [self._value(item, (*path, index)) for index, item in enumerate(node.value)]
        finally:
            self._active.discard(id(node))

    def _scalar(self, node: yaml.ScalarNode, path: FieldPath) -> Any:
        text = str(node.value)
        if node.tag == INT_TAG and len(text) > MAX_INTEGER_CHARS:
            message = (
                f"an integer of {len(text)} characters; at most {MAX_INTEGER_CHARS} are allowed"
            )
            self._problem(node, path, message)
            return None
        try:
            return self.loader.construct_object(node, deep=True)
        except (ValueError, LookupError, AttributeError) as exc:
            # PyYAML's scalar constructors trust the value to fit its tag; one that does
            # not (2020-13-45, `!!int x`, `!!timestamp 20`) fails with what Python raises.
            self.loader.recursive_objects.pop(node, None)  # or a later alias reads as a loop
            shown = text if len(text) <= SCALAR_SHOWN else text[:SCALAR_SHOWN] + "..."
            message = f"'{shown}' is not a valid {node.tag.rsplit(':', 1)[-1]}"
            if isinstance(exc, ValueError):  # the others say nothing a reader could use
                message += f" ({exc})"
            self._problem(node, path, message)
            return None

    def _count(self, node: yaml.Node, path: FieldPath, nodes: int = 1) -> None:
        self.tally.nodes += nodes
        if self.tally.nodes > MAX_NODES:
            raise _limit(self.file, node.start_mark, path, TOO_MANY_NODES)

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
            self.keys[child] = self._mark(key_node)
            result[key] = self._value(value_node, child)
        for key_node, value_node in inherited:
            key = self._key(key_node, path)
            if key is not None and key not in result:
                self.keys[(*path, key)] = self._mark(key_node)
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
                self._count(source, (), len(source.value))  # `<<` copies its entries
                self._active.add(id(source))
                own, more = self._entries(source)
                self._active.discard(id(source))
                inherited.extend([*own, *more])
        return explicit, inherited

    def _key(self, node: yaml.Node, path: FieldPath) -> str | None:
        self._count(node, path)
        if isinstance(node, yaml.ScalarNode):
            return str(node.value)
        self._problem(node, path, "mapping keys must be plain names, not lists or mappings")
        return None

    def _mark(self, node: yaml.Node) -> Mark:
        mark = self._marks.get(id(node))
        if mark is None:
            mark = self._marks[id(node)] = Mark.of(self.file, node.start_mark)
        return mark

    def _problem(self, node: yaml.Node, path: FieldPath, message: str) -> None:
        mark = self._mark(node)
        dotted = ".".join(str(part) for part in path)
        self.problems.append(Problem(self.file, mark.line, mark.column, dotted, message))
