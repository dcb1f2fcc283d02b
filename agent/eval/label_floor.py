"""The keyboard-noise floor of steering labels: how low can a frame-only policy's MSE go?

Shapes: N frames; S session segments; K half-widths.

Udacity training-mode recordings are mostly keyboard driving: most labels are exactly 0 and a
curve is steered as a train of short taps. Which frame a tap lands on is not visible in the
camera image, so a policy that sees frames can at best predict the driver's *intent*, roughly
the local average of the taps, and the remainder of each label is noise that no policy can
remove. The **smoothed oracle** measures that remainder: it predicts every label by the centred
moving average of the same driver's own labels within +-``half_width_s`` seconds and scores the
prediction against the raw labels, beside the predict-0 baseline. Its ratio
``oracle MSE / predict-0 MSE`` is then an estimate of the lowest ratio a policy scored on these
raw labels can reach (the floor); a target ratio below it asks the policy to predict key taps.

This is the *noise ceiling* of model evaluation in neuroscience (the part of a response that is
repeatable, hence explainable by any model: Nili et al. 2014, "A toolbox for representational
similarity analysis", PLoS Comput. Biol. 10(4): e1003553; Schoppe et al. 2016, "Measuring the
performance of neural models", Front. Comput. Neurosci. 10:10), and equally an estimate of the
Bayes error of keyboard labels: if the taps are independent given the intent, no predictor beats
the intent, and the smoothed labels stand in for the intent.

It is an estimate, not a proof: a policy can beat it where a driver's taps are predictable from
the image (always tapping at the same spot), or where the moving average is a poor stand-in for
the intent (a window much wider than a curve blurs it; a window much narrower keeps the taps,
and at a half-width of 0 the oracle is the label itself, ratio 0). By default the window holds
the frame's own label, which lowers the oracle's error by a factor (n - 1) / n for n frames in
it; ``exclude_self=True`` averages only the *other* labels in the window (leave-one-out), which
raises it by n / (n - 1) instead; the two give a range for the floor at a given width.

Worked example (the expectation the tests check): taps of size a landing independently on each
frame with probability p (duty cycle p), a window of n frames. Predict-0 MSE is a^2 p; the
average's error x_i - mean has mean 0 and variance a^2 p (1 - p) (n - 1) / n, so the ratio is
(1 - p) (n - 1) / n, about 1 - p for a wide window (leaving the frame out: (1 - p) n / (n - 1)).
One-sided taps at duty cycle 0.5 in a curve thus leave a floor near 0.5, and taps of random
sign leave a floor near 1.

Time: windows are in seconds of capture time (frames come at irregular ~10-15 Hz), never span
two session segments (a gap over ``MAX_GAP_S`` seconds between frames starts a new one, the rule
of :func:`agent.data.udacity.find_segments`), and near a segment's ends average only the frames
that exist. Steering is normalised (1.0 = 25 degrees), as in the recordings.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from agent.data.udacity import MAX_GAP_S, find_segments, parse_log
FLOOR_HALF_WIDTH_S = 0.5  # seconds: the half-width reported next to every Udacity steering score
_EDGE_S = 1e-9  # seconds of tolerance at the window's edges (timestamps are float sums of milliseconds)


def width_key(half_width_s: float) -> str:
    """The string key of a half-width in result dicts and JSON: ``0.5`` -> ``"0.5"``, ``1.0`` -> ``"1"``."""
    return format(float(half_width_s), "g")


def _segments_of(t: np.ndarray, max_gap_s: float) -> np.ndarray:
    gaps = np.diff(t)
    bad = np.flatnonzero(gaps <= 0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"timestamps must increase strictly (seconds, one per label): timestamps[{i + 1}] = "
                         f"{float(t[i + 1])} follows timestamps[{i}] = {float(t[i])}; pass segments= (e.g. from "
                         "agent.data.udacity.find_segments) to split a recording where time goes back")
    bounds = np.concatenate([[0], np.flatnonzero(gaps > max_gap_s) + 1, [len(t)]])
    return np.stack([bounds[:-1], bounds[1:]], 1).astype(np.int64)


def _check(steering, timestamps, half_width_s, max_gap_s, segments) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = np.asarray(steering, np.float64)
    t = np.asarray(timestamps, np.float64)
    if s.ndim != 1 or t.ndim != 1:
        raise ValueError(f"steering and timestamps must be 1-D (N,), got shapes {s.shape} and {t.shape}")
    if len(s) != len(t):
        raise ValueError(f"steering has {len(s)} labels but timestamps has {len(t)} values; "
                         "give one capture time (seconds) per label")
    if len(s) == 0:
        raise ValueError("no labels: steering and timestamps are empty")
    if not np.all(np.isfinite(s)) or not np.all(np.isfinite(t)):
        raise ValueError("steering and timestamps must be finite numbers (found NaN or inf)")
    if not (isinstance(half_width_s, (int, float, np.floating, np.integer)) and math.isfinite(half_width_s)
            and half_width_s >= 0):
        raise ValueError(f"half_width_s must be a finite number of seconds >= 0, got {half_width_s!r}")
    if not max_gap_s > 0:
        raise ValueError(f"max_gap_s must be > 0 seconds, got {max_gap_s!r}")
    if segments is None:
        return s, t, _segments_of(t, max_gap_s)
    seg = np.asarray(segments, np.int64)
    n = len(s)
    if (seg.ndim != 2 or seg.shape[1] != 2 or seg.shape[0] == 0 or seg[0, 0] != 0 or seg[-1, 1] != n
            or np.any(seg[1:, 0] != seg[:-1, 1]) or np.any(seg[:, 1] <= seg[:, 0])):
        raise ValueError(f"segments must be (S, 2) [start, stop) ranges tiling frames 0..{n} in order, "
                         f"got {seg.tolist()[:8]}{' ...' if len(seg) > 8 else ''}")
    for a, b in seg.tolist():
        if np.any(np.diff(t[a:b]) <= 0):
            i = a + int(np.flatnonzero(np.diff(t[a:b]) <= 0)[0])
            raise ValueError(f"timestamps must increase strictly within a segment: timestamps[{i + 1}] = "
                             f"{float(t[i + 1])} follows timestamps[{i}] = {float(t[i])} inside segment [{a}, {b})")
    return s, t, seg


def session_segments(timestamps, segments=None, max_gap_s: float = MAX_GAP_S) -> np.ndarray:
    """The checked (S, 2) [start, stop) session segments of a recording's (N,) capture times: the
    given ``segments`` after checking that they tile 0..N with time increasing inside each, or, when
    None, the recording split at gaps over ``max_gap_s`` seconds (the rule of
    :func:`agent.data.udacity.find_segments`).

    Raises:
        ValueError: timestamps not 1-D, empty or not finite; time that does not increase (within a
            segment); ``segments`` that do not tile 0..N; ``max_gap_s`` <= 0.
    """
    t = np.asarray(timestamps, np.float64)
    return _check(np.zeros(t.shape), t, 0.0, max_gap_s, segments)[2]


def smoothed_oracle(steering, timestamps, half_width_s: float, *, max_gap_s: float = MAX_GAP_S,
                    segments=None, exclude_self: bool = False) -> np.ndarray:
    """The smoothed oracle's prediction: each label replaced by the mean of the labels near it in time.

    Label i is predicted by the mean of every label j of the same segment with
    ``|timestamps[j] - timestamps[i]| <= half_width_s`` (label i included unless
    ``exclude_self``; near a segment's ends, only the frames that exist).

    Args:
        steering: (N,) labels (normalised steering, 1.0 = 25 degrees).
        timestamps: (N,) capture times in seconds (any origin).
        half_width_s: seconds either side of each frame (>= 0; 0 returns the labels).
        max_gap_s: seconds; a longer gap between consecutive frames starts a new segment (the
            project's rule, :data:`agent.data.udacity.MAX_GAP_S`). Ignored when ``segments`` is given.
        segments: optional (S, 2) [start, stop) frame ranges to use instead of splitting at gaps,
            e.g. a loaded recording's ``segments`` (which also split where time goes back).
        exclude_self: average only the other labels in the window (leave-one-out); a frame with
            no other label in its window is predicted 0.

    Returns:
        (N,) float64 predictions.

    Raises:
        ValueError: arrays not 1-D, of different lengths, empty or not finite; a negative or
            non-finite ``half_width_s``; ``max_gap_s`` <= 0; time that does not increase strictly
            (within each segment, when ``segments`` is given); ``segments`` that do not tile 0..N.
    """
    s, t, seg = _check(steering, timestamps, half_width_s, max_gap_s, segments)
    out = np.empty_like(s)
    for a, b in seg.tolist():
        x, tt = s[a:b], t[a:b]
        lo = np.searchsorted(tt, tt - half_width_s - _EDGE_S, side="left")
        hi = np.searchsorted(tt, tt + half_width_s + _EDGE_S, side="right")
        csum = np.concatenate([[0.0], np.cumsum(x)])
        total, count = csum[hi] - csum[lo], (hi - lo).astype(np.float64)
        if exclude_self:
            total, count = total - x, count - 1
        out[a:b] = np.where(count > 0, total / np.maximum(count, 1), 0.0)
    return out


def smoothed_oracle_ratio(steering, timestamps, half_width_s: float, *, max_gap_s: float = MAX_GAP_S,
                          segments=None, exclude_self: bool = False) -> dict:
    """The smoothed oracle's MSE against the raw labels, the predict-0 MSE and their ratio.

    Args: as :func:`smoothed_oracle` (steering (N,) normalised, timestamps (N,) seconds,
    ``half_width_s`` seconds, ``exclude_self``).

    Returns:
        dict with ``mse`` (oracle vs. raw labels), ``zero_mse`` (mean squared label, the
        predict-0 MSE), ``ratio`` = ``mse / zero_mse`` (None when every label is 0),
        ``half_width_s``, ``exclude_self``, ``n_frames`` and ``n_segments``.

    Raises:
        ValueError: as :func:`smoothed_oracle`.
    """
    s, t, seg = _check(steering, timestamps, half_width_s, max_gap_s, segments)
    pred = smoothed_oracle(s, t, half_width_s, segments=seg, exclude_self=exclude_self)
    mse = float(np.mean((s - pred) ** 2))
    zero = float(np.mean(s ** 2))
    return {"mse": mse, "zero_mse": zero, "ratio": mse / zero if zero > 0 else None,
            "half_width_s": float(half_width_s), "exclude_self": bool(exclude_self), "n_frames": int(len(s)),
            "n_segments": int(len(seg))}


def recording_floor(path: str | Path, half_widths=(FLOOR_HALF_WIDTH_S,), *, on_bad_row: str = "skip",
                    max_gap_s: float = MAX_GAP_S, exclude_self: bool = False) -> dict:
    """The smoothed-oracle floor of one Udacity recording, read from its CSV without decoding images.

    The rows are those of :func:`agent.data.udacity.parse_log` (right columns, numbers, images
    present, a timestamp in the name); a row whose JPEG exists but cannot be decoded is counted
    here though ``load_recording`` would skip it. Segments follow
    :func:`agent.data.udacity.find_segments` (a gap over ``max_gap_s`` or time going back).

    Args:
        path: the recording folder or its ``driving_log.csv``.
        half_widths: K half-widths in seconds.
        on_bad_row: as :func:`agent.data.udacity.parse_log`; "error" raises if any row is unusable.
        max_gap_s: seconds between frames that start a new segment.
        exclude_self: as :func:`smoothed_oracle` (leave-one-out windows).

    Returns:
        dict with ``data`` (the CSV), ``n_frames``, ``n_segments``, ``n_bad_rows_skipped``, ``exclude_self``,
        ``zero_share`` (share of labels exactly 0), ``zero_mse`` and, per half-width (keys from
        :func:`width_key`), ``oracle_mse`` and ``oracle_ratio`` dicts.

    Raises:
        FileNotFoundError: no CSV at ``path``.
        ValueError: no usable row, bad rows with ``on_bad_row="error"``, or a negative half-width.
    """
    csv_path, good, bad = parse_log(path, on_bad_row)
    if bad and on_bad_row == "error":
        listed = "; ".join(str(b) for b in bad[:10]) + (" ..." if len(bad) > 10 else "")
        raise ValueError(f"{csv_path}: {len(bad)} bad row(s): {listed}")
    if not good:
        raise ValueError(f"{csv_path}: no usable rows")
    steering = np.array([g[2][0] for g in good], np.float64)
    t0 = good[0][3]
    timestamps = np.array([(g[3] - t0).total_seconds() for g in good], np.float64)
    segments = find_segments(timestamps, max_gap_s)
    res = {"data": str(csv_path), "n_frames": int(len(steering)), "n_segments": int(len(segments)),
           "n_bad_rows_skipped": len(bad), "exclude_self": bool(exclude_self),
           "zero_share": float(np.mean(steering == 0)),
           "zero_mse": float(np.mean(steering ** 2)), "oracle_mse": {}, "oracle_ratio": {}}
    for w in half_widths:
        r = smoothed_oracle_ratio(steering, timestamps, w, segments=segments, exclude_self=exclude_self)
        res["oracle_mse"][width_key(w)] = r["mse"]
        res["oracle_ratio"][width_key(w)] = r["ratio"]
    return res


def floor_means(rows: list[dict], half_widths) -> dict:
    """Per-track means of :func:`recording_floor` results (each recording weighs the same).

    Args:
        rows: results of :func:`recording_floor`, each with a ``track`` entry (missing: "-").
        half_widths: the half-widths (seconds) to average.

    Returns:
        ``{track: {...}}`` for each track in sorted order, then "all": ``n_recordings``,
        ``n_frames`` (total), ``zero_mse`` (mean) and per half-width key ``oracle_mse`` (mean),
        ``ratio_of_means`` (mean oracle MSE / mean predict-0 MSE, the measure of the LODO
        table) and ``mean_ratio`` (mean of the per-recording ratios).
    """
    out = {}
    for name in sorted({r.get("track", "-") for r in rows}) + (["all"] if rows else []):
        g = [r for r in rows if name == "all" or r.get("track", "-") == name]
        zero = float(np.mean([r["zero_mse"] for r in g]))
        m = {"n_recordings": len(g), "n_frames": int(sum(r["n_frames"] for r in g)), "zero_mse": zero,
             "oracle_mse": {}, "ratio_of_means": {}, "mean_ratio": {}}
        for w in half_widths:
            k = width_key(w)
            mse = float(np.mean([r["oracle_mse"][k] for r in g]))
            ratios = [r["oracle_ratio"][k] for r in g if r["oracle_ratio"][k] is not None]
            m["oracle_mse"][k] = mse
            m["ratio_of_means"][k] = mse / zero if zero > 0 else None
            m["mean_ratio"][k] = float(np.mean(ratios)) if ratios else None
        out[name] = m
    return out


def floor_markdown(rows: list[dict], half_widths) -> str:
    """A markdown table of :func:`recording_floor` results (each with ``recording`` and ``track``)
    and their :func:`floor_means`: one smoothed-oracle ratio column per half-width."""
    f = lambda x, fmt=".2f": "-" if x is None else format(x, fmt)  # noqa: E731
    keys = [width_key(w) for w in half_widths]
    loo = any(r.get("exclude_self") for r in rows)
    head = ("| recording | track | frames | segments | labels = 0 | predict-0 MSE | " +
            " | ".join(f"oracle ratio ±{k} s" for k in keys) + " |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['recording']} | {r.get('track', '-')} | {r['n_frames']} | {r['n_segments']} | "
                     f"{r['zero_share']:.2f} | {r['zero_mse']:.4f} | " +
                     " | ".join(f(r["oracle_ratio"][k]) for k in keys) + " |")
    for name, m in floor_means(rows, half_widths).items():
        lines.append(f"| **mean, {name}** ({m['n_recordings']} recordings) | {name} | {m['n_frames']} | | | "
                     f"{m['zero_mse']:.4f} | " +
                     " | ".join(f"{f(m['ratio_of_means'][k])} ({f(m['mean_ratio'][k])})" for k in keys) + " |")
    return ("Smoothed oracle: each label predicted by the centred moving average of the driver's own labels "
            "within ±h s (same session segment" + (", the label itself left out" if loo else "") +
            "), scored against the raw labels; ratio = oracle MSE / predict-0 MSE, an estimate of the lowest ratio a frame-only policy can reach. Means: mean oracle MSE / mean "
            "predict-0 MSE (mean of the ratios in brackets).\n\n" + "\n".join(lines) + "\n")


__all__ = ["FLOOR_HALF_WIDTH_S", "floor_markdown", "floor_means", "recording_floor", "session_segments",
           "smoothed_oracle", "smoothed_oracle_ratio", "width_key"]
