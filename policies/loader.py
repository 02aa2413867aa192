"""Load a policy file or directory: parse, merge, substitute `${VAR}`, validate.

    loaded = load_policy(Path("policy.yaml"))       # env defaults to os.environ
    loaded.policy.routes["auto"].deployments

Every problem found is reported at once, each with its file, line and dotted field
(`PolicyError`): schema errors, the checks between sections (run on the entries that
are valid when others are not) and what this install cannot serve (a route's
classifier, a reference model with no price, a `select` candidate with none). Only a
YAML syntax error, or a file past one of the size limits in `policies.document`, stops
the rest.
What this install can serve is asked of the caller (an `InstallCheck`: the gateway knows
its router's classifiers and quality profiles), so the policies import nothing above them.
Secrets are never echoed: messages name the `${VAR}` a value came from, and any
environment value that slips into a message is replaced by its name.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from policies.document import (
    MAX_FILE_BYTES,
    MAX_TOTAL_BYTES,
    Document,
    FieldPath,
    Mark,
    merge_documents,
    parse_documents,
)
from policies.envsubst import Substitution, substitute
from policies.errors import PolicyError, Problem, closest_spelling, did_you_mean
from policies.prices import litellm_price_map, litellm_rates
from policies.schema import Deployment, Policy
from policies.section import CrossReferenceError, unset_or_empty
from policies.sections import Sections

POLICY_SUFFIXES = (".yaml", ".yml")
# Secrets the schema accepts only as ${VAR}: a plaintext one in the file is an error
# (but a deployment's short placeholder key, below).
SECRET_SECTIONS = {"keys": "secret", "engines": "api_key", "deployments": "api_key"}
# A literal deployment api_key shorter than this is a placeholder for a server that
# checks no key (`api_key: ollama`, `EMPTY`, `unused`; litellm's providers need one):
# real provider keys are far longer.
PLACEHOLDER_KEY_LENGTH = 16
# A longer literal that says it is no key (the placeholders servers' docs tell users to
# write: llama.cpp's "...-no-key-required", "not-needed"): no real key reads so.
SAYS_NO_KEY = re.compile(r"no-?key|not-?needed|unused|dummy|placeholder", re.IGNORECASE)
PLAINTEXT_SECRET = "secrets come from the environment: write ${VAR_NAME}, not the secret"
PLACEHOLDER_HINT = " (a server that checks no key: `api_key: unused`, or ${VAR:-unused})"
MIN_SCRUBBED_LENGTH = 3  # shorter env values are too common in messages to be secrets
SEPARATORS = tuple("-_.:/@")  # between the parts of a model name
NEAR_SPELLING = 0.8  # difflib ratio of a slip of the keyboard (gpt-4o-mnii, gpt-4o-mini)

# What of a policy this install cannot serve (a route's classifier, a deployment's
# quality profile), as (field path, message) findings.
InstallCheck = Callable[[Sections], Iterable[tuple[FieldPath, str]]]


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """A validated policy and where it came from.

    `unset_env` maps dotted field paths to the env vars they referenced that were unset
    or empty (the field is null); `digest` changes whenever the source files' bytes do.
    """

    policy: Policy
    source: tuple[Path, ...]
    unset_env: dict[str, list[str]]
    digest: str


def load_policy(
    path: Path,
    env: Mapping[str, str] | None = None,
    *,
    install_check: InstallCheck | None = None,
) -> LoadedPolicy:
    """Load `path`, a YAML file or a directory of `*.yaml`/`*.yml` files merged.
    `install_check` refuses what this install cannot serve; without it, everything is
    taken to be servable."""
    environ: Mapping[str, str] = os.environ if env is None else env
    return load_sources(read_sources(path), environ, install_check=install_check)


def policy_files(path: Path) -> list[Path]:
    """The files a policy path stands for, in merge order."""
    if path.is_dir():
        files = sorted(
            child
            for child in path.iterdir()
            if child.suffix in POLICY_SUFFIXES
            # A dangling link is a file that cannot be read (a broken ConfigMap mount),
            # not one to skip: skipped, its budgets or keys would vanish silently.
            and (child.is_file() or child.is_symlink())
            and not child.name.startswith(".")
        )
        if not files:
            raise PolicyError(
                [Problem(path, None, None, "", "directory has no *.yaml or *.yml files")]
            )
        return files
    if not path.exists():
        raise PolicyError([Problem(path, None, None, "", "no such file or directory")])
    return [path]


def read_sources(path: Path) -> list[tuple[Path, bytes]]:
    """Each policy file with its bytes; unreadable files are a PolicyError.

    A file is read only to one byte past the size limit, and reading stops at the file
    that takes the total past its limit: `parse_documents` refuses both, and a huge or
    endless file (/dev/zero) costs no more than that.
    """
    sources: list[tuple[Path, bytes]] = []
    total = 0
    for file in policy_files(path):
        try:
            with file.open("rb") as stream:
                raw = stream.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise PolicyError(
                [Problem(file, None, None, "", f"cannot read: {exc.strerror}")]
            ) from exc
        sources.append((file, raw))
        total += len(raw)
        if total > MAX_TOTAL_BYTES:
            break
    return sources


def sources_digest(sources: list[tuple[Path, bytes]]) -> str:
    """A sha256 over the files' names and bytes, to notice any change."""
    digest = hashlib.sha256()
    for file, raw in sources:
        digest.update(file.name.encode() + b"\0" + len(raw).to_bytes(8, "big") + raw)
    return digest.hexdigest()


