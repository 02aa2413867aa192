from __future__ import annotations

import numpy as np

from router.training.gain_regression import centred, fit_gain, sign_consistent


def two_tasks() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Task 1 has a higher mean of x and a higher mean gain, but within each task the gain
    falls with x: a pooled fit says "more x, more gain", the within-task fit the truth."""
    rng = np.random.default_rng(0)
    groups = np.repeat([0, 1], 200)
    x = rng.normal(size=(400, 2)) + 3.0 * groups[:, None]
    gain = -0.5 * x[:, 0] + 4.0 * groups + rng.normal(scale=0.1, size=400)
    return x, gain, groups, np.ones(400)


def test_centred_removes_each_groups_weighted_mean() -> None:
    values = np.array([1.0, 3.0, 10.0, 20.0])
    groups = np.array([0, 0, 1, 1])
    out = centred(values, groups, np.array([1.0, 3.0, 1.0, 1.0]))
    assert np.allclose(out, [-1.5, 0.5, -5.0, 5.0])


def test_fit_learns_the_within_task_direction() -> None:
    x, gain, groups, weights = two_tasks()
    pooled = np.linalg.lstsq(np.c_[x, np.ones(400)], gain, rcond=None)[0]
    assert pooled[0] > 0  # the confound
    coef = fit_gain(x, gain, groups, weights, ridge=1e-3, columns=np.array([True, True]))
    assert coef[0] < -0.4 and abs(coef[1]) < 0.1


def test_columns_outside_the_set_get_no_weight() -> None:
    x, gain, groups, weights = two_tasks()
    coef = fit_gain(x, gain, groups, weights, ridge=1e-3, columns=np.array([False, True]))
    assert coef[0] == 0.0


def test_strong_ridge_towards_a_column_keeps_only_that_column() -> None:
    x, gain, groups, weights = two_tasks()
    columns = np.array([False, True])
    coef = fit_gain(x, gain, groups, weights, ridge=1e6, columns=columns, toward=0)
    assert coef[0] < -0.4 and abs(coef[1]) < 1e-3


def test_sign_consistent_keeps_columns_that_agree_across_groups() -> None:
    rng = np.random.default_rng(1)
    groups = np.repeat([0, 1, 2, 3], 100)
    signal = rng.normal(size=400)
    flips = np.where(groups % 2 == 0, 1.0, -1.0)
    x = np.c_[signal, signal * flips, np.ones(400)]
    keep = sign_consistent(x, signal, groups)
    assert keep.tolist() == [True, False, False]
