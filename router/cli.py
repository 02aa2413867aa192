"""`cascade-gateway router ...`: score, verify, train and eval from the command line.

`gateway/cli.py` calls `add_router_commands(subparsers)`; each leaf parser sets
`func(args) -> int`; the training and eval commands' bodies are in
`router.training.training_commands`. Without the gateway: `python -m router.cli score X`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from router import conversation
from router.errors import RoutingError
from router.rows import Row, each, finite, print_lines, read_rows, score_rows, unwrap_response

if TYPE_CHECKING:
    from router.classifier import RequestClassifier
    from router.code_examples import CodeJob, ExampleRun


def training(name: str) -> Callable[[argparse.Namespace], int]:
    """A command of `router.training.training_commands`, imported when it runs: a
    process that only serves never loads training code."""

    def run(args: argparse.Namespace) -> int:
        from router.training import training_commands

        command: Callable[[argparse.Namespace], int] = getattr(training_commands, name)
        return command(args)

    return run


# Optional request fields a score row may carry, with their JSON type.
REQUEST_FIELDS: Mapping[str, type] = {"tools": list, "response_format": dict, "max_tokens": int}
# The chat roles a message may have: a copy of the gateway's `CHAT_ROLES` in
# gateway/http/validation.py (router/ does not import the gateway); a test in
# tests/router/test_cli_fixes.py checks that the two are equal.
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


# The scores of a route's recent requests, from the gateway's ledger: (route, how many
# of the latest records to read, "score" or "verifier_score") -> scores. The gateway
# passes it; `router/` reads no ledger itself.
ScoreField = Literal["score", "verifier_score"]
LedgerScores = Callable[[str, int, ScoreField], list[float]]
DEFAULT_LAST = 10_000


def add_router_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    ledger_scores: LedgerScores | None = None,
) -> None:
    """Register the `router` command group on the main parser's subparsers."""
    router = subparsers.add_parser("router", help="score, verify, train and evaluate the router")
    commands = router.add_subparsers(dest="router_command", required=True)

    score = commands.add_parser("score", help="print {id, score} per JSONL row (prompt/messages)")
    score.add_argument("input", type=Path, metavar="IN.jsonl")
    _classifier_option(score)
    score.set_defaults(func=run_score)

    verify = commands.add_parser(
        "verify",
        help="print {id, score} per {id, prompt|messages, response} (optional: samples, "
        "logprobs, finish_reason, response_format)",
    )
    verify.add_argument("input", type=Path, metavar="IN.jsonl")
    verify.add_argument(
        "--run-code",
        action="store_true",
        help="run code answers against the examples they claim, in a sandbox (it executes "
        "the answers' code: only on hosts with unprivileged user namespaces)",
    )
    verify.set_defaults(func=run_verify)

    train = commands.add_parser("train", help="rebuild the shipped classifier and its card")
    train.add_argument("--data", type=Path, default=None, help="routing data directory")
    train.add_argument("--out", type=Path, default=None, help="model path (.json)")
    train.add_argument(
        "--embeddings",
        action="store_true",
        help="rebuild the embedding classifier (routes' `classifier: minilm`) instead; "
        "needs the embeddings extra",
    )
    train.set_defaults(func=training("run_train"))

    train_verifier = commands.add_parser(
        "train-verifier", help="rebuild the shipped cascade verifier and its card"
    )
    train_verifier.add_argument("--data", type=Path, default=None, help="routing data directory")
    train_verifier.add_argument("--out", type=Path, default=None, help="model path (.json)")
    train_verifier.add_argument(
        "--no-run-code",
        dest="run_code",
        action="store_false",
        help="do not run the code answers' examples (in a sandbox) to learn that signal",
    )
    train_verifier.add_argument(
        "--open-only",
        action="store_true",
        help="retrain only the open-ended answers' model (arena chat), keeping the "
        "closed-form part of the artifact",
    )
    train_verifier.set_defaults(func=training("run_train_verifier"))

    calibrate = commands.add_parser(
        "calibrate", help="tier thresholds that give each tier a target share of a sample"
    )
    calibrate.add_argument(
        "input", type=Path, nargs="?", metavar="IN.jsonl", help="rows as for score"
    )
    _ledger_options(calibrate, "the scores ROUTE's recent requests got")
    calibrate.add_argument(
        "--shares",
        required=True,
        help="tier=share,... cheapest first (scaled to sum to 1), e.g. local=0.7,premium=0.3",
    )
    _classifier_option(calibrate)
    calibrate.set_defaults(func=run_calibrate, ledger_scores=ledger_scores)

    calibrate_verify = commands.add_parser(
        "calibrate-verify",
        help="the cascade verify_threshold that escalates a target share of a sample's answers",
    )
    calibrate_verify.add_argument(
        "input", type=Path, nargs="?", metavar="IN.jsonl", help="rows as for verify"
    )
    _ledger_options(calibrate_verify, "the verifier's scores of ROUTE's recent first answers")
    calibrate_verify.add_argument(
        "--escalate", type=float, required=True, help="share of answers to escalate, e.g. 0.2"
    )
    calibrate_verify.set_defaults(func=run_calibrate_verify, ledger_scores=ledger_scores)

    evaluate = commands.add_parser("eval", help="held-out APGR / CPT table and plots")
    evaluate.add_argument("--data", type=Path, default=None, help="routing data directory")
    evaluate.add_argument("--plot", type=Path, default=None, help="directory for PNG plots")
    evaluate.add_argument(
        "--no-run-code",
        dest="run_code",
        action="store_false",
        help="do not run the code answers' examples (in a sandbox): no 'examples run' rows",
    )
    evaluate.set_defaults(func=training("run_eval"))
    _add_quality_commands(commands)


