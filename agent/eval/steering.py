"""Steering scored against the driver's intent: the labels smoothed over +-0.5 s instead of the raw key taps.

Shapes: N frames of one recording; S session segments.

Udacity training-mode labels are mostly keyboard taps (most labels exactly 0, a curve steered as
a train of short taps), so the raw-label MSE mixes two things: how well a policy follows the
driver's intent and how well it guesses on which frame a tap lands, which the camera does not
show (:mod:`agent.eval.label_floor`). The functions here score the policy against the intent
instead, taking as the intent the labels averaged over a centred window of +-``half_width_s``
seconds of capture time, the label itself included, inside one session segment: exactly the
smoothed oracle of the project's keyboard-noise floor (:func:`agent.eval.label_floor.smoothed_oracle`
with ``exclude_self=False``), here used as the target rather than as a predictor.

- :func:`smoothed_ratio`: the MSE against the smoothed labels over predict-0's MSE on the same
  smoothed labels (the project's ratio, on the intent instead of the taps).
- :func:`pearson`: the Pearson correlation of predictions and smoothed labels (standard;
  Pearson 1895), blind to the scale and offset of the prediction.
- :func:`right_way`: on curve frames (``|smoothed| > threshold``), the share where the prediction
  has the smoothed label's sign, overall and for left and right curves (the project's own
  measure: does it turn the right way, whatever the amount).
- :func:`curve_magnitude`: on the same curve frames, the mean ``|prediction|`` against the mean
  ``|smoothed label|`` (the project's own measure: an under-steering policy shows a ratio below 1).
- :func:`timing`: the shift of the predictions in time (within +-1 s) that correlates best with
  the smoothed labels, and the smoothed ratio at that shift: how much of what is left is timing
  (a policy late or early against the driver) rather than the shape or size of its steering
  (the project's own diagnostic; the lag of the cross-correlation peak, a standard estimate of a
  delay, e.g. Knapp and Carter 1976).
- :func:`error_split`: where the error against the intent lies: the share of the squared error
  on straight frames (``|smoothed| <= threshold``), the mean ``|prediction|`` there, and on curve
  frames the mean signed excess ``pred * sign(smoothed) - |smoothed|`` (+ = steers more than the
  driver meant, - = less or the wrong way); the project's own diagnostic, so a ratio above 1 can be
  read as wandering on straights or over-steering in curves.
- :func:`intent_scores`: all of them for one recording from its raw labels and capture times.

Convention (:mod:`agent.data.udacity`): steering is normalised to [-1, 1], 1.0 = 25 degrees,
**positive = right, negative = left**; so a left curve is a frame with ``smoothed < -threshold``
and a right curve one with ``smoothed > threshold``.

Bad input (arrays of different lengths, not 1-D, empty or not finite) raises ``ValueError``
naming the arrays; a measure that is undefined on good input (no curve frames, every smoothed
label 0, a constant prediction) is NaN, as each function's docstring says.
"""

from __future__ import annotations

import math

import numpy as np

from agent.eval.label_floor import FLOOR_HALF_WIDTH_S, session_segments, smoothed_oracle

INTENT_HALF_WIDTH_S = FLOOR_HALF_WIDTH_S  # seconds either side: the floor's window, 0.5 s
CURVE_THRESHOLD = 0.05  # normalised steering (1.25 degrees): |smoothed label| above it is a curve frame


def _pair(pred, smoothed) -> tuple[np.ndarray, np.ndarray]:
    """``pred`` and ``smoothed`` as float64 (N,) arrays, checked."""
    p = np.asarray(pred, np.float64)
    s = np.asarray(smoothed, np.float64)
    if p.ndim != 1 or s.ndim != 1:
        raise ValueError(f"predictions and smoothed labels must be 1-D (N,), got shapes {p.shape} and {s.shape}")
    if len(p) != len(s):
        raise ValueError(f"predictions have {len(p)} frames but the smoothed labels {len(s)}; "
                         "give one prediction per label, in the recording's order")
    if len(p) == 0:
        raise ValueError("no frames: predictions and smoothed labels are empty")
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(s))):
        raise ValueError("predictions and smoothed labels must be finite numbers (found NaN or inf)")
    return p, s


