"""Within-task regression of the strong model's gain on dense request features.

APGR ranks the prompts of one task, so what the classifier must learn is which prompts
of a task gain most from the strong model, not which task a prompt comes from. Across
the training datasets the two are confounded: GSM8K's maths gains a lot from GPT-4,
MMLU's maths little (its one-token answers), so a pooled fit learns "this looks like
GSM8K" and inverts on the next task. Hence:

- target: gain = strong_correct - weak_correct (in {-1, 0, 1}); ranking by its
  expectation is what maximises the quality curve, and both-wrong rows count as 0;
- features and target are centred within each training group (dataset) before the fit,
  so only within-task variation is learnt; at run time the weights apply to the raw
  (standardised) features of the single request, which keeps ranking within a task;
- weighted ridge, each group weighing the same in total;
- optionally only the features whose within-group correlation with the gain has the
  same sign in all but at most one group (a cheap guard against effects of one task alone);
- optionally shrunk towards the prompt-length router (`toward`: the one column whose
  univariate within-group fit is the prior) instead of towards zero, so that a strong
  penalty falls back on the one signal known to transfer across tasks.

    coef = fit_gain(x, gain, groups, weights, ridge=0.1, columns=columns)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def centred(values: FloatArray, groups: IntArray, weights: FloatArray) -> FloatArray:
    """`values` (rows x columns, or rows) minus their weighted mean within each group."""
    out = values.astype(np.float64, copy=True)
    for group in np.unique(groups):
        rows = groups == group
        out[rows] -= np.average(values[rows], axis=0, weights=weights[rows])
    return out


def fit_gain(
    x: FloatArray,
    gain: FloatArray,
    groups: IntArray,
    weights: FloatArray,
    *,
    ridge: float,
    columns: BoolArray,
    toward: int | None = None,
) -> FloatArray:
    """Ridge weights (zero outside `columns`) of the within-group gain on standardised `x`.

    The penalty is `ridge` x total weight x |coef - prior|^2, so its strength does not
    depend on row count; the prior is zero, or the length fit on column `toward`.
    """
    columns = columns.copy()
    if toward is not None:
        columns[toward] = True
    xc = centred(x[:, columns], groups, weights)
    yc = centred(gain, groups, weights)
    prior = np.zeros(xc.shape[1])
    if toward is not None:
        at = int(np.count_nonzero(columns[:toward]))
        prior[at] = (xc[:, at] * weights) @ yc / max(float(xc[:, at] ** 2 @ weights), 1e-12)
    penalty = ridge * weights.sum()
    gram = xc.T @ (xc * weights[:, None]) + penalty * np.eye(xc.shape[1])
    coef = np.zeros(x.shape[1])
    coef[columns] = np.linalg.solve(gram, xc.T @ (weights * yc) + penalty * prior)
    return coef


def sign_consistent(x: FloatArray, gain: FloatArray, groups: IntArray) -> BoolArray:
    """Columns whose correlation with the gain has one sign in all groups but at most one
    (groups where the column or the gain is constant abstain)."""
    votes = np.zeros((len(np.unique(groups)), x.shape[1]))
    for i, group in enumerate(np.unique(groups)):
        rows = groups == group
        xg, yg = x[rows] - x[rows].mean(axis=0), gain[rows] - gain[rows].mean()
        votes[i] = np.sign(xg.T @ yg) * (xg.std(axis=0) > 1e-12)
    voters = np.abs(votes).sum(axis=0)
    agreement = np.abs(votes.sum(axis=0))
    consistent: BoolArray = (voters > 0) & (agreement >= voters - 2)
    return consistent
