"""``drive --env udacity --replay DIR``: a recorded drive played through the bridge, the policy scored
against the driver at every frame.

A training-mode recording (``driving_log.csv`` beside ``IMG/``) is read by :func:`load_replay`
(the center camera's JPEG files as recorded, in capture-time order) and played by
:class:`envs.udacity.replay.ReplaySimulator`, which speaks the simulator's wire protocol to the
bridge: ``drive`` steers it as it steers the simulator, with the overlays on. The car does not
follow the policy (the frames are the recording's), so each ``steer`` the simulator receives is
scored against the driver's label of the same frame with the measures of ``agent evaluate --env
udacity`` (:mod:`agent.eval.steering`): the smoothed ratio, Pearson r, the share of curve frames
turned the right way (left and right) and the mean |steering| on curves, policy against driver.

- :class:`ReplayClock` gives the policy each frame's capture time (from the image names) as its
  time input, as in training and ``agent evaluate``, instead of the time the frame arrived, and
  adds the frame's index and the driver's steering to ``info``.
- :class:`ReplayScore` keeps the policy's steering per frame and the running scores the HUD shows
  (the labels smoothed once over the whole recording; the measures over the frames so far).
- :func:`final_scores` and :func:`summary_lines`: the closing summary, :func:`agent.eval.steering.intent_scores`
  on the steering the simulator received for the frames answered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np

from agent.data.udacity import BadRow, find_driving_log, find_segments, parse_log
from agent.eval.steering import (CURVE_THRESHOLD, INTENT_HALF_WIDTH_S, curve_magnitude, intent_scores, pearson,
                                 right_way, smooth_in_time, smoothed_ratio)
from envs.udacity.camera import CameraImageError, decode_camera_jpeg

FIX = "give a folder recorded by the simulator's training mode: driving_log.csv beside IMG/ with the camera images"


class ReplayError(ValueError):
    """A folder that cannot be replayed; the message is one line saying what is wrong and how to fix it."""


@dataclass(frozen=True)
class ReplayRecording:
    """The frames of a recording to replay, in capture-time order (N frames).

    Attributes:
        folder: the recording folder; ``csv`` its driving_log.csv.
        images: N center-camera JPEG files' bytes, as recorded (checked to decode).
        steering: (N,) float32 normalised steering labels (1.0 = 25 degrees, + = right).
        throttle, speed: (N,) float32, as recorded (speed in mph).
        timestamps: (N,) float64 capture times in seconds from the first frame.
        segments: (S, 2) [start, stop) session segments (:func:`agent.data.udacity.find_segments`).
        rows: (N,) the CSV line of each frame.
        bad_rows: the rows skipped (a missing or unreadable center image, a bad value, ...).
    """

    folder: Path
    csv: Path
    images: tuple[bytes, ...]
    steering: np.ndarray
    throttle: np.ndarray
    speed: np.ndarray
    timestamps: np.ndarray
    segments: np.ndarray
    rows: np.ndarray
    bad_rows: tuple[BadRow, ...] = field(default_factory=tuple)

    def __len__(self) -> int:
        return len(self.images)

    @property
    def duration_s(self) -> float:
        return float(self.timestamps[-1] - self.timestamps[0]) if len(self) else 0.0


def load_replay(path: str | Path) -> ReplayRecording:
    """Read a training-mode recording for ``--replay``: the rows of ``driving_log.csv``
    (:func:`agent.data.udacity.parse_log`: the rows ``agent evaluate`` reads, with their three images
    present) whose center image decodes with the bridge's decoder
    (:func:`envs.udacity.camera.decode_camera_jpeg`), sorted by capture time. Rows that cannot be
    used are skipped and listed in ``bad_rows`` (:func:`skipped_text` says which).

    Raises:
        ReplayError: no such folder, no driving_log.csv in it or up to three levels below it
            (:func:`agent.data.udacity.find_driving_log`), several recordings below it, no IMG/
            beside it, a CSV that cannot be parsed, or no usable row; one line with the fix.
    """
    folder = Path(path)
    if not folder.exists():
        raise ReplayError(f"--replay {path}: no such folder; {FIX}")
    try:
        csv_path = find_driving_log(folder)
    except FileNotFoundError:
        raise ReplayError(f"--replay {path}: no driving_log.csv in it; {FIX}") from None
    except ValueError as exc:
        raise ReplayError(f"--replay {exc}") from None
    img_dir = csv_path.parent / "IMG"
    if not img_dir.is_dir():
        raise ReplayError(f"--replay {path}: no IMG/ folder beside driving_log.csv; copy the recording's IMG/ folder "
                          f"(the camera images) next to it")
    try:
        _, good, bad = parse_log(csv_path)
    except ValueError as exc:
        raise ReplayError(f"--replay {path}: {exc}") from None
    images, keep = [], []
    for line, (image, _, _), values, stamp in good:
        try:
            data = image.read_bytes()
            decode_camera_jpeg(data)
        except OSError as exc:
            bad.append(BadRow(line, f"cannot read image IMG/{image.name}: {exc}"))
            continue
        except CameraImageError as exc:
            bad.append(BadRow(line, f"unreadable image IMG/{image.name}: it {exc}"))
            continue
        images.append(data)
        keep.append((line, values, stamp))
    bad.sort(key=lambda b: b.row)
    if not keep:
        first = f" (row {bad[0].row}: {bad[0].reason})" if bad else " (it has no rows)"
        raise ReplayError(f"--replay {path}: driving_log.csv lists no frame with a usable center image{first}; "
                          f"{FIX}")
    order = sorted(range(len(keep)), key=lambda i: keep[i][2])  # capture-time order (stable)
    values = np.array([keep[i][1] for i in order], np.float32)  # (N, 4) steering, throttle, brake, speed
    t0 = keep[order[0]][2]
    timestamps = np.array([(keep[i][2] - t0).total_seconds() for i in order], np.float64)
    return ReplayRecording(folder=folder, csv=csv_path, images=tuple(images[i] for i in order),
                           steering=values[:, 0].copy(), throttle=values[:, 1].copy(), speed=values[:, 3].copy(),
                           timestamps=timestamps, segments=find_segments(timestamps),
                           rows=np.array([keep[i][0] for i in order], np.int64), bad_rows=tuple(bad))


def skipped_text(recording: ReplayRecording, show: int = 5) -> str:
    """One line naming the rows :func:`load_replay` skipped ("" when none was)."""
    bad = recording.bad_rows
    if not bad:
        return ""
    listed = "; ".join(str(b) for b in bad[:show]) + (f"; ... and {len(bad) - show} more" if len(bad) > show else "")
    return f"{recording.csv}: skipped {len(bad)} row(s) that cannot be replayed: {listed}"


class ReplayClock(gym.Wrapper):
    """The bridge env with each frame's capture time: ``info["time_s"]`` is the recording's timestamp of
    the frame (the policy's time input, as in training), ``info["replay_frame"]`` its index and
    ``info["driver_steering"]`` its label.

    Frames come in lock-step, one per reply (:class:`envs.udacity.replay.ReplaySimulator`): the first
    from ``reset``, the next from every ``step`` that is neither manual nor truncated. A step
    that brings no new frame keeps the last frame's index and time plus the seconds since it came.
    """

    def __init__(self, env: gym.Env, recording: ReplayRecording):
        super().__init__(env)
        self.timestamps = np.asarray(recording.timestamps, np.float64)
        self.steering = np.asarray(recording.steering, np.float64)
        self.frame = -1  # the index of the last frame received
        self._arrival = 0.0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if self.frame < 0:  # a later reset (R) returns the frame still awaiting its reply
            self.frame, self._arrival = 0, float(info["time_s"])
        return obs, self._stamp(info)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not truncated and not info.get("manual", False):
            self.frame += 1
            self._arrival = float(info["time_s"])
        return obs, reward, terminated, truncated, self._stamp(info)

    def _stamp(self, info: dict) -> dict:
        k = min(max(self.frame, 0), len(self.timestamps) - 1)
        info = dict(info)
        info["time_s"] = float(self.timestamps[k]) + (float(info["time_s"]) - self._arrival)
        info["replay_frame"] = k
        info["driver_steering"] = float(self.steering[k])
        return info


def _pct(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def _num(x: float, f: str = ".2f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, f)


class ReplayScore:
    """The policy's steering per replayed frame, and the running scores the HUD shows.

    The driver's intent is smoothed once over the whole recording
    (:func:`agent.eval.steering.smooth_in_time`); the measures of :mod:`agent.eval.steering` are
    then taken over the frames answered so far.
    """

    def __init__(self, recording: ReplayRecording):
        self.recording = recording
        self.smoothed = smooth_in_time(recording.steering, recording.timestamps, segments=recording.segments)
        self.pred = np.full(len(recording), np.nan)

    def observe(self, frame: int, steering: float) -> None:
        """The policy's (normalised) steering on ``frame``."""
        self.pred[frame] = min(max(float(steering), -1.0), 1.0)  # as the env sends it

    def running(self) -> dict:
        """The measures over the frames answered so far (NaN where undefined or none is answered)."""
        m = ~np.isnan(self.pred)
        if not m.any():
            return {"n": 0}
        p, s = self.pred[m], self.smoothed[m]
        way, mag = right_way(p, s), curve_magnitude(p, s)
        return {"n": int(m.sum()), "ratio": smoothed_ratio(p, s)["ratio"], "r": pearson(p, s), **{
            k: way[k] for k in ("share", "left_share", "right_share", "n_curve")},
            "abs_pred": mag["mean_abs_pred"], "abs_label": mag["mean_abs_label"]}

    def hud_lines(self, frame: int | None) -> tuple[str, ...]:
        """The HUD's replay lines for the step on ``frame``: where the replay is and the running scores."""
        rec = self.recording
        lines = [f"replay {rec.folder.name}: frame {'-' if frame is None else frame + 1}/{len(rec)}"]
        if frame is not None:
            d = float(rec.steering[frame])
            lines[0] += f"   driver {d:+.3f}"
        sc = self.running()
        if sc["n"]:
            lines += [f"vs driver's intent ({sc['n']} frames): ratio {_num(sc['ratio'])}  r {_num(sc['r'])}",
                      f"curves {sc['n_curve']}: right way {_pct(sc['share'])} (L {_pct(sc['left_share'])} "
                      f"R {_pct(sc['right_share'])})",
                      f"|steering| on curves {_num(sc['abs_pred'], '.3f')}, driver {_num(sc['abs_label'], '.3f')}"]
        return tuple(lines)


def final_scores(answers, recording: ReplayRecording) -> dict | None:
    """:func:`agent.eval.steering.intent_scores` of the answered frames: ``answers`` (N,) is the steering
    the simulator received per frame (NaN where none came); the frames answered, their labels and capture
    times form the recording scored (segments by :func:`agent.data.udacity.find_segments`). None when no
    frame was answered."""
    a = np.asarray(answers, np.float64)
    m = ~np.isnan(a)
    if not m.any():
        return None
    t = recording.timestamps[m]
    return intent_scores(a[m], recording.steering[m], t, segments=find_segments(t))["scores"]


def summary_lines(recording: ReplayRecording, sent: int, answered: int, resent: int, fps: float,
                  scores: dict | None) -> list[str]:
    """The closing summary of a replay: frames and rate, then the scores against the driver's intent
    (the wording and figures of ``agent evaluate --env udacity``, four decimals)."""
    n = len(recording)
    out = [f"replay of {recording.folder} ({n} frames, {recording.duration_s:.1f} s recorded): {sent} sent over the "
           f"bridge, {answered} answered by the policy" + (f", {resent} sent again" if resent else "")
           + f"; {_num(fps, '.1f')} FPS"]
    if scores is None:
        out.append("  no frame was answered: nothing to score")
        return out
    s = scores
    out.append(f"  against the driver's intent (labels averaged over ±{s['half_width_s']:g} s): MSE "
               f"{s['smoothed_mse']:.4f}, smoothed ratio {_num(s['smoothed_ratio'], '.4f')} (predict-0 MSE "
               f"{s['smoothed_zero_mse']:.4f}), Pearson r {_num(s['smoothed_corr'], '.4f')}")
    out.append(f"  curve frames (|smoothed| > {s['curve_threshold']:g}: {s['n_curve']}, {s['n_left']} left, "
               f"{s['n_right']} right): turned the right way {_num(s['right_way'], '.4f')} (left "
               f"{_num(s['right_way_left'], '.4f')}, right {_num(s['right_way_right'], '.4f')}); mean |steering| "
               f"{_num(s['curve_mean_abs_pred'], '.4f')} against the driver's {_num(s['curve_mean_abs_label'], '.4f')}")
    if s.get("straight_error_share") is not None:
        out.append(f"  where the error lies: {_num(s['straight_error_share'], '.4f')} of it on straight frames (mean "
                   f"|steering| there {_num(s['straight_mean_abs_pred'], '.4f')}); in curves the steering exceeds the "
                   f"driver's by {_num(s['curve_signed_excess'], '+.4f')} on average (- = less, or the wrong way)")
    if s.get("best_lag_s") is not None and math.isfinite(s["best_lag_s"]):
        out.append(f"  timing: shifted {s['best_lag_s']:+.2f} s (+ = the policy late) the steering correlates best, "
                   f"r {_num(s['corr_at_best_lag'], '.4f')}, smoothed ratio {_num(s['smoothed_ratio_at_best_lag'], '.4f')}")
    return out


__all__ = ["CURVE_THRESHOLD", "INTENT_HALF_WIDTH_S", "ReplayClock", "ReplayError", "ReplayRecording", "ReplayScore",
           "final_scores", "load_replay", "skipped_text", "summary_lines"]
