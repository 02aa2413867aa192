"""The bodies of `router train`, `train-verifier`, `eval`, `train-quality` and
`eval-quality` (their parsers are in `router.cli`). Training code is imported inside
each command: scoring from the command line does not load it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from router.errors import RoutingError
from router.rows import print_lines

if TYPE_CHECKING:
    from router.training.cascade_evaluation import CascadeReport
    from router.training.classifier_train import FoldReport
    from router.training.dataset import Example
    from router.training.evaluation import Curve


def run_train_verifier(args: argparse.Namespace) -> int:
    from router.training import verifier_train

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return verifier_train.main(
        args.data, args.out, run_code=args.run_code, open_only=args.open_only
    )


def run_train(args: argparse.Namespace) -> int:
    from router.training.classifier_train import format_table
    from router.training.dataset import load_examples

    routers: Sequence[str]
    train: Callable[[Path | None, Path, Sequence[Example]], list[FoldReport]]
    if args.embeddings:
        from router import embedding_classifier
        from router.training import embedding_classifier_train

        out = args.out or embedding_classifier.DEFAULT_PATH
        routers, train = (
            embedding_classifier_train.EMBEDDING_ROUTERS,
            embedding_classifier_train.train,
        )
    else:
        from router import classifier
        from router.training import classifier_train

        out = args.out or classifier.DEFAULT_PATH
        routers, train = classifier_train.ROUTERS, classifier_train.train
    try:
        reports = train(args.data, out, load_examples(args.data))
    except RoutingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out} and {out.with_suffix('.card.md')}")
    print(format_table(reports, routers))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from router.training.cascade_evaluation import format_cascade_table, run_cascade_evaluation
    from router.training.classifier_train import (
        FeatureCache,
        fit_folds,
        format_table,
        held_out_scores,
        run_evaluation,
        run_subject_evaluation,
    )
    from router.training.dataset import load_examples
    from router.training.evaluation import plot_curves

    try:
        examples = load_examples(args.data)
        cache = FeatureCache(examples)
        fitted = fit_folds(examples, cache)
        prompt_scores = held_out_scores(fitted)
        cascades = run_cascade_evaluation(args.data, prompt_scores, run_code=args.run_code)
    except RoutingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    reports = run_evaluation(examples, cache, fitted)
    print(format_table(reports))
    print()
    print("Unseen MMLU subjects, more draws (training subjects in groups, each left out):")
    print(format_table(run_subject_evaluation(examples, cache)))
    print()
    print(format_cascade_table(cascades))
    arena = _arena_table(args.data)
    if arena:
        print()
        print(arena)
    if args.plot is not None:
        args.plot.mkdir(parents=True, exist_ok=True)
        for report in reports:
            path = args.plot / f"{report.name}.png"
            title = f"held-out {report.name} ({report.rows} prompts)"
            plot_curves(report.curves, title, path, cascades=_cascade_lines(cascades, report.name))
            print(f"wrote {path}")
    return 0


def _arena_table(data_dir: Path | None) -> str:
    """The open-ended verifier's cascade on arena chat (nested CV and the final split),
    or "" when the data has no arena chat."""
    from router.training.dataset import DEFAULT_DATA_DIR, data_file
    from router.training.open_evaluation import format_arena_table, run_arena_evaluation
    from router.training.open_verifier_train import ARENA_STEM

    directory = data_dir or DEFAULT_DATA_DIR
    if not data_file(directory, ARENA_STEM).is_file():
        return ""
    return format_arena_table(run_arena_evaluation(directory))


def _cascade_lines(cascades: Sequence[CascadeReport], name: str) -> dict[str, Curve]:
    """The curves to draw next to a dataset's routers: the verifier's cascade (and with
    code runs, where there are) and, where second opinions were tried, the one chosen on
    the other datasets."""
    lines = {}
    for c in cascades:
        if c.name == name and not c.second_opinion:
            ran = " + examples run" if c.code_run else ""
            lines[f"cascade (verifier{ran}, {c.rows} rows)"] = c.curve
        elif c.name == name and c.chosen_elsewhere and not c.code_run:
            opinion = c.second_opinion.split("/")[-1]
            lines[f"cascade + {opinion} (chosen on other tasks)"] = c.curve
    return lines


def run_train_quality(args: argparse.Namespace) -> int:
    from router import quality
    from router.training import quality_report, quality_train

    out = args.out or quality.DEFAULT_PATH
    try:
        predictor, folds, final = quality_train.run(args.data)
    except RoutingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    quality_train.write(predictor, folds, final, out)
    print(f"wrote {out} and {out.with_suffix('.card.md')}")
    return print_lines(quality_report.report_lines(folds, final))


def run_eval_quality(args: argparse.Namespace) -> int:
    from router.training import quality_report, quality_train

    try:
        _, folds, final = quality_train.run(args.data)
    except RoutingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    status = print_lines(quality_report.report_lines(folds, final))
    if args.plot is not None:
        for path in quality_report.plot(final, args.plot):
            print(f"wrote {path}")
    return status
