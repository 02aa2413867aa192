"""Reports on a trained verifier: held-out metrics per source, with and without the
optional signals (``evaluate``), and the Markdown model card written beside the artifact.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from router.artifacts import DEFAULTS_LINK
from router.training import open_evaluation
from router.training.verifier_examples import (
    TEST_FRACTION_BUCKETS,
    Example,
    has_signal,
    with_signals,
)
from router.verifier import Verifier
from router.verifier_features import FEATURE_NAMES

_BUILT = re.compile(r"Built (\d{4}-\d\d-\d\d) by")  # the card's date of the closed-form part

REPORT_THRESHOLDS = (0.5, 0.7)
SIGNIFICANT_DIGITS = 6
# How ``evaluate`` names the rows that carry each optional signal, without and with it.
EVALUATED_SIGNALS = {"opinion": ("comparable", "+opinion"), "code_run": ("ran", "+examples")}


def rounded(value: float) -> float:
    """``value`` to ``SIGNIFICANT_DIGITS`` figures, as the artifact stores its numbers."""
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def evaluate(
    verifier: Verifier, examples: Sequence[Example], features: NDArray[np.float64]
) -> dict[str, dict[str, float]]:
    """Held-out ROC-AUC and accept precision, per source and pooled: without second
    opinions (as a cascade that asks for none), then, on the answers whose second
    opinion can be compared (final answers or code on both sides), without and with it
    (groups suffixed ``comparable`` and ``comparable +opinion``: the same rows)."""
    alone = with_signals(features)
    report = _metrics(verifier, examples, alone)
    for signal, (suffix, added) in EVALUATED_SIGNALS.items():
        carried = has_signal(features, signal)
        if not carried.any():
            continue
        subset = [e for e, c in zip(examples, carried, strict=True) if c]
        for label, rows in (
            (suffix, alone),
            (f"{suffix} {added}", with_signals(features, [signal])),
        ):
            for group, metrics in _metrics(verifier, subset, rows[carried]).items():
                report[f"{group} {label}"] = metrics
    return report


def _metrics(
    verifier: Verifier, examples: Sequence[Example], features: NDArray[np.float64]
) -> dict[str, dict[str, float]]:
    from sklearn.metrics import roc_auc_score

    scores = np.array(
        [verifier.score_features(dict(zip(FEATURE_NAMES, row, strict=True))) for row in features]
    )
    labels = np.array([e.label for e in examples], dtype=np.int64)
    sources = np.array([e.source for e in examples])
    report: dict[str, dict[str, float]] = {}
    for group in [*sorted(set(sources.tolist())), "all"]:
        mask = np.ones(len(labels), dtype=bool) if group == "all" else sources == group
        y, s = labels[mask], scores[mask]
        metrics = {"n": float(mask.sum()), "positive_rate": rounded(float(y.mean()))}
        metrics["roc_auc"] = rounded(float(roc_auc_score(y, s))) if 0 < y.sum() < len(y) else 0.5
        for threshold in REPORT_THRESHOLDS:
            accepted = s >= threshold
            metrics[f"accept_share@{threshold}"] = rounded(float(accepted.mean()))
            precision = float(y[accepted].mean()) if accepted.any() else 0.0
            metrics[f"accept_precision@{threshold}"] = rounded(precision)
        report[group] = metrics
    return report


def card_path(out: Path) -> Path:
    return out.with_name(f"{out.stem}.card.md")


def built_date(out: Path) -> str | None:
    """The date the card beside the artifact at ``out`` gives its closed-form part, if any."""
    built = (
        _BUILT.search(card_path(out).read_text(encoding="utf-8"))
        if card_path(out).is_file()
        else None
    )
    return built.group(1) if built else None


def model_card(artifact: dict[str, Any], built: str | None = None) -> str:
    """The Markdown model card for an artifact returned by ``train``; ``built``: the date
    its closed-form part was built (default today)."""
    training = artifact["training"]
    metrics = artifact["held_out_metrics"]
    header = "| held out | rows | positive rate | ROC-AUC | accept share @0.5 | precision @0.5 | "
    header += "accept share @0.7 | precision @0.7 |\n|---|---|---|---|---|---|---|---|\n"
    table = "".join(
        f"| {group} | {m['n']:.0f} | {m['positive_rate']:.3f} | {m['roc_auc']:.3f} | "
        f"{m['accept_share@0.5']:.3f} | {m['accept_precision@0.5']:.3f} | "
        f"{m['accept_share@0.7']:.3f} | {m['accept_precision@0.7']:.3f} |\n"
        for group, m in sorted(metrics.items(), key=lambda item: _card_order(item[0]))
    )
    weights = "".join(
        f"| {name} | {coef:+.3f} |\n"
        for name, coef in zip(artifact["feature_names"], artifact["coefficients"], strict=True)
    )
    opened = artifact.get("open_ended")
    return (
        CARD_TEMPLATE.format(
            date=built or datetime.date.today().isoformat(),
            open_ended=open_evaluation.card_section(opened) + "\n" if opened else "",
            held_out_task=training["held_out_task"],
            buckets=TEST_FRACTION_BUCKETS,
            train_rows=json.dumps(training["train_rows"]),
            test_rows=json.dumps(training["test_rows"]),
            priors=", ".join(training["prior_coefficients"]),
            table=header + table,
            weights=weights,
        )
        + DEFAULTS_LINK
    )


def _card_order(group: str) -> tuple[int, bool, str]:
    """``evaluate``'s order of its groups (sources, then "all"; rows without the optional
    signals first), which a round trip through the sorted JSON loses."""
    suffixes = [""] + [
        f"{s}{extra}" for s, a in EVALUATED_SIGNALS.values() for extra in ("", f" {a}")
    ]
    source, _, suffix = group.partition(" ")
    rank = suffixes.index(suffix) if suffix in suffixes else len(suffixes)
    return rank, source == "all", source


CARD_TEMPLATE = """# Cascade verifier

