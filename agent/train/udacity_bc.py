"""Behaviour cloning of the Udacity steering policy, and its offline evaluation.

Read top to bottom: load the recordings, hold out the last ``val_fraction`` of each recording's
rows (one contiguous block: consecutive frames are nearly identical, so a random split would
leak), cut the training rows into windows of T consecutive frames inside session segments,
augment each window (one draw per window: camera, flip, shift, shadow, brightness, see
:mod:`agent.data.udacity`), preprocess, and regress the steering of EVERY position of the
window with MSE (the NAC is causal, so position i sees frames <= i: T targets per window for
the price of T CNN forwards, and early positions train the short-context case that starts a
drive). The NAC's time input is the frames' capture times relative to the window's first frame.
Optionally (``smooth_labels``) the training steering is a centered moving average of the raw
keyboard taps (see :func:`smooth_steering`); held-out and evaluation errors always use the raw labels.
After each epoch the held-out block is scored exactly as the policy acts (streaming, one frame
at a time, see :func:`predict_recording`) and the checkpoint with the lowest held-out MSE is kept.

TensorBoard scalars: ``losses/train_mse``, ``eval/val_mse``, ``eval/val_mae``, ``charts/lr``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from agent.nn.udacity_policy import UdacityNACPolicy, UdacityPolicyConfig
from agent.data.udacity import (AugmentConfig, AugmentParams, UdacityRecording, augmented_window,
                                     load_recording, preprocess)


@dataclass
class UdacityTrainConfig:
    """Hyper-parameters of a Udacity behaviour-cloning run."""

    epochs: int = 40
    # frames per batch (windows per batch = batch_frames // T), fair across T. Small: on a CPU budget the
    # number of Adam steps mattered more (256-frame batches barely left the predict-the-mean plateau)
    batch_frames: int = 64
    lr: float = 3e-4  # Adam, cosine-decayed to lr / 20 over the run
    val_fraction: float = 0.15  # the last fraction of each recording's rows, held out
    seed: int = 0
    device: str = "cpu"
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    smooth_labels: int = 1  # centered moving average of the TRAINING steering over this many frames (1: raw)
    time_limit_s: float | None = None  # stop after the epoch that crosses this budget


@dataclass
class UdacityEpoch:
    epoch: int
    train_mse: float  # on augmented windows, all positions
    val_mse: float  # held-out block, streaming, center camera
    val_mae: float
    seconds: float


@dataclass
class UdacityTrainReport:
    """What a training run measured (also stored in the policy file's metadata)."""

    config: dict
    policy_config: dict
    data: list[str]
    n_train_frames: int
    n_val_frames: int
    train_mean_steering: float  # mean steering label of the (unaugmented) training rows
    val_zero_mse: float  # baseline: predict 0 on the held-out block
    val_mean_mse: float  # baseline: predict the training mean
    best_val_mse: float = float("inf")
    best_val_mae: float = float("nan")
    best_epoch: int = 0
    epochs: list[UdacityEpoch] = field(default_factory=list)
    seconds: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Data: split and windows
# --------------------------------------------------------------------------------------------


def split_contiguous(rec: UdacityRecording, val_fraction: float) -> tuple[UdacityRecording, UdacityRecording | None]:
    """(train, held-out): the held-out part is the last ``round(N * val_fraction)`` rows (None if 0)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n = len(rec)
    n_val = int(round(n * val_fraction))
    if n_val == 0:
        return rec, None
    if n - n_val < 1:
        raise ValueError(f"{rec.source}: too few rows ({n}) to hold out {val_fraction:.0%}")
    return rec.slice(0, n - n_val), rec.slice(n - n_val, n)


def smooth_steering(rec: UdacityRecording, frames: int) -> UdacityRecording:
    """``rec`` with its steering replaced by a centered moving average over ``frames`` frames
    (odd), computed inside each segment (the average shrinks at segment ends).

    Keyboard drivers steer in short taps (drive-2018: 72% of the labels are exactly 0), so a raw
    label is a noisy sample of the steering the image calls for; the average is a less noisy
    training target. Only training rows are smoothed; evaluation always uses the raw labels.
    """
    if frames < 1 or frames % 2 == 0:
        raise ValueError(f"smooth_labels must be an odd number of frames >= 1, got {frames}")
    if frames == 1:
        return rec
    out = rec.steering.astype(np.float64).copy()
    kernel = np.ones(frames)
    for s0, s1 in rec.segments.tolist():
        y = rec.steering[s0:s1].astype(np.float64)
        out[s0:s1] = np.convolve(y, kernel, mode="same") / np.convolve(np.ones_like(y), kernel, mode="same")
    return dataclasses.replace(rec, steering=out.astype(np.float32))


def segment_windows(segments: np.ndarray, window: int, rng: np.random.Generator | None) -> list[tuple[int, int]]:
    """(start, length) of non-overlapping windows covering every segment once.

    With an rng each segment's first full window starts at a random offset (the frames before it
    form a shorter window), so window borders move between epochs; without one, windows start at
    the segment start. A segment's tail shorter than T is its own shorter window.
    """
    out = []
    for s0, s1 in segments.tolist():
        n = s1 - s0
        off = int(rng.integers(0, min(window, n))) if rng is not None and n > window else 0
        if off:
            out.append((s0, off))
        out.extend((s, min(window, s1 - s)) for s in range(s0 + off, s1, window))
    return out


def make_batch(rec: UdacityRecording, items: list[tuple[int, int]], window: int, rng: np.random.Generator | None,
               augment: AugmentConfig | None):
    """Stack windows into obs (B, T, 66, 200, 3) uint8 YUV, t (B, T) float32 seconds from each
    window's first frame, steering (B, T) float32 and mask (B, T) bool (short windows are
    right-padded and masked). ``augment`` None (or no rng): center camera as recorded."""
    B = len(items)
    obs = np.zeros((B, window, 66, 200, 3), np.uint8)
    t = np.zeros((B, window), np.float32)
    y = np.zeros((B, window), np.float32)
    mask = np.zeros((B, window), bool)
    for b, (s, n) in enumerate(items):
        idx = np.arange(s, s + n)
        params = AugmentParams.sample(rng, augment) if (augment is not None and rng is not None) else AugmentParams()
        frames, steer = augmented_window(rec, idx, params, augment or AugmentConfig())
        obs[b, :n] = preprocess(frames)
        t[b, :n] = rec.timestamps[idx] - rec.timestamps[s]
        y[b, :n], mask[b, :n] = steer, True
    return torch.from_numpy(obs), torch.from_numpy(t), torch.from_numpy(y), torch.from_numpy(mask)


# --------------------------------------------------------------------------------------------
# Offline evaluation
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def predict_recording(policy: UdacityNACPolicy, rec: UdacityRecording, progress: bool = False,
                      batch: int = 64) -> np.ndarray:
    """Steering (N,) the policy outputs while streaming through ``rec``'s center camera in order.

    Each frame goes through ``policy.step`` with its capture time; the window (NAC cache)
    restarts at every segment start, exactly as a live drive restarts at a new session.
    Frames are preprocessed ``batch`` at a time (cheaper), then stepped one by one.
    """
    from tqdm.auto import tqdm

    was_training = policy.training
    policy.eval()
    out = np.zeros(len(rec), np.float32)
    bar = tqdm(total=len(rec), desc="evaluating", unit="frame", disable=not progress, leave=False)
    for s0, s1 in rec.segments.tolist():
        state = None
        for b0 in range(s0, s1, batch):
            b1 = min(b0 + batch, s1)
            pre = preprocess(rec.frames_center[b0:b1])  # (n, 66, 200, 3)
            for i in range(b1 - b0):
                steer, state = policy.step(pre[i:i + 1], state,
                                           t=torch.tensor([rec.timestamps[b0 + i]], dtype=torch.float64))
                out[b0 + i] = float(steer[0, 0])
            bar.update(b1 - b0)
    bar.close()
    policy.train(was_training)
    return out


def evaluate_udacity(policy: UdacityNACPolicy, data: str | Path | UdacityRecording, on_bad_row: str = "skip",
                     progress: bool = True, train_mean: float | None = None, min_speed: float = 5.0) -> dict:
    """Offline steering error on a recording (center camera, no augmentation, streaming in order).

    Args:
        policy: a Udacity steering policy.
        data: a recording folder (or its ``driving_log.csv``) or a loaded recording.
        on_bad_row: as :func:`agent.data.udacity.load_recording`.
        train_mean: the training mean steering, for the predict-the-mean baseline (default: the
            policy file's metadata ``train_mean_steering`` if present).
        min_speed: mph; ``moving_*`` figures count only frames at least this fast (a standing
            car's steering is the driver turning the wheel in place, which no image predicts).

    Returns:
        dict with ``mse``, ``mae`` (normalised steering units; 1.0 = 25 degrees), ``n_frames``,
        ``n_segments``, ``rmse_degrees``, the baselines ``zero_mse`` / ``zero_mae`` (predict 0)
        and ``train_mean_mse`` (predict the training mean, when known), ``moving_mse`` /
        ``moving_mae`` / ``moving_zero_mse`` / ``n_moving`` on frames with speed >= ``min_speed``
        (the predictions still stream through every frame), ``data`` and ``seconds``.
    """
    t0 = time.time()
    rec = data if isinstance(data, UdacityRecording) else load_recording(data, on_bad_row=on_bad_row,
                                                                         progress=progress)
    pred = predict_recording(policy, rec, progress=progress)
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
        "data": rec.source,
        "n_bad_rows_skipped": len(rec.bad_rows),
    }
    moving = rec.speed >= min_speed
    res.update(min_speed_mph=min_speed, n_moving=int(moving.sum()),  # None (JSON null) when no frame moves
               moving_mse=float(np.mean(err[moving] ** 2)) if moving.any() else None,
               moving_mae=float(np.mean(np.abs(err[moving]))) if moving.any() else None,
               moving_zero_mse=float(np.mean(rec.steering[moving] ** 2)) if moving.any() else None)
    if train_mean is None:
        train_mean = getattr(policy, "metadata", {}).get("train_mean_steering")
    if train_mean is not None:
        res["train_mean_mse"] = float(np.mean((rec.steering - train_mean) ** 2))
    res["seconds"] = time.time() - t0
    return res


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def train_udacity(recordings: list[str | Path | UdacityRecording], config: UdacityTrainConfig | None = None,
                  policy_config: UdacityPolicyConfig | None = None, tensorboard_dir: str | Path | None = None,
                  progress: bool = True, on_bad_row: str = "skip") -> tuple[UdacityNACPolicy, UdacityTrainReport]:
    """Behaviour cloning (MSE on steering) of :class:`UdacityNACPolicy` on Udacity recordings.

    Args:
        recordings: recording folders (or loaded recordings); the last ``val_fraction`` of each
            one's rows is held out.
        config, policy_config: hyper-parameters (defaults: :class:`UdacityTrainConfig`,
            :class:`UdacityPolicyConfig`).
        tensorboard_dir: where to write TensorBoard scalars (None: nowhere).
        on_bad_row: "skip" or "error", for reading the recordings.

    Returns:
        (the policy with the lowest held-out MSE, in eval mode; the report). Without held-out
        rows (``val_fraction`` 0) the last epoch's policy.

    Raises:
        ValueError: bad rows in "error" mode, or no training rows.
    """
    from tqdm.auto import tqdm

    cfg = config or UdacityTrainConfig()
    pcfg = policy_config or UdacityPolicyConfig()
    t_start = time.time()
    recs = [r if isinstance(r, UdacityRecording) else load_recording(r, on_bad_row=on_bad_row, progress=progress)
            for r in recordings]
    if not recs:
        raise ValueError("train_udacity needs at least one recording")
    splits = [split_contiguous(r, cfg.val_fraction) for r in recs]
    train_parts = [smooth_steering(tr, cfg.smooth_labels) for tr, _ in splits]
    val_parts = [va for _, va in splits if va is not None]
    train_y = np.concatenate([tr.steering for tr, _ in splits])  # raw labels
    val_y = np.concatenate([p.steering for p in val_parts]) if val_parts else np.zeros(0, np.float32)
    train_mean = float(train_y.mean())
    report = UdacityTrainReport(
        config=asdict(cfg), policy_config=asdict(pcfg), data=[r.source for r in recs],
        n_train_frames=int(len(train_y)), n_val_frames=int(len(val_y)), train_mean_steering=train_mean,
        val_zero_mse=float(np.mean(val_y ** 2)) if len(val_y) else float("nan"),
        val_mean_mse=float(np.mean((val_y - train_mean) ** 2)) if len(val_y) else float("nan"))
    report.seconds["load"] = time.time() - t_start
    print(f"Udacity behaviour cloning: {report.n_train_frames} train / {report.n_val_frames} held-out frames "
          f"(last {cfg.val_fraction:.0%} of each recording), window T={pcfg.window}; held-out baselines: "
          f"predict 0 MSE {report.val_zero_mse:.4f}, predict train mean MSE {report.val_mean_mse:.4f}")

    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    policy = UdacityNACPolicy(pcfg).to(device)
    T = pcfg.window
    bsz = max(1, cfg.batch_frames // T)  # windows per batch
    rng = np.random.default_rng(cfg.seed)
    n_batches = sum(math.ceil(len(segment_windows(p.segments, T, None)) / bsz) for p in train_parts)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, cfg.epochs * n_batches), eta_min=cfg.lr / 20)
    tb = None
    if tensorboard_dir:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(str(tensorboard_dir))
    best_state, step = None, 0
    t_train = time.time()
    for epoch in range(1, cfg.epochs + 1):
        t0 = time.time()
        policy.train()
        items = [(pi, it) for pi, p in enumerate(train_parts) for it in segment_windows(p.segments, T, rng)]
        order = rng.permutation(len(items))
        total, count = 0.0, 0
        bar = tqdm(range(0, len(items), bsz), desc=f"epoch {epoch}/{cfg.epochs}", unit="batch",
                   disable=not progress, leave=False)
        for i in bar:
            chosen = [items[j] for j in order[i:i + bsz]]
            parts = []
            for pi in sorted({pi for pi, _ in chosen}):  # a batch may mix recordings
                parts.append(make_batch(train_parts[pi], [it for p2, it in chosen if p2 == pi], T, rng, cfg.augment))
            obs, t, y, mask = (torch.cat(x) for x in zip(*parts))
            pred = policy(obs.to(device), t.to(device), mask.to(device))[..., 0]  # (B, T)
            m = mask.to(device)
            loss = ((pred - y.to(device)) ** 2)[m].mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            total += loss.item() * int(m.sum())
            count += int(m.sum())
            bar.set_postfix(mse=f"{total / max(count, 1):.4f}")
            if tb is not None:
                tb.add_scalar("losses/train_mse_batch", loss.item(), step)
        bar.close()
        train_mse = total / max(count, 1)
        if val_parts:
            pred = np.concatenate([predict_recording(policy, p) for p in val_parts])
            val_mse, val_mae = float(np.mean((pred - val_y) ** 2)), float(np.mean(np.abs(pred - val_y)))
        else:
            val_mse = val_mae = float("nan")
        m = UdacityEpoch(epoch, train_mse, val_mse, val_mae, time.time() - t0)
        report.epochs.append(m)
        improved = bool(val_parts) and val_mse < report.best_val_mse
        if improved or not val_parts:
            report.best_val_mse, report.best_val_mae, report.best_epoch = val_mse, val_mae, epoch
            best_state = copy.deepcopy(policy.state_dict())
        print(f"epoch {epoch}/{cfg.epochs}: train MSE {train_mse:.4f}  held-out MSE {val_mse:.4f}  MAE {val_mae:.4f}"
              f"{'  (best)' if improved else ''}  ({m.seconds:.0f} s)", flush=True)
        if tb is not None:
            tb.add_scalar("losses/train_mse", train_mse, epoch)
            tb.add_scalar("eval/val_mse", val_mse, epoch)
            tb.add_scalar("eval/val_mae", val_mae, epoch)
            tb.add_scalar("charts/lr", sched.get_last_lr()[0], epoch)
        if cfg.time_limit_s is not None and time.time() - t_start > cfg.time_limit_s and epoch < cfg.epochs:
            print(f"time limit of {cfg.time_limit_s:.0f} s reached after epoch {epoch}; stopping")
            break
    policy.load_state_dict(best_state)
    report.seconds["train"] = time.time() - t_train
    report.seconds["total"] = time.time() - t_start
    if tb is not None:
        tb.close()
    return policy.eval(), report


__all__ = ["UdacityEpoch", "UdacityTrainConfig", "UdacityTrainReport", "evaluate_udacity", "make_batch",
           "predict_recording", "segment_windows", "smooth_steering", "split_contiguous", "train_udacity"]