def _threshold(threshold: float) -> float:
    if not (isinstance(threshold, (int, float, np.integer, np.floating)) and math.isfinite(threshold)
            and threshold >= 0):
        raise ValueError(f"threshold must be a finite steering value >= 0, got {threshold!r}")
    return float(threshold)


def smooth_in_time(steering, timestamps, half_width_s: float = INTENT_HALF_WIDTH_S, *, segments=None) -> np.ndarray:
    """The driver's intent: each label replaced by the mean of the labels within +-``half_width_s``
    seconds of its capture time, itself included, inside its session segment.

    This is :func:`agent.eval.label_floor.smoothed_oracle` (``exclude_self=False``), the smoothing
    of the project's keyboard-noise floor; timestamps may be irregular (the window is in seconds,
    not frames) and near a segment's ends the window holds only the frames that exist.

    Args:
        steering: (N,) raw labels, normalised steering (1.0 = 25 degrees, + = right).
        timestamps: (N,) capture times in seconds, strictly increasing within each segment.
        half_width_s: seconds either side (>= 0; 0 returns the labels).
        segments: optional (S, 2) [start, stop) frame ranges (a loaded recording's ``segments``);
            default: split where consecutive frames are more than ``MAX_GAP_S`` apart.

    Returns:
        (N,) float64 smoothed labels.

    Raises:
        ValueError: as :func:`agent.eval.label_floor.smoothed_oracle` (lengths that disagree, empty
            or non-finite arrays, time that does not increase, bad segments, a negative width).
    """
    return smoothed_oracle(steering, timestamps, half_width_s, segments=segments, exclude_self=False)


def smoothed_ratio(pred, smoothed) -> dict:
    """The MSE of ``pred`` against the smoothed labels over predict-0's MSE on them.

    Args:
        pred: (N,) predicted steering (normalised).
        smoothed: (N,) smoothed labels (:func:`smooth_in_time`).

    Returns:
        dict with ``mse`` (mean (pred - smoothed)^2), ``zero_mse`` (mean smoothed^2, the predict-0
        MSE) and ``ratio`` = ``mse / zero_mse`` (NaN when every smoothed label is 0). A prediction
        equal to the smoothed labels gives 0; predicting 0 gives 1.

    Raises:
        ValueError: arrays not 1-D, of different lengths, empty or not finite.
    """
    p, s = _pair(pred, smoothed)
    mse, zero = float(np.mean((p - s) ** 2)), float(np.mean(s ** 2))
    return {"mse": mse, "zero_mse": zero, "ratio": mse / zero if zero > 0 else math.nan}


def pearson(pred, smoothed) -> float:
    """The Pearson correlation coefficient r of ``pred`` and the smoothed labels (standard definition:
    covariance over the product of the standard deviations), in [-1, 1].

    Args:
        pred: (N,) predicted steering.
        smoothed: (N,) smoothed labels.

    Returns:
        r as a float; NaN when either array is constant (zero variance, including N = 1).

    Raises:
        ValueError: arrays not 1-D, of different lengths, empty or not finite.
    """
    p, s = _pair(pred, smoothed)
    dp, ds = p - p.mean(), s - s.mean()
    den = math.sqrt(float(np.sum(dp ** 2)) * float(np.sum(ds ** 2)))
    if den == 0 or not math.isfinite(den):
        return math.nan
    return float(np.clip(np.sum(dp * ds) / den, -1.0, 1.0))