def load_sources(
    sources: list[tuple[Path, bytes]],
    env: Mapping[str, str],
    *,
    install_check: InstallCheck | None = None,
) -> LoadedPolicy:
    """Validate already-read sources (the reloader reads once to digest and load)."""
    document = merge_documents(parse_documents(sources))
    substitution = substitute(document.data, env)
    report = _Report(document, substitution)
    for path, message in [*substitution.problems, *_plaintext_secrets(substitution)]:
        report.add(path, message)
    # A value whose substitution failed is reported as such; what it then fails is noise.
    broken = {path for path, _ in substitution.problems}
    unset_env = {_dotted(path): names for path, names in substitution.unset.items()}
    # A secret that came out empty (`${VAR:-}`, VAR unset) is unset too (the schema reads
    # it as None): the variables are named where it is missed.
    missed = unset_env | _emptied(substitution)
    context = {"unset_env": missed, "empty_env": substitution.empty}
    try:
        policy = Policy.model_validate(substitution.data, context=context)
    except ValidationError as exc:
        for path, message, missing in _validation_findings(exc):
            if path not in broken:
                report.add(path, message, missing=missing)
        # The policy is not valid as a whole: check between the entries that are.
        sections = Sections.validated(substitution.data, missed, substitution.empty)
        findings = [*sections.problems(), *_unservable(sections, install_check)]
    else:
        findings = list(_unservable(Sections.of(policy), install_check))
    for path, message in findings:
        if path not in broken:
            report.add(path, message)
    report.raise_if_any()
    return LoadedPolicy(
        policy=policy,
        source=tuple(file for file, _ in sources),
        unset_env=unset_env,
        digest=sources_digest(sources),
    )


def _unservable(
    sections: Sections, install_check: InstallCheck | None
) -> Iterator[tuple[FieldPath, str]]:
    """What this install cannot serve as the policy asks."""
    if install_check is not None:
        yield from install_check(sections)
    yield from _unpriced_references(sections)
    yield from _unpriced_candidates(sections)


def _unpriced_references(sections: Sections) -> Iterator[tuple[FieldPath, str]]:
    """Routes whose `reference_model` has no price. Serve would price the counterfactual
    at 0 (`gateway.runtime`: a deployment's price, else litellm's map under the name),
    and every request would read as a 100% loss in the savings reports."""
    deployments = sections.deployments
    for name, route in (sections.routes or {}).items():
        reference = route.reference_model if route is not None else None
        if reference is None or deployments is None:
            continue
        owner = f"route '{name}' has reference_model '{reference}'"
        loc: FieldPath = ("routes", name, "reference_model")
        if reference in deployments:
            deployment = deployments[reference]
            if deployment is not None and _priced(sections, deployment) is False:
                yield (
                    loc,
                    f"{owner}, a deployment with no price ({_unpriced_because(deployment)}): "
                    f"give it a price ({{input_per_mtok, output_per_mtok}}) above zero or "
                    "self_hosted, or name a priced deployment or model",
                )
        elif litellm_rates(reference) is None:
            message = (
                f"{owner}, which has no price: no deployment has that name and litellm's "
                "price map does not know it"
            )
            message += did_you_mean(_closest(reference, [*deployments, *_priced_models()]))
            yield (
                loc,
                f"{message} (savings against an unpriced reference read as a 100% loss; for "
                "a model the map lacks, name a deployment that sets its price)",
            )