Scores how likely a cheap model's answer is acceptable (0..1); the cascade escalates
below the route's threshold. Built {date} by `router/training/verifier_train.py`.

## Model
For closed-form prompts (open-ended ones: see "Open-ended answers" below), a
logistic regression over cheap text signals (`router.verifier.FEATURE_NAMES`), standardised
with the training means/scales stored in `verifier.json`, then hard caps
(`router.verifier.SCORE_CAPS`: empty answer, invalid requested JSON, schema mismatch,
refusal, `finish_reason == "length"`, maths answer without a number, degenerate loops,
Python whose every function is a placeholder).
Worked maths is checked step by step (`router/arithmetic.py`: every `a op b = c` link and
GSM8K `<<a*b=c>>` annotation is evaluated without `eval`; a wrong step is a strong sign
of a wrong answer); a maths answer that never uses a number of the question, whose
final number no worked step computed, or that answers "how many" with a fraction is
suspect. The training data has no logprobs, `finish_reason` or JSON requests, so these
features carry fixed prior weights, not learned ones: {priors}.

`prompt_difficulty` is the complexity classifier's score of the prompt (logit), the
router's prior: fixed at -0.25 per within-task standard deviation, so the answer's own
signals lead and the prior orders answers whose text says nothing (a bare option letter).
In training each prompt's score comes from a classifier that never saw its dataset;
`router verify` and the gateway's cascade pass the shipped classifier's score.

`sample_agreement` is the share of second opinions (other answers to the same prompt:
another model's, where the route asks for them) whose final answer (`router/answers.py`:
the option letter, the final number) equals this answer's; unknown (neutral) when there
are none or nothing to compare (free text, code). `code_agreement` is, on questions that
ask for code, how alike this answer's code is to the opinions' (mean Jaccard similarity
of token trigrams: right solutions to one task converge, wrong ones wander). Both are
learned: each RouterBench answer is paired with one other model's answer to its prompt
(fixed by a hash), and fitted with and without it, so the same weights serve cascades
with and without second opinions. Below, `comparable` rows are
the answers whose second opinion can be compared (a final answer on multiple choice and
maths, code on code), scored without it, and `comparable +opinion` the same rows scored
with it.

`code_examples_held` and `code_examples_failed_share` come from running a code answer
against the examples it claims (doctests, `print(f(2))  # Output: 4`) in the sandbox
(`router/sandbox.py`: user, network, mount and PID namespaces, read-only mounts,
rlimits, an audit hook; only pass/fail counts come back); unknown (neutral) when not
run: a route switches it on with `run_code_examples: true`, `router verify` with
`--run-code`. Training runs every code answer's examples; an answer fitted with and
without each optional signal it carries (a second opinion, a code run), its weight
shared between the mixes. `ran` rows are the answers with examples that ran, scored
without the run, and `ran +examples` the same rows scored with it.

## Data
`router/data`: GSM8K (weak and strong model answers, labelled by correctness)
and RouterBench ARC-Challenge, MBPP and Winogrande (all 11 models' responses,
acceptable when `correct >= 0.5`). Sources are weighted equally in training.

- train rows: {train_rows}
- held-out rows: {test_rows}

## Split
`{held_out_task}` is held out entirely (a task the model never saw); of every other
source, the prompts whose `sha256(source:id)` first byte is 0 mod {buckets} are held out,
with all answers to a prompt on the same side.

## Held-out metrics
{table}
Precision @t is the share of acceptable answers among those scoring >= t (the answers
the cascade would keep); compare it with the positive rate (keeping everything). The
cascade itself (APGR / CPT over escalation share, with cost, on every row of each
dataset, each scored by a verifier of this recipe trained without its prompt) is in
`cascade-gateway router eval`, and there a second time with each dataset scored by a
verifier trained on the other tasks only ("task unseen": on the only maths and the only
code task, their kind's checks then carry no weight).

## Weights (per standardised feature)
| feature | coefficient |
|---|---|
{weights}
## Limits
The signals judge form, not content: a well-formed wrong answer (a confident wrong
option letter) scores like a right one. Logprob weights are guesses until traffic with
logprobs and outcomes is available. Some checks were designed by reading these answers
(`code_no_function`, `code_lines`: the MBPP answers), so their held-out figures here
are rosier than they will be on other code.

{open_ended}## Rebuild
`cascade-gateway router train-verifier` (or `python -m router.training.verifier_train`);
training is deterministic and the JSON is byte-identical across runs.
`cascade-gateway router train-verifier --open-only` retrains the open-ended section
alone (a minute or two, no sandbox), keeping the closed-form part and its build date.
"""