def right_way(pred, smoothed, threshold: float = CURVE_THRESHOLD) -> dict:
    """On curve frames, the share where the prediction turns the way the driver meant.

    A curve frame has ``|smoothed| > threshold``; it is turned the right way when
    ``sign(pred) == sign(smoothed)`` (a prediction of exactly 0 is not a turn, so it counts as
    wrong). Left curves have ``smoothed < -threshold`` (negative steering is left in this project),
    right curves ``smoothed > threshold``.

    Args:
        pred: (N,) predicted steering.
        smoothed: (N,) smoothed labels.
        threshold: normalised steering >= 0 (default 0.05, 1.25 degrees).

    Returns:
        dict with ``share``, ``left_share`` and ``right_share`` (in [0, 1]; NaN where there is no
        curve frame of that kind) and the frame counts ``n_curve``, ``n_left``, ``n_right``.

    Raises:
        ValueError: arrays not 1-D, of different lengths, empty or not finite; a negative threshold.
    """
    p, s = _pair(pred, smoothed)
    th = _threshold(threshold)
    left, right = s < -th, s > th
    ok = np.sign(p) == np.sign(s)
    share = lambda m: float(np.mean(ok[m])) if m.any() else math.nan  # noqa: E731
    return {"share": share(left | right), "left_share": share(left), "right_share": share(right),
            "n_curve": int((left | right).sum()), "n_left": int(left.sum()), "n_right": int(right.sum())}


def curve_magnitude(pred, smoothed, threshold: float = CURVE_THRESHOLD) -> dict:
    """On curve frames (``|smoothed| > threshold``), how much the prediction steers against how much
    the driver meant to.

    Args:
        pred: (N,) predicted steering.
        smoothed: (N,) smoothed labels.
        threshold: normalised steering >= 0 (default 0.05).

    Returns:
        dict with ``mean_abs_pred`` (mean ``|pred|``), ``mean_abs_label`` (mean ``|smoothed|``),
        ``ratio`` (their quotient: 0.5 for a prediction at half the driver's amount, whatever its
        sign) and ``n_curve``; the three means are NaN when there is no curve frame.

    Raises:
        ValueError: arrays not 1-D, of different lengths, empty or not finite; a negative threshold.
    """
    p, s = _pair(pred, smoothed)
    curve = np.abs(s) > _threshold(threshold)
    if not curve.any():
        return {"mean_abs_pred": math.nan, "mean_abs_label": math.nan, "ratio": math.nan, "n_curve": 0}
    a, b = float(np.mean(np.abs(p[curve]))), float(np.mean(np.abs(s[curve])))
    return {"mean_abs_pred": a, "mean_abs_label": b, "ratio": a / b, "n_curve": int(curve.sum())}


def error_split(pred, smoothed, threshold: float = CURVE_THRESHOLD) -> dict:
    """Where the squared error against the smoothed labels lies: straight frames or curves, and in
    curves whether the prediction steers too much or too little.

    Straight frames have ``|smoothed| <= threshold``, curve frames ``|smoothed| > threshold`` (as
    :func:`right_way`). The squared error ``(pred - smoothed) ** 2`` summed over straight frames,
    over its sum over all frames, is the straights' share of the MSE (the smoothed ratio's
    numerator); the rest is the curves'.

    Args:
        pred: (N,) predicted steering.
        smoothed: (N,) smoothed labels.
        threshold: normalised steering >= 0 (default 0.05).

    Returns:
        dict with ``straight_error_share`` (in [0, 1]; NaN when the error is 0 everywhere),
        ``straight_mean_abs_pred`` (mean ``|pred|`` on straight frames; NaN when there are none),
        ``curve_signed_excess`` (mean of ``pred * sign(smoothed) - |smoothed|`` on curve frames,
        normalised steering: + over-steers, - under-steers or turns the wrong way; NaN when there
        is no curve frame) and ``n_straight``.

    Raises:
        ValueError: arrays not 1-D, of different lengths, empty or not finite; a negative threshold.
    """
    p, s = _pair(pred, smoothed)
    curve = np.abs(s) > _threshold(threshold)
    sq = (p - s) ** 2
    total = float(sq.sum())
    return {"straight_error_share": float(sq[~curve].sum()) / total if total > 0 else math.nan,
            "straight_mean_abs_pred": float(np.mean(np.abs(p[~curve]))) if (~curve).any() else math.nan,
            "curve_signed_excess": float(np.mean(p[curve] * np.sign(s[curve]) - np.abs(s[curve])))
            if curve.any() else math.nan,
            "n_straight": int((~curve).sum())}


