"""A figure of one recording's steering against time: the policy's prediction, the driver's intent
(labels smoothed over +-0.5 s, :mod:`agent.eval.steering`) and the raw labels, faint.

Shapes: N frames; S session segments. Used by ``agent evaluate --env udacity --udacity.plot``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.atomic import save_figure


def _broken(t: np.ndarray, ys: list[np.ndarray], segments) -> tuple[np.ndarray, list[np.ndarray]]:
    """``t`` and ``ys`` with a NaN between session segments, so no line joins across a break."""
    if segments is None or len(segments) <= 1:
        return t, ys
    cuts = [int(b) for _, b in np.asarray(segments)[:-1]]
    nan_t = np.insert(t.astype(np.float64), cuts, np.nan)
    return nan_t, [np.insert(y.astype(np.float64), cuts, np.nan) for y in ys]


def plot_steering(path: str | Path, timestamps, pred, label, smoothed, *, segments=None, title: str = "",
                  half_width_s: float = 0.5, threshold: float | None = None) -> Path:
    """Draw prediction, smoothed label and raw label (faint) against time and save a PNG (Agg backend).

    Args:
        path: the image file (its folder is created; the format follows the suffix, e.g. ``.png``).
        timestamps: (N,) capture times in seconds (the x axis).
        pred: (N,) the policy's steering, normalised to [-1, 1] (+ = right).
        label: (N,) the raw labels.
        smoothed: (N,) the labels smoothed over +-``half_width_s`` s (named in the legend).
        segments: optional (S, 2) [start, stop) session segments; lines break between them.
        title: the figure's title.
        threshold: if given, dotted lines at +-threshold (the curve frames' bound).

    Returns:
        ``path`` as a Path.

    Raises:
        ValueError: arrays that are not 1-D of one length N >= 1.
    """
    arrays = [np.asarray(a, np.float64) for a in (timestamps, pred, label, smoothed)]
    if any(a.ndim != 1 for a in arrays) or len({len(a) for a in arrays}) != 1 or not len(arrays[0]):
        raise ValueError("timestamps, pred, label and smoothed must be 1-D arrays of one length N >= 1, got shapes "
                         + ", ".join(str(a.shape) for a in arrays))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, (p, y, s) = _broken(arrays[0], arrays[1:], segments)
    span = float(np.nanmax(t) - np.nanmin(t)) if len(t) else 0.0
    fig, ax = plt.subplots(figsize=(min(max(8.0, span / 10.0), 40.0), 4.4))
    ax.plot(t, y, color="0.55", lw=0.6, alpha=0.45, label="raw label (key taps)")
    ax.plot(t, s, color="tab:blue", lw=1.6, label=f"label smoothed ±{half_width_s:g} s (intent)")
    ax.plot(t, p, color="tab:red", lw=1.1, label="prediction")
    if threshold:
        for v in (threshold, -threshold):
            ax.axhline(v, color="0.3", lw=0.5, ls=":")
    ax.axhline(0.0, color="0.3", lw=0.5)
    top = float(np.nanmax(np.abs(np.concatenate([p, y, s]))))
    top = min(max(1.15 * top, 0.1), 1.05)  # zoomed on the values, never beyond the [-1, 1] range
    ax.set_ylim(-top, top)
    ax.set_xlabel("time (s, from the recording's first frame)")
    ax.set_ylabel("steering ([-1, 1], 1 = 25°; + = right)")
    if title:
        ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)  # below the axes
    ax.grid(alpha=0.2)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110, what="steering figure")


__all__ = ["plot_steering"]
