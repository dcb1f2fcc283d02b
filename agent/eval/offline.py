"""Offline scoring: what a policy outputs while streaming through recorded sequences, frame by frame.

Shapes: N frames of a sequence, A the head's outputs, R sequences stepped side by side.

:func:`stream_outputs` feeds each sequence (a CarRacing episode, a Udacity session segment) to
the policy's streaming ``step`` in order, exactly as the policy acts when it drives (the window
restarts at every sequence start), R sequences at a time as one batch. :func:`score_stream`
reduces that to the head's metric (accuracy for discrete actions, mean squared error for
steering), which the trainer uses to choose its checkpoint; :func:`evaluate_udacity` is
``agent evaluate --env udacity``: the steering error on a recording with the trivial baselines,
the keyboard-noise floor and the scores against the driver's intent (:mod:`agent.eval.steering`);
:func:`summarize_recordings` and :func:`summarize_by_track` average them over recordings.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from agent.data.udacity import UdacityRecording, load_recording, reversing_frames
from agent.data.udacity_cache import CachedRecording
from agent.data.windows import UdacitySource
from agent.eval.label_floor import FLOOR_HALF_WIDTH_S, smoothed_oracle_ratio
from agent.eval.steering import intent_scores, pearson, smoothed_ratio
from agent.log import progress as bar_for


@torch.no_grad()
def stream_outputs(policy, source, rows: int = 16, progress: bool = False) -> list[np.ndarray]:
    """(N_e, A) outputs of ``policy.step`` on every frame of every sequence of ``source``, in order.

    Args:
        policy: a :class:`agent.nn.policy.DrivingPolicy` (put in eval mode; restored after).
        source: a :class:`agent.data.windows.DemonstrationSource` or ``UdacitySource`` (unaugmented).
        rows: sequences stepped side by side (a batch of ``rows`` frames per step).
        progress: show a progress bar (only where stderr is a terminal).
    """
    was_training = policy.training
    policy.eval()
    lengths = source.lengths
    outputs: list[np.ndarray | None] = [None] * len(lengths)
    order = sorted((e for e in range(len(lengths)) if lengths[e] > 0), key=lambda e: -lengths[e])
    bar = bar_for(total=sum(lengths), desc="scoring", unit="frame", disable=not progress, leave=False)
    for c in range(0, len(order), rows):
        chunk = order[c:c + rows]
        data = [source.window(e, 0, lengths[e]) for e in chunk]
        n = [lengths[e] for e in chunk]
        state, res = None, []
        for i in range(max(n)):
            pos = [min(i, k - 1) for k in n]  # a finished sequence repeats its last frame (ignored)
            frames = np.stack([d[0][p] for d, p in zip(data, pos)])
            t = torch.tensor([float(d[2][p]) + (i - p) for d, p in zip(data, pos)], dtype=torch.float64)
            out, state = policy.step(frames, state, t=t)
            res.append(out.float().cpu().numpy())
            bar.update(sum(1 for k in n if i < k))
        res = np.stack(res, 1)  # (rows, N_max, A)
        for j, e in enumerate(chunk):
            outputs[e] = res[j, :n[j]]
    bar.close()
    policy.train(was_training)
    return [o if o is not None else np.zeros((0, policy.head.out_dim), np.float32) for o in outputs]


def score_stream(policy, source, rows: int = 16) -> tuple[float, int]:
    """The head's metric (accuracy or MSE) over every frame of ``source``, streaming; (value, frames).

    Returns NaN with 0 frames for an empty source.
    """
    outs = stream_outputs(policy, source, rows)
    total, count = 0.0, 0
    for e, out in enumerate(outs):
        if not len(out):
            continue
        target = source.targets(e)
        s, c = policy.head.metric_sums(torch.from_numpy(out)[None], torch.from_numpy(np.asarray(target))[None],
                                       torch.ones(1, len(out), dtype=torch.bool))
        total, count = total + s, count + c
    return (total / count if count else float("nan")), count


def predict_recording(policy, rec, rows: int = 16) -> np.ndarray:
    """Steering (N,) ``policy`` outputs streaming through a Udacity recording's center camera in
    order, the window restarting at every session segment (as a live drive restarts)."""
    outs = stream_outputs(policy, UdacitySource([rec]), rows)
    return np.concatenate([o[:, 0] for o in outs]).astype(np.float32) if outs else np.zeros(0, np.float32)


def evaluate_udacity(policy, data, on_bad_row: str = "skip", progress: bool = True, train_mean: float | None = None,
                     min_speed: float = 5.0, series: bool = False) -> dict:
    """Offline steering error on a Udacity recording (center camera, no augmentation, streaming in order).

    Args:
        policy: a steering policy (:class:`agent.nn.policy.DrivingPolicy` with a Box head).
        data: a recording folder (or its ``driving_log.csv``) or a loaded recording
            (:class:`agent.data.udacity.UdacityRecording` or :class:`agent.data.udacity_cache.CachedRecording`).
        on_bad_row: as :func:`agent.data.udacity.load_recording`.
        train_mean: the training mean steering, for the predict-the-mean baseline (default: the
            policy file's metadata ``train_mean_steering`` if present).
        min_speed: mph; ``moving_*`` figures count only frames at least this fast.
        series: also return the per-frame arrays under ``series`` (for a figure; not JSON).

    Returns:
        dict with ``mse``, ``mae`` (normalised steering; 1.0 = 25 degrees), ``n_frames``,
        ``n_segments``, ``rmse_degrees``, the baselines ``zero_mse`` / ``zero_mae`` (predict 0) and
        ``ratio`` = ``mse / zero_mse`` (None when every label is 0), the keyboard-noise floor
        beside it (:mod:`agent.eval.label_floor`: ``oracle_mse`` and ``oracle_ratio`` of the
        driver's own labels smoothed over +-``oracle_half_width_s`` = 0.5 s, about the lowest
        ratio a frame-only policy can be expected to reach),
        ``train_mean_mse`` (when known), ``moving_mse`` / ``moving_mae`` /
        ``moving_zero_mse`` / ``n_moving`` / ``moving_smoothed_mse`` / ``moving_smoothed_zero_mse`` /
        ``moving_smoothed_ratio`` / ``moving_smoothed_corr`` (the smoothed scores below, on those
        frames only) on the frames where the car drives forwards at speed >= ``min_speed``: not
        reversing (:func:`agent.data.udacity.reversing_frames`; ``n_reversing`` counts those) (None
        when no frame does), ``data``, ``n_bad_rows_skipped`` and
        ``seconds``; and the scores against the driver's intent, the labels smoothed over
        +-``intent_half_width_s`` = 0.5 s with the label included
        (:func:`agent.eval.steering.intent_scores`): ``smoothed_mse``, ``smoothed_zero_mse``, ``smoothed_ratio``, ``smoothed_corr`` (Pearson r), on curve frames
        (``|smoothed| > curve_threshold`` = 0.05) ``right_way`` / ``right_way_left`` /
        ``right_way_right`` (share turned the smoothed label's way; left is negative steering),
        ``n_curve`` / ``n_left`` / ``n_right``, ``curve_mean_abs_pred``, ``curve_mean_abs_label``,
        ``curve_abs_ratio``, ``straight_error_share`` / ``straight_mean_abs_pred`` /
        ``curve_signed_excess`` / ``n_straight`` (:func:`agent.eval.steering.error_split`),
        ``best_lag_s``, ``corr_at_best_lag`` and ``smoothed_ratio_at_best_lag``
        (:func:`agent.eval.steering.timing`); None where undefined (no curve frame, every smoothed label 0,
        a constant prediction). With ``series``: ``series`` = {``t``, ``pred``, ``label``,
        ``smoothed``: (N,) arrays, ``segments``: (S, 2)}.

    Raises:
        ValueError: a policy that does not output steering.
    """
    if getattr(policy, "output_kind", None) != "steering":
        raise ValueError(f"offline Udacity evaluation needs a steering policy; this one outputs "
                         f"{getattr(policy, 'output_kind', type(policy).__name__)!r}")
    t0 = time.time()

    rec = data if isinstance(data, (UdacityRecording, CachedRecording)) else \
        load_recording(Path(data), on_bad_row=on_bad_row, progress=progress)
    pred = predict_recording(policy, rec)
    if train_mean is None:
        train_mean = (getattr(policy, "metadata", None) or {}).get("train_mean_steering")
    res, smoothed = score_recording(pred, rec, train_mean=train_mean, min_speed=min_speed)
    res["seconds"] = time.time() - t0
    if series:
        res["series"] = {"t": np.asarray(rec.timestamps, np.float64), "pred": pred,
                         "label": np.asarray(rec.steering, np.float64), "smoothed": smoothed,
                         "segments": np.asarray(rec.segments)}
    return res


def score_recording(pred, rec, *, train_mean: float | None = None,
                    min_speed: float = 5.0) -> tuple[dict, np.ndarray]:
    """Every figure of :func:`evaluate_udacity` for given predictions on a loaded recording.

    Args:
        pred: (N,) predicted steering, one per row of ``rec`` in its order (normalised, + = right).
        rec: a :class:`agent.data.udacity.UdacityRecording` or :class:`agent.data.udacity_cache.CachedRecording`.
        train_mean: the training mean steering, for the predict-the-mean baseline (None: not scored).
        min_speed: mph; ``moving_*`` figures count only frames at least this fast.

    Returns:
        (scores, smoothed): the dict :func:`evaluate_udacity` returns, without ``seconds`` and ``series``,
        and the (N,) float64 labels smoothed over +-0.5 s that the intent scores were read against.

    Raises:
        ValueError: ``pred`` not one finite value per row (:func:`agent.eval.steering.intent_scores`).
    """
    pred = np.asarray(pred)
    if not np.issubdtype(pred.dtype, np.floating):
        pred = pred.astype(np.float64)
    if pred.shape != (len(rec),):
        raise ValueError(f"predictions must be one per row of the recording: shape ({len(rec)},), got {pred.shape}")
    err = pred - rec.steering
    mse = float(np.mean(err ** 2))
    res = {
        "mse": mse,
        "mae": float(np.mean(np.abs(err))),
        "n_frames": int(len(rec)),
        "n_segments": int(len(rec.segments)),
        "rmse_degrees": float(math.sqrt(mse) * 25.0),
        "zero_mse": float(np.mean(rec.steering ** 2)),
        "zero_mae": float(np.mean(np.abs(rec.steering))),
        "ratio": None,
        "data": rec.source,
        "n_bad_rows_skipped": len(rec.bad_rows),
    }
    if res["zero_mse"] > 0:
        res["ratio"] = mse / res["zero_mse"]
    floor = smoothed_oracle_ratio(rec.steering, rec.timestamps, FLOOR_HALF_WIDTH_S, segments=rec.segments)
    res.update(oracle_half_width_s=FLOOR_HALF_WIDTH_S, oracle_mse=floor["mse"], oracle_ratio=floor["ratio"])
    intent = intent_scores(pred, rec.steering, rec.timestamps, segments=rec.segments)
    sc = intent["scores"]
    res["intent_half_width_s"] = sc.pop("half_width_s")
    res.update({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in sc.items()})
    moving, driving = driving_scores(pred, intent["smoothed"], rec.speed, rec.throttle, rec.brake, rec.segments,
                                     min_speed)
    res.update(min_speed_mph=min_speed, n_moving=int(moving.sum()),
               moving_mse=float(np.mean(err[moving] ** 2)) if moving.any() else None,
               moving_mae=float(np.mean(np.abs(err[moving]))) if moving.any() else None,
               moving_zero_mse=float(np.mean(rec.steering[moving] ** 2)) if moving.any() else None, **driving)
    if train_mean is not None:
        res["train_mean_mse"] = float(np.mean((rec.steering - train_mean) ** 2))
    return res, intent["smoothed"]


def driving_scores(pred, smoothed, speed, throttle, brake, segments=None,
                   min_speed: float = 5.0) -> tuple[np.ndarray, dict]:
    """The scores against the driver's intent on the frames driven forwards.

    A stopped car's steering moves nothing, and a reversing one's is a manoeuvre that no forward view
    explains (:func:`agent.data.udacity.reversing_frames`); the simulator's autonomous mode only
    drives forwards.

    Args:
        pred, smoothed: (N,) the policy's steering and the labels smoothed over +-0.5 s
            (:func:`agent.eval.steering.intent_scores`).
        speed: (N,) mph. throttle, brake: (N,) pedals in [0, 1]. segments: (S, 2) session segments.
        min_speed: mph; slower frames are left out.

    Returns:
        (mask, scores): (N,) bool, the frames driven forwards at ``min_speed`` or faster; and
        ``n_reversing``, ``moving_smoothed_mse``, ``moving_smoothed_zero_mse`` (predict-0 on the
        smoothed labels), ``moving_smoothed_ratio`` and ``moving_smoothed_corr`` (Pearson r) on
        those frames (None where undefined: no such frame, every smoothed label 0, a constant
        prediction).
    """
    reversing = reversing_frames(speed, throttle, brake, segments)
    moving = (np.asarray(speed) >= min_speed) & ~reversing
    scores = {"n_reversing": int(reversing.sum()), "moving_smoothed_mse": None, "moving_smoothed_zero_mse": None,
              "moving_smoothed_ratio": None, "moving_smoothed_corr": None}
    if moving.any():
        p, sm = np.asarray(pred, np.float64)[moving], np.asarray(smoothed, np.float64)[moving]
        ratio, r = smoothed_ratio(p, sm)["ratio"], pearson(p, sm)
        scores.update(moving_smoothed_mse=float(np.mean((p - sm) ** 2)), moving_smoothed_zero_mse=float(np.mean(sm ** 2)),
                      moving_smoothed_ratio=None if math.isnan(ratio) else float(ratio),
                      moving_smoothed_corr=None if math.isnan(r) else float(r))
    return moving, scores


#: per-recording intent scores that :func:`summarize_recordings` averages (mean over the recordings that have one)
INTENT_MEANS = ("smoothed_corr", "right_way", "right_way_left", "right_way_right", "curve_mean_abs_pred",
                "curve_mean_abs_label", "curve_abs_ratio", "straight_error_share", "straight_mean_abs_pred",
                "curve_signed_excess", "best_lag_s", "corr_at_best_lag", "smoothed_ratio_at_best_lag")


def _mean(values) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.mean(v)) if v else None


def summarize_recordings(results: list[dict]) -> dict:
    """Means over per-recording results of :func:`evaluate_udacity` (each recording weighs the same).

    Returns ``n_recordings``, ``n_frames`` (total), ``mse``, ``mae``, ``zero_mse`` (means),
    ``ratio_of_means`` (mean MSE / mean predict-0 MSE) and ``mean_ratio`` (mean of the ratios),
    and the same two for the smoothed-oracle floor, ``oracle_ratio_of_means`` and
    ``oracle_mean_ratio`` (None unless every result has ``oracle_mse``); for the scores against
    the driver's intent, ``smoothed_ratio_of_means`` (mean ``smoothed_mse`` / mean
    ``smoothed_zero_mse``) and ``smoothed_mean_ratio`` (mean of the ratios), the means of
    :data:`INTENT_MEANS` over the recordings where each is defined (None where none is), and
    ``n_curve`` / ``n_left`` / ``n_right`` / ``n_straight`` (totals), and on the frames driven
    forwards (``moving_*`` of :func:`evaluate_udacity`) ``moving_smoothed_ratio_of_means`` (None unless
    every result has them) and ``moving_smoothed_corr`` (mean); these are None or absent for results
    without intent scores.
    """
    if not results:
        return {"n_recordings": 0}
    mse, zero = float(np.mean([r["mse"] for r in results])), float(np.mean([r["zero_mse"] for r in results]))
    ratios = [r["ratio"] for r in results if r.get("ratio") is not None]
    out = {"n_recordings": len(results), "n_frames": int(sum(r["n_frames"] for r in results)), "mse": mse,
           "mae": float(np.mean([r["mae"] for r in results])), "zero_mse": zero,
           "ratio_of_means": mse / zero if zero > 0 else None,
           "mean_ratio": float(np.mean(ratios)) if ratios else None,
           "oracle_ratio_of_means": None, "oracle_mean_ratio": None}
    if all(r.get("oracle_mse") is not None for r in results):
        oracle = float(np.mean([r["oracle_mse"] for r in results]))
        o_ratios = [r["oracle_ratio"] for r in results if r.get("oracle_ratio") is not None]
        out.update(oracle_ratio_of_means=oracle / zero if zero > 0 else None,
                   oracle_mean_ratio=float(np.mean(o_ratios)) if o_ratios else None)
    if all(r.get("smoothed_mse") is not None for r in results):
        s_mse = float(np.mean([r["smoothed_mse"] for r in results]))
        s_zero = float(np.mean([r["smoothed_zero_mse"] for r in results]))
        moving = [r for r in results if r.get("moving_smoothed_mse") is not None]
        m_zero = float(np.mean([r["moving_smoothed_zero_mse"] for r in moving])) if len(moving) == len(results) else 0.0
        out.update(moving_smoothed_ratio_of_means=(float(np.mean([r["moving_smoothed_mse"] for r in moving])) / m_zero
                                                   if m_zero > 0 else None),
                   moving_smoothed_corr=_mean(r.get("moving_smoothed_corr") for r in results))
        out.update(smoothed_ratio_of_means=s_mse / s_zero if s_zero > 0 else None,
                   smoothed_mean_ratio=_mean(r.get("smoothed_ratio") for r in results),
                   **{k: _mean(r.get(k) for r in results) for k in INTENT_MEANS},
                   **{k: int(sum(r.get(k) or 0 for r in results))
                      for k in ("n_curve", "n_left", "n_right", "n_straight")})
    return out


def summarize_by_track(results: list[dict]) -> dict:
    """:func:`summarize_recordings` per track: ``{track: summary}`` for each ``track`` entry of the
    results in sorted order (a result without one counts as track "-"), then "all" (every result)."""
    out = {}
    for name in sorted({r.get("track", "-") for r in results}) + (["all"] if results else []):
        out[name] = summarize_recordings([r for r in results if name == "all" or r.get("track", "-") == name])
    return out


__all__ = ["INTENT_MEANS", "driving_scores", "evaluate_udacity", "predict_recording", "score_recording", "score_stream",
           "stream_outputs", "summarize_by_track", "summarize_recordings"]