def _ledger_options(parser: argparse.ArgumentParser, sample: str) -> None:
    parser.add_argument(
        "--from-ledger", metavar="ROUTE", help=f"instead of IN.jsonl: {sample} (REDIS_URL)"
    )
    parser.add_argument(
        "--last",
        type=int,
        help="with --from-ledger: how many of the ledger's latest records (all routes) to "
        f"read (default {DEFAULT_LAST})",
    )


def _classifier_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--classifier",
        choices=("features", "minilm"),
        help="the model that scores (a route's `classifier`, default features; minilm needs "
        "the embeddings extra)",
    )


def _load_classifier(name: str | None) -> RequestClassifier:
    if name == "minilm":
        from router.embedding_classifier import EmbeddingClassifier

        return EmbeddingClassifier.load()
    from router.classifier import Classifier

    return Classifier.load()


def run_score(args: argparse.Namespace) -> int:
    try:
        rows = list(read_rows(args.input, _score_request))
        classifier = _load_classifier(args.classifier)
        scores = score_rows(rows, classifier.score_batch)
    except RoutingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return print_lines(
        json.dumps({"id": row.id, "score": round(score, 6)})
        for row, score in zip(rows, scores, strict=True)
    )


def run_calibrate(args: argparse.Namespace) -> int:
    from router.training.calibration import calibrate, tiers_yaml

    try:
        shares = _parse_shares(args.shares)
        scores = _calibration_sample(args)
        tiers = calibrate(scores, shares)
    except RoutingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return print_lines([tiers_yaml(tiers).removesuffix("\n")])


def _calibration_sample(args: argparse.Namespace) -> list[float]:
    """Scores of IN.jsonl's rows, or those of a route's requests in the ledger."""
    if _from_ledger(args):
        return _ledger_sample(args, "score")
    rows = list(read_rows(args.input, _score_request))
    return score_rows(rows, _load_classifier(args.classifier).score_batch)


def _from_ledger(args: argparse.Namespace) -> bool:
    """Whether the sample is the ledger's; options of the other source are refused."""
    if (args.input is None) == (args.from_ledger is None):
        raise RoutingError("give IN.jsonl or --from-ledger ROUTE (one of the two)")
    if args.from_ledger is None and args.last is not None:
        raise RoutingError("--last applies to --from-ledger, not to IN.jsonl")
    if args.from_ledger is not None and getattr(args, "classifier", None) is not None:
        raise RoutingError(
            "--classifier applies to IN.jsonl: a route's requests were scored by its own"
        )
    return args.from_ledger is not None


def _ledger_sample(args: argparse.Namespace, field: ScoreField) -> list[float]:
    if args.ledger_scores is None:
        raise RoutingError("--from-ledger needs the gateway: run `cascade-gateway router ...`")
    last = DEFAULT_LAST if args.last is None else args.last
    if last <= 0:
        raise RoutingError(f"--last must be positive, got {last}")
    scores: list[float] = args.ledger_scores(args.from_ledger, last, field)
    return scores


def _parse_shares(text: str) -> dict[str, float]:
    """`local=0.7,premium=0.3` -> {"local": 0.7, "premium": 0.3}; the shares themselves
    are checked by `calibrate`."""
    shares: dict[str, float] = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        name = name.strip()
        try:
            share = float(value)
        except ValueError:
            raise RoutingError(f"--shares: '{part}' is not tier=share") from None
        if not name:
            raise RoutingError(f"--shares: '{part}' has no tier name")
        if name in shares:
            raise RoutingError(f"--shares: tier '{name}' is given twice")
        shares[name] = share
    return shares


def run_verify(args: argparse.Namespace) -> int:
    try:
        rows = list(read_rows(args.input, _verify_request))
        scores = _verifier_scores(rows, run_code=args.run_code)
    except RoutingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return print_lines(
        json.dumps({"id": row.id, "score": round(float(score), 6)})
        for row, score in zip(rows, scores, strict=True)
    )