MAX_LAG_S = 1.0  # seconds either way that :func:`timing` searches


def timing(pred, smoothed, timestamps, *, segments=None, max_lag_s: float = MAX_LAG_S) -> dict:
    """The time shift of the predictions that best matches the driver's intent.

    For each shift of ``k`` frames (``|k|`` up to ``max_lag_s`` in frames at the recording's median
    frame interval) the prediction of frame ``i + k`` is paired with the smoothed label of frame
    ``i``, for every ``i`` whose partner lies in the same session segment, and the pairs' Pearson r
    is taken; the best shift is the one with the largest r (ties: the smallest ``|k|``). A positive
    lag means the policy is **late**: what the driver meant at time t, it steers at t + lag.

    Args:
        pred: (N,) predicted steering.
        smoothed: (N,) smoothed labels (:func:`smooth_in_time`).
        timestamps: (N,) capture times in seconds (only their median interval within segments is used).
        segments: optional (S, 2) [start, stop) session segments; default: split at gaps over
            :data:`agent.data.udacity.MAX_GAP_S` (:func:`agent.eval.label_floor.session_segments`).
        max_lag_s: seconds searched either way (> 0; default 1).

    Returns:
        dict with ``lag_s`` (the best shift in seconds, ``k`` times the median frame interval),
        ``lag_frames`` (``k``), ``corr_at_lag`` (r at that shift), ``corr_at_0`` (r unshifted, as
        :func:`pearson`), ``ratio_at_lag`` (:func:`smoothed_ratio` of the shifted pairs) and
        ``ratio_at_0``; every value NaN when no shift has two pairs with non-zero variance.

    Raises:
        ValueError: arrays not 1-D, of different lengths, empty or not finite; a ``max_lag_s`` that
            is not a positive number; bad segments or timestamps (as :func:`smooth_in_time`).
    """
    p, s = _pair(pred, smoothed)
    if not (isinstance(max_lag_s, (int, float, np.integer, np.floating)) and math.isfinite(max_lag_s)
            and max_lag_s > 0):
        raise ValueError(f"max_lag_s must be a positive number of seconds, got {max_lag_s!r}")
    t = np.asarray(timestamps, np.float64)
    if t.shape != p.shape:
        raise ValueError(f"timestamps have shape {t.shape} but there are {len(p)} predictions; give one "
                         "capture time (seconds) per frame")
    seg = session_segments(t, segments)
    seg_id = np.repeat(np.arange(len(seg)), seg[:, 1] - seg[:, 0])
    dts = np.concatenate([np.diff(t[a:b]) for a, b in seg.tolist()])
    dt = float(np.median(dts)) if dts.size else math.nan
    nan = {"lag_s": math.nan, "lag_frames": 0, "corr_at_lag": math.nan, "corr_at_0": math.nan,
           "ratio_at_lag": math.nan, "ratio_at_0": math.nan}
    if not math.isfinite(dt) or dt <= 0:
        return nan
    k_max = max(1, int(round(max_lag_s / dt)))
    best = None
    for k in sorted(range(-k_max, k_max + 1), key=lambda k: (abs(k), k)):
        i = np.arange(max(0, -k), len(p) - max(0, k))
        i = i[seg_id[i] == seg_id[i + k]]
        if len(i) < 2:
            continue
        r = pearson(p[i + k], s[i])
        if math.isnan(r):
            continue
        ratio = smoothed_ratio(p[i + k], s[i])["ratio"]
        if k == 0:
            nan.update(corr_at_0=r, ratio_at_0=ratio)
        if best is None or r > best[1]:
            best = (k, r, ratio)
    if best is None:
        return nan
    k, r, ratio = best
    return {**nan, "lag_s": round(k * dt, 6), "lag_frames": int(k), "corr_at_lag": r, "ratio_at_lag": ratio}


