"""Intervals, their text and JSON for the interpretability studies (faithfulness, regions, trace encoding)."""

from __future__ import annotations

import math
from pathlib import Path

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


def format_interval(iv: dict | None, digits: int = 3, signed: bool = False) -> str:
    """``"mean [lo, hi]"`` of a :func:`mean_interval` dict; the mean alone without an interval; "n/a"
    for None or a NaN mean. ``signed``: always print the sign (differences, ROAD scores)."""
    if iv is None or not np.isfinite(iv.get("mean", float("nan"))):
        return "n/a"
    f = f"{'+' if signed else ''}.{digits}f"
    if not np.isfinite(iv.get("lo", float("nan"))):
        return f"{iv['mean']:.{digits}f}"
    return f"{iv['mean']:{f}} [{iv['lo']:{f}}, {iv['hi']:{f}}]"


def json_default(o):
    """``json.dumps(..., default=json_default)``: numpy scalars and arrays, and paths, as JSON values.

    Raises:
        TypeError: any other object.
    """
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


__all__ = ["format_interval", "json_default", "mean_interval"]