def run_calibrate_verify(args: argparse.Namespace) -> int:
    from router.training.calibration import verify_cut, verify_yaml

    try:
        if not 0.0 <= args.escalate <= 1.0:
            raise RoutingError(f"--escalate must be a share in [0, 1], got {args.escalate}")
        if _from_ledger(args):
            scores = _ledger_sample(args, "verifier_score")
        else:
            scores = _verifier_scores(list(read_rows(args.input, _verify_request)))
        cut = verify_cut(scores, args.escalate)
    except RoutingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if f"{cut.share:.1%}" != f"{args.escalate:.1%}":  # as printed: 34.55% is 34.6%
        print(
            f"warning: the nearest share to {args.escalate:.1%} that these {cut.answers} "
            f"answers allow ({len(set(scores))} distinct scores) is {cut.share:.1%}",
            file=sys.stderr,
        )
    return print_lines([verify_yaml(cut)])


def _verifier_scores(rows: Sequence[Row[VerifyRow]], *, run_code: bool = False) -> list[float]:
    """The shipped verifier's score of each row, with the shipped classifier's score of
    its prompt as the prior, as the gateway's cascade does; ``run_code``: with each code
    answer run against its own examples (``router.sandbox``)."""
    from router import sandbox
    from router.classifier import Classifier
    from router.verifier import Verifier

    runs: list[ExampleRun | None] = [None] * len(rows)
    if run_code:
        if (reason := sandbox.available()) is not None:
            raise RoutingError(f"--run-code: this host cannot isolate code: {reason}")
        runs = sandbox.run_all(each(rows, lambda i: _code_job(rows[i].value)))
    verifier, classifier = Verifier.load(), Classifier.load()
    priors = score_rows(rows, lambda batch: classifier.score_batch([r.request() for r in batch]))

    def score(i: int) -> float:
        row = rows[i].value
        prompt, question = row.texts()
        return verifier.score(
            prompt,
            row.response,
            logprobs=row.logprobs,
            finish_reason=row.finish_reason,
            response_format=row.response_format,
            prompt_score=priors[i],
            samples=row.samples,
            question=question,
            code_run=runs[i],
        )

    return finite(rows, each(rows, score))


def _code_job(row: VerifyRow) -> CodeJob | None:
    """What `--run-code` runs for the row's answer, as the gateway's `run_code` would."""
    from router.verifier import code_job

    prompt, question = row.texts()
    return code_job(prompt, row.response, question)


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _score_request(row: Mapping[str, Any]) -> dict[str, Any]:
    request: dict[str, Any] = {"messages": _row_messages(row)}
    for name, kind in REQUEST_FIELDS.items():
        if row.get(name) is not None:
            if not isinstance(row[name], kind) or isinstance(row[name], bool):
                raise ValueError(f"'{name}' must be {kind.__name__}, not {row[name]!r:.40}")
            request[name] = row[name]
    if request.get("max_tokens", 1) < 1:
        raise ValueError(f"'max_tokens' must be a positive integer, not {request['max_tokens']}")
    return request


def _row_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A row's conversation: its `prompt` as a user message, else its `messages`."""
    if isinstance(row.get("prompt"), str):
        return [_user(row["prompt"])]
    if "messages" in row:
        return _messages(row["messages"])
    raise ValueError("expected 'prompt' (a string) or 'messages' (a list of chat messages)")


