"""Intervals for the interpretability studies (faithfulness, regions, trace encoding)."""

from __future__ import annotations

import math

import numpy as np


def mean_interval(values, confidence: float = 0.95) -> dict:
    """The mean of the finite ``values`` and its Student-t interval.

    Args:
        values: any array-like of numbers; NaN and infinities are dropped.
        confidence: the interval's coverage (0.95: a 95 % interval).

    Returns:
        ``{"mean", "lo", "hi", "n"}``; ``lo``/``hi`` are NaN when fewer than two values remain, and
        everything is NaN (``n`` 0) when none does.
    """
    from scipy import stats

    v = np.asarray([x for x in np.asarray(values, np.float64).ravel() if np.isfinite(x)])
    n = int(v.size)
    if n == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    m = float(v.mean())
    if n < 2:
        return {"mean": m, "lo": float("nan"), "hi": float("nan"), "n": n}
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * v.std(ddof=1) / math.sqrt(n))
    return {"mean": m, "lo": m - half, "hi": m + half, "n": n}


__all__ = ["mean_interval"]