def _unpriced_candidates(sections: Sections) -> Iterator[tuple[FieldPath, str]]:
    """Deployments of `select` routes with no price. A select route ranks its
    candidates by expected cost: an unpriced one would cost 0, the cheapest of all,
    and take the route's traffic whatever its quality."""
    deployments = sections.deployments or {}
    for name, route in (sections.routes or {}).items():
        if route is None or route.strategy != "select":
            continue
        for index, candidate in enumerate(route.deployments):
            deployment = deployments.get(candidate)
            if deployment is None or _priced(sections, deployment) is not False:
                continue
            yield (
                ("routes", name, "deployments", index),
                f"route '{name}' (strategy select) ranks its deployments by price, and "
                f"'{candidate}' has none ({_unpriced_because(deployment)}): it would rank "
                "as free and take the route's traffic; give it a price "
                "({input_per_mtok, output_per_mtok}) above zero or self_hosted",
            )


def _unpriced_because(deployment: Deployment) -> str:
    """Why `_priced` finds a deployment unpriced, for a message."""
    if deployment.price is not None:
        return "its price is zero, and a zero price is no price, not free"
    return f"litellm's price map does not know '{deployment.pricing_model or deployment.model}'"


def _priced(sections: Sections, deployment: Deployment) -> bool | None:
    """Does serve price this deployment (in the order `gateway.runtime` does)? None
    when its engine did not validate. A zero `price` is none (`gateway.runtime` records
    the deployment as unpriced)."""
    if deployment.price is not None:
        return deployment.price.input_per_mtok > 0 or deployment.price.output_per_mtok > 0
    if deployment.self_hosted is not None:
        return True
    if deployment.engine is not None:
        engine = (sections.engines or {}).get(deployment.engine)
        if engine is None:
            return None  # undeclared (reported on its own) or invalid
        if engine.gpu_hour_usd and engine.tokens_per_second:
            return True  # the policy copies the engine's GPU cost onto the deployment
    return (
        litellm_rates(deployment.pricing_model or deployment.model, deployment.provider) is not None
    )


@functools.cache
def _priced_models() -> list[str]:
    return [name for name in litellm_price_map() if litellm_rates(name) is not None]


def _closest(name: str, names: list[str]) -> str | None:
    """The likeliest intended name: a near spelling (`gpt-4o-mini` for `gpt-4o-mnii`),
    else the longest name that `name` extends past a separator (`gpt-4o` for
    `gpt-4o-typo`), else the closest spelling."""
    near = difflib.get_close_matches(name, names, n=1, cutoff=NEAR_SPELLING)
    if near:
        return near[0]
    stems = [n for n in names if name.startswith(n) and name[len(n) : len(n) + 1] in SEPARATORS]
    if stems:
        return max(stems, key=len)
    return closest_spelling(name, names)


def _plaintext_secrets(substitution: Substitution) -> Iterator[tuple[FieldPath, str]]:
    data = substitution.data if isinstance(substitution.data, dict) else {}
    candidates: list[FieldPath] = []
    for section, field in SECRET_SECTIONS.items():
        entries = data.get(section)
        if isinstance(entries, dict):
            candidates += [
                (section, name, field)
                for name, entry in entries.items()
                if isinstance(entry, dict) and field in entry
            ]
    for section in ("admin_keys", "finance_keys", "metrics_keys"):
        keys = data.get(section)
        if isinstance(keys, list):
            candidates += [(section, index) for index in range(len(keys))]
    for path in candidates:
        value = _get(data, path)
        if path in substitution.references or not isinstance(value, str):
            continue
        if path[0] != "deployments":
            yield path, PLAINTEXT_SECRET
        elif len(value) >= PLACEHOLDER_KEY_LENGTH and not SAYS_NO_KEY.search(value):
            yield path, PLAINTEXT_SECRET + PLACEHOLDER_HINT


def _emptied(substitution: Substitution) -> dict[str, list[str]]:
    """The dotted paths whose variables all came out empty (`${VAR:-}`), with them."""
    return {
        _dotted(path): names
        for path, names in substitution.references.items()
        if path not in substitution.unset and _get(substitution.data, path) == ""
    }