def _messages(messages: Any) -> list[dict[str, Any]]:
    """A row's chat messages, checked as the gateway checks a request's (`_check_messages`
    in gateway/http/validation.py), so that a row of its traffic scores as it did there:
    a non-empty list of objects, each with one of `CHAT_ROLES` and, if any, content that
    is a string, a list of parts (objects) or null. The scorers read the text of a string
    and of parts' `text`; no content, null, an empty list or parts without text are no
    text."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(
            f"'messages' must be a non-empty list of chat messages, not {messages!r:.40}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"'messages[{i}]' must be an object, not {message!r:.40}")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise ValueError(
                f"'messages[{i}].role' must be one of {', '.join(sorted(CHAT_ROLES))}, "
                f"not {role!r:.40}"
            )
        content = message.get("content")
        if not _is_content(content):
            raise ValueError(
                f"'messages[{i}].content' must be a string, a list of content parts "
                f"(objects) or null, got {json.dumps(content)[:40]}"
            )
    return messages


def _is_content(content: Any) -> bool:
    """What the gateway accepts as a message's content: a string, a list of parts, each
    an object (`{"type": "text", "text": ...}`, an image, ...), or null."""
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(isinstance(part, dict) for part in content)


@dataclass(frozen=True, slots=True)
class VerifyRow:
    """A `router verify` row: the conversation (its `prompt` as a user message, or its
    `messages`) and the answer, and what the upstream said besides (all optional): token
    logprobs, finish reason, the request's response_format, and `samples`, other
    answers to the same prompt (second opinions)."""

    messages: list[dict[str, Any]]
    response: str
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    response_format: dict[str, Any] | None = None
    samples: tuple[str, ...] = ()

    def texts(self) -> tuple[str, str]:
        """The prompt and the question the verifier reads, as the gateway reads them
        from a request with these messages."""
        return conversation.prompt_text(self.messages), conversation.question_text(self.messages)

    def request(self) -> dict[str, Any]:
        """The request the classifier scores for the verifier's prior, as the gateway's."""
        if self.response_format is None:
            return {"messages": self.messages}
        return {"messages": self.messages, "response_format": self.response_format}


def _verify_request(row: Mapping[str, Any]) -> VerifyRow:
    """A verify row; a `response` or sample stored as RouterBench stores answers (the
    text of a one-string list, `"['D']"`) is read as its string (`unwrap_response`)."""
    messages, response = _row_messages(row), row.get("response")
    if not isinstance(response, str):
        raise ValueError("expected 'response' as a string")
    samples, logprobs = row.get("samples"), row.get("logprobs")
    samples = [] if samples is None else samples
    if not isinstance(samples, list) or not all(isinstance(s, str) for s in samples):
        raise ValueError("'samples' must be a list of strings (other answers to the prompt)")
    if logprobs is not None and not (
        isinstance(logprobs, list)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in logprobs)
    ):
        raise ValueError("'logprobs' must be a list of numbers (token logprobs)")
    for index, value in enumerate(logprobs or ()):
        if value > 0:  # a probability above 1: the row holds something else
            raise ValueError(f"'logprobs[{index}]' is {value}: a token's logprob is at most 0")
    finish_reason, response_format = row.get("finish_reason"), row.get("response_format")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise ValueError("'finish_reason' must be a string")
    if response_format is not None and not isinstance(response_format, dict):
        raise ValueError("'response_format' must be an object")
    return VerifyRow(
        messages,
        unwrap_response(response),
        [_logprob(v) for v in logprobs] if logprobs is not None else None,
        finish_reason,
        response_format,
        tuple(unwrap_response(sample) for sample in samples),
    )


def _logprob(value: float) -> float:
    """A logprob as a float; an integer beyond a double's range is read as the same number
    written as a float is (-1e400 is -inf): infinite, which the verifier skips."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _add_quality_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """`router predict`, `train-quality` and `eval-quality`: the quality predictor."""
    predict = commands.add_parser(
        "predict", help="print {id, quality: {model: q}} per JSONL row (prompt/messages)"
    )
    predict.add_argument("input", type=Path, metavar="IN.jsonl")
    predict.add_argument(
        "--models", help="M1,M2,... known model names (default: every model it knows)"
    )
    predict.set_defaults(func=run_predict)

    train_quality = commands.add_parser(
        "train-quality", help="rebuild the shipped quality predictor and its card"
    )
    train_quality.add_argument("--data", type=Path, default=None, help="routing data directory")
    train_quality.add_argument("--out", type=Path, default=None, help="model path (.json)")
    train_quality.set_defaults(func=training("run_train_quality"))

    eval_quality = commands.add_parser(
        "eval-quality",
        help="multi-model table: saving at >= 95%% of GPT-4's quality, nested CV and final split",
    )
    eval_quality.add_argument("--data", type=Path, default=None, help="routing data directory")
    eval_quality.add_argument(
        "--plot", type=Path, default=None, help="directory for quality-vs-cost PNG plots"
    )
    eval_quality.set_defaults(func=training("run_eval_quality"))


def run_predict(args: argparse.Namespace) -> int:
    """Exit 2 for a model name the predictor does not know (listing the known ones), 1
    for any other error."""
    from router.quality import QualityPredictor, UnknownModelError

    try:
        predictor = QualityPredictor.load()
        models = None if args.models is None else _model_names(args.models)
        predictor.resolve(models)
    except UnknownModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RoutingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        rows = list(read_rows(args.input, _score_request))
        qualities = each(rows, lambda i: predictor.predict_batch([rows[i].value], models)[0])
    except RoutingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return print_lines(
        json.dumps({"id": row.id, "quality": {m: round(q, 6) for m, q in quality.items()}})
        for row, quality in zip(rows, qualities, strict=True)
    )


def _model_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        from router.quality import UnknownModelError

        raise UnknownModelError(f"--models '{text}' names no model; expected M1,M2,...")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="router")
    add_router_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["router", *(sys.argv[1:] if argv is None else argv)])
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
