"""Seed-level intervals of the core comparison: the training run is the unit, and the intervals cover."""
import numpy as np
import pytest
from scipy import stats

from agent.compare.report import hierarchical_bootstrap_ci, minimum_detectable_effect, pooled_seed_sd, \
    seed_level_difference


def test_pooled_sd_and_the_difference_by_hand():
    sd, df = pooled_seed_sd({"a": [1.0, 3.0], "b": [10.0, 14.0], "single": [5.0]})
    assert df == 2 and sd == pytest.approx(np.sqrt((2.0 + 8.0) / 2))
    d = seed_level_difference([1.0, 3.0], [10.0, 14.0], sd, df)
    se = sd * np.sqrt(1 / 2 + 1 / 2)
    half = stats.t.ppf(0.975, 2) * se
    assert d["mean"] == pytest.approx(-10.0) and d["ci95"] == pytest.approx([-10.0 - half, -10.0 + half])
    assert d["excludes_zero"] and d["real"] and d["seeds"] == [2, 2] and d["df"] == 2
    assert d["mde80"] == pytest.approx((stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2)) * se)
    assert seed_level_difference([1.0], [2.0], float("nan"), 0) is None
    assert pooled_seed_sd({"a": [1.0], "b": [2.0]}) == (pytest.approx(float("nan"), nan_ok=True), 0)
    assert np.isnan(minimum_detectable_effect(1.0, 0))


def test_with_two_seeds_the_seed_level_interval_covers_and_the_bootstrap_does_not():
    """Three variants x 2 training runs x 30 tracks; runs differ by sd 40, tracks by sd 100 (shared by every run)."""
    rng = np.random.default_rng(0)
    reps, cover_t, cover_boot = 400, 0, 0
    for r in range(reps):
        track = rng.normal(0, 100, 30)
        runs = {v: [track + rng.normal(0, 40) + rng.normal(0, 20, 30) for _ in range(2)] for v in "abc"}
        means = {v: [float(x.mean()) for x in xs] for v, xs in runs.items()}
        sd, df = pooled_seed_sd(means)
        d = seed_level_difference(means["a"], means["b"], sd, df)
        cover_t += d["ci95"][0] <= 0.0 <= d["ci95"][1]
        if r < 100:  # the paired two-level bootstrap over (seed, track) differences, as the report used to
            diffs = {(s, k): runs["a"][s][k] - runs["b"][s][k] for s in range(2) for k in range(30)}
            lo, hi = hierarchical_bootstrap_ci(diffs, n=1000, seed=r)
            cover_boot += lo <= 0.0 <= hi
    assert 0.92 <= cover_t / reps <= 0.98  # nominal 0.95
    assert cover_boot / 100 < 0.85  # it draws the training runs from 2 values: too narrow