def intent_scores(pred, steering, timestamps, *, segments=None, half_width_s: float = INTENT_HALF_WIDTH_S,
                  threshold: float = CURVE_THRESHOLD) -> dict:
    """Every measure of this module for one recording, from its raw labels and capture times.

    Args:
        pred: (N,) predicted steering, one per label in the recording's order.
        steering: (N,) raw labels (normalised, + = right).
        timestamps: (N,) capture times in seconds.
        segments: optional (S, 2) [start, stop) session segments (see :func:`smooth_in_time`).
        half_width_s: the smoothing's half-width in seconds (default 0.5).
        threshold: the curve threshold on ``|smoothed|`` (default 0.05).

    Returns:
        ``{"smoothed": (N,) float64 smoothed labels, "scores": dict}``, the scores holding
        ``half_width_s``, ``curve_threshold``, ``smoothed_mse``, ``smoothed_zero_mse``,
        ``smoothed_ratio``, ``smoothed_corr`` (Pearson r), ``right_way``, ``right_way_left``,
        ``right_way_right``, ``n_curve``, ``n_left``, ``n_right``, ``curve_mean_abs_pred``,
        ``curve_mean_abs_label``, ``curve_abs_ratio``, from :func:`error_split`
        ``straight_error_share``, ``straight_mean_abs_pred``, ``curve_signed_excess`` and
        ``n_straight``, and from :func:`timing` ``best_lag_s``, ``corr_at_best_lag`` and
        ``smoothed_ratio_at_best_lag`` (NaN where undefined, as above).

    Raises:
        ValueError: ``pred`` and ``steering`` of different lengths, or as :func:`smooth_in_time`.
    """
    p = np.asarray(pred, np.float64)
    if p.ndim != 1 or len(p) != len(np.asarray(steering)):
        raise ValueError(f"predictions have shape {p.shape} but there are {len(np.asarray(steering))} labels; "
                         "give one prediction per label, in the recording's order")
    sm = smooth_in_time(steering, timestamps, half_width_s, segments=segments)
    r, way, mag = smoothed_ratio(p, sm), right_way(p, sm, threshold), curve_magnitude(p, sm, threshold)
    lag = timing(p, sm, timestamps, segments=segments)
    split = error_split(p, sm, threshold)
    return {"smoothed": sm, "scores": {
        "half_width_s": float(half_width_s), "curve_threshold": float(threshold),
        "smoothed_mse": r["mse"], "smoothed_zero_mse": r["zero_mse"], "smoothed_ratio": r["ratio"],
        "smoothed_corr": pearson(p, sm),
        "right_way": way["share"], "right_way_left": way["left_share"], "right_way_right": way["right_share"],
        "n_curve": way["n_curve"], "n_left": way["n_left"], "n_right": way["n_right"],
        "curve_mean_abs_pred": mag["mean_abs_pred"], "curve_mean_abs_label": mag["mean_abs_label"],
        "curve_abs_ratio": mag["ratio"], **split, "best_lag_s": lag["lag_s"], "corr_at_best_lag": lag["corr_at_lag"],
        "smoothed_ratio_at_best_lag": lag["ratio_at_lag"]}}


__all__ = ["CURVE_THRESHOLD", "INTENT_HALF_WIDTH_S", "MAX_LAG_S", "curve_magnitude", "error_split", "intent_scores",
           "pearson", "right_way", "smooth_in_time", "smoothed_ratio", "timing"]