def _get(data: Any, path: FieldPath) -> Any:
    for part in path:
        data = data[part]
    return data


def _validation_findings(exc: ValidationError) -> Iterator[tuple[FieldPath, str, bool]]:
    for error in exc.errors():
        loc: FieldPath = tuple(error["loc"])
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, CrossReferenceError):
            for inner, message in cause.problems:
                yield (*loc, *inner), message, False
        elif error["type"] == "missing":
            yield loc, "required field is missing", True
        elif error["type"] == "extra_forbidden":
            yield loc, _unknown_field(loc), False
        elif error["type"] == "literal_error" and isinstance(error.get("input"), str):
            allowed = re.findall(r"'([^']*)'", str(error["ctx"]["expected"]))
            guess = closest_spelling(error["input"], allowed)
            yield loc, str(error["msg"]) + did_you_mean(guess), False
        else:
            yield loc, str(error["msg"]).removeprefix("Value error, "), False


def _unknown_field(loc: FieldPath) -> str:
    known = _model_fields_at(loc[:-1])
    guess = closest_spelling(str(loc[-1]), known)
    message = f"unknown field '{loc[-1]}'" + did_you_mean(guess)
    return f"{message} (fields here: {', '.join(known)})" if known else message


def _model_fields_at(loc: FieldPath) -> list[str]:
    """The field names of the model found at `loc` inside Policy, [] if it is not one."""
    node: Any = Policy
    for part in loc:
        if isinstance(node, type) and issubclass(node, BaseModel):
            info = node.model_fields.get(str(part))
            node = info.annotation if info is not None else None
        else:  # dict[str, X] or list[X]: the key or index selects an X
            args = [arg for arg in typing.get_args(node) if arg is not type(None)]
            node = args[-1] if args else None
        while typing.get_origin(node) in (types.UnionType, typing.Union):
            node = next(arg for arg in typing.get_args(node) if arg is not type(None))
    if isinstance(node, type) and issubclass(node, BaseModel):
        return list(node.model_fields)
    return []


def _dotted(path: FieldPath) -> str:
    return ".".join(str(part) for part in path)


class _Report:
    """Findings turned into located, scrubbed Problems."""

    def __init__(self, document: Document, substitution: Substitution) -> None:
        self.document = document
        self.substitution = substitution
        self.problems: dict[Problem, None] = {}  # a set, in order of finding

    def add(self, loc: FieldPath, message: str, missing: bool = False) -> None:
        """Locate a finding at `loc`; a `missing` field is placed at its parent's key."""
        known = self._known_prefix(loc)
        field = (*known, loc[len(known)]) if missing and len(loc) > len(known) else known
        mark = self._mark(known, exact=not missing)
        message = self._scrub(self._explain_env(known, message))
        problem = Problem(mark.file, mark.line, mark.column, _dotted(field), message)
        self.problems.setdefault(problem)

    def raise_if_any(self) -> None:
        if self.problems:
            order = sorted(self.problems, key=lambda p: (str(p.file), p.line or 0, p.column or 0))
            raise PolicyError(order)

    def _known_prefix(self, loc: FieldPath) -> FieldPath:
        """The longest prefix of a pydantic `loc` that is a path in the YAML.

        What follows it is a missing field's name or a tag such as `[key]`."""
        for size in range(len(loc), 0, -1):
            if loc[:size] in self.document.values:
                return loc[:size]
        return ()

    def _mark(self, path: FieldPath, exact: bool) -> Mark:
        values, keys = self.document.values, self.document.keys
        # a missing field points at its parent's key line, anything else at its value
        first, second = (values, keys) if exact else (keys, values)
        return first.get(path) or second.get(path) or values[()]

    def _explain_env(self, path: FieldPath, message: str) -> str:
        unset = self.substitution.unset.get(path)
        if unset:
            return f"{message} ({unset_or_empty(unset, self.substitution.empty, verb='is ')})"
        names = self.substitution.references.get(path)
        if names:
            return f"{message} (value from {', '.join('${' + name + '}' for name in names)})"
        return message

    def _scrub(self, message: str) -> str:
        for value, name in self.substitution.secrets.items():
            if len(value) >= MIN_SCRUBBED_LENGTH:
                message = message.replace(value, f"${{{name}}}")
        return message
