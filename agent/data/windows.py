"""Frame windows for behaviour cloning: one ``torch.utils.data.Dataset`` over either simulator's data.

Shapes: T window (frames), H x W x C a frame as the policy's features extractor takes it
(CarRacing 96 x 96 x 3 raw; Udacity 66 x 200 x 3 YUV, already through
:func:`agent.data.udacity.preprocess`), B batch.

A *source* holds sequences ("episodes"): CarRacing episodes of a Minari recording
(:class:`DemonstrationSource`), or the session segments of Udacity recordings
(:class:`UdacitySource`, segments split where the capture times jump by more than a second).
A window never crosses a sequence's boundary. Sources split themselves for validation: by
episode (CarRacing), or by holding out the last block of each recording (Udacity: consecutive
frames are nearly identical, so a random split would leak).

:class:`WindowDataset` cuts every sequence into non-overlapping windows of T frames; each epoch
(``set_epoch``) moves the window borders by a random offset per sequence. An item is a dict of
``obs`` (T, H, W, C) uint8, ``target`` (T,) int64 actions, (T, A) float32 continuous actions
(CarRacing's continuous configuration, A = 2) or (T,) float32 steering, ``t`` (T,) float64
seconds from the window's first frame, and ``mask`` (T,) bool (short windows are right-padded and
masked); with ``previous``, also ``prev`` (H, W, C), the frame before the window (motion
channels); for a source with a ``loss_mask`` (CarRacing), ``learn`` (T,) bool, the positions the
loss counts. A CarRacing source with ``standstills`` replaces that share of the training windows
by synthetic standstills (:meth:`DemonstrationSource.standstill`). Udacity windows are augmented
in ``__getitem__`` (camera, flip, shift, shadow, brightness; one draw per window), so with
``DataLoader(num_workers=N)`` augmentation runs in the loader's worker processes; the draw depends
on (seed, epoch, item), never on the worker.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch.utils.data import Dataset

from agent.data.udacity import INPUT_SHAPE, AugmentConfig, AugmentParams, augmented_window, preprocess, reversing_frames
from agent.data.frame_cache import mapped_buffer, read_frames, release_pages
from envs.carracing import dashboard_rows, draw_speedometer, speed_bar_columns, speedometer_region


def make_windows(lengths: list[int], window: int, rng: np.random.Generator | None) -> list[tuple[int, int, int]]:
    """(sequence, start, length) of non-overlapping windows covering every sequence once.

    With an rng each sequence's first full window starts at a random offset in [0, T) (the
    frames before it form a shorter window), so window borders move between epochs; without
    one, windows start at 0. A sequence's tail shorter than T is its own shorter window.
    """
    out = []
    for e, n in enumerate(lengths):
        if n <= 0:
            continue
        off = int(rng.integers(0, window)) if rng is not None and n > window else 0
        if off:
            out.append((e, 0, off))
        out.extend((e, s, min(window, n - s)) for s in range(off, n, window))
    return out


#: bytes of memory-mapped frames a :class:`DemonstrationSource` reads (:meth:`DemonstrationSource.window`)
#: before it lets go of whatever pages of their maps are resident (:func:`agent.data.frame_cache.release_pages`):
#: a backstop for frames read through a map (the windows themselves are read past it, with positional reads)
RELEASE_BYTES = 256 << 20

#: CarRacing's discrete "gas" action (envs.carracing.ACTION_NAMES; not imported here, which would load Box2D)
CARRACING_GAS = 3


def expert_stalls(frames: np.ndarray, prev: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """(n,) bool: the frames where the car stands still and the label keeps it there.

    Standing still: the road scene (the frame above CarRacing's dashboard strip, which the camera
    moves with the car) is identical to the previous frame's. Keeping it there: a discrete label
    other than gas (braking or steering does nothing at rest: the five actions give no gas while
    steering), or a continuous throttle <= 0.

    Args:
        frames: (n, H, W, C) consecutive frames; prev: (H, W, C) the frame before the first one
            (the first frame itself at an episode's start).
        targets: (n,) discrete actions or (n, A) continuous (steering, throttle).
    """
    frames = np.asarray(frames)
    rows = frames.shape[1] - dashboard_rows(frames.shape[1])
    before = np.concatenate([np.asarray(prev)[None], frames[:-1]])
    still = (frames[:, :rows] == before[:, :rows]).reshape(len(frames), -1).all(1)
    targets = np.asarray(targets)
    stays = targets[:, -1] <= 0 if targets.ndim == 2 else targets != CARRACING_GAS
    return still & stays


def standstill_keep(height: int, width: int) -> np.ndarray:
    """(height, width) bool: the pixels a synthetic standstill (:meth:`DemonstrationSource.standstill`)
    keeps; False on the dashboard's speed bar and the speedometer region, which a car at rest shows
    black (:func:`envs.carracing.speed_bar_columns`, :func:`envs.carracing.speedometer_region`)."""
    keep = np.ones((height, width), bool)
    c0, c1 = speed_bar_columns(width)
    keep[height - dashboard_rows(height):, c0:c1] = False
    top, bottom, left, right = speedometer_region(height, width)
    keep[top:bottom, left:right] = False  # the speedometer at rest (masked for a "speed" student)
    return keep


class DemonstrationSource:
    """CarRacing episodes (:class:`agent.data.recordings.Demonstrations`) as window sequences.

    Targets are the recorded (or DAgger-relabelled) actions: (N,) int64 discrete actions, or
    (N, A) float32 continuous ones (steering, throttle); times are frame indices times
    ``frame_dt`` seconds.

    ``skip_stalls``: the expert is not a perfect teacher at a standstill. The discrete PPO expert
    sometimes stays at rest, braking or steering (neither moves a stopped car), for hundreds of
    steps, and a student that imitates it learns that a standstill is a place to stay. With this
    option :meth:`loss_mask` leaves those frames (:func:`expert_stalls`) out of the loss; they
    stay in the windows as context.

    ``standstills``: a share of the training windows (those drawn with an rng) replaced by a
    synthetic standstill (:meth:`standstill`), labelled as the teacher's start rule labels a
    standing car: go. A student taught the start rule only by DAgger sees standstills in the few
    scenes where its own rollouts stopped, and can learn those scenes rather than "standing still
    means go"; this shows it a standstill in every scene of the data.

    Raises:
        ValueError: ``standstills`` outside [0, 1].
    """

    def __init__(self, demos, frame_dt: float = 0.02, skip_stalls: bool = False, standstills: float = 0.0):
        if not 0.0 <= standstills <= 1.0:
            raise ValueError(f"standstills is a share of the windows, in [0, 1]; got {standstills}")
        self.demos, self.frame_dt, self.skip_stalls = demos, frame_dt, skip_stalls
        self.standstills = float(standstills)
        self._read = 0  # bytes of frames read since the mapped pages were last released
        # per episode: the speeds to draw into its frames as they are read (draw_speedometer on read-only frames)
        self._meter: list[np.ndarray | None] | None = None

    def _derived(self, demos, meter: list | None, standstills: float) -> "DemonstrationSource":
        """A source of ``demos`` with this one's settings, drawing the speedometer per ``meter``."""
        out = DemonstrationSource(demos, self.frame_dt, self.skip_stalls, standstills)
        out._meter = meter if meter is not None and any(m is not None for m in meter) else None
        return out

    @property
    def target_dtype(self):
        """np.float32 for continuous actions, np.int64 for discrete ones."""
        return np.float32 if self.demos.continuous else np.int64

    @property
    def lengths(self) -> list[int]:
        """Frames in each sequence (one per recorded episode)."""
        return [len(a) for a in self.demos.actions]

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """(H, W, C) of one stored frame."""
        return tuple(self.demos.frames[0].shape[1:])

    def targets(self, e: int) -> np.ndarray:
        """The (N_e,) int64 or (N_e, A) float32 action targets of sequence ``e`` (no frames are read)."""
        return self.demos.actions[e]

    def window(self, e: int, start: int, n: int, rng: np.random.Generator | None = None):
        """Frames (n, H, W, C) uint8, targets (n,) or (n, A), times (n,) float64 seconds from ``start``.

        The frames are this process's own copy: where they are memory maps of a frame file
        (:func:`agent.data.recordings.load_demonstrations` with ``frames="mmap"``, DAgger's saved
        rounds) only these n frames are read, with positional reads that leave the map's pages
        untouched (:func:`agent.data.frame_cache.read_frames`), so the process's resident set does
        not grow with the data; the speedometer is drawn into the copy where it is drawn as the
        frames are read (:meth:`draw_speedometer`). The targets are a view. Frames of a map that
        cannot be read so are copied through the map, and its pages are let go of after every
        :data:`RELEASE_BYTES` (:func:`agent.data.frame_cache.release_pages`).

        Raises:
            OSError: a frame file cannot be read (:func:`agent.data.frame_cache.read_frames`).
        """
        return self._read_window(e, start, n), self.demos.actions[e][start:start + n], \
            np.arange(n, dtype=np.float64) * self.frame_dt

    def _read_window(self, e: int, start: int, n: int) -> np.ndarray:
        """(n, H, W, C) uint8: frames start .. start + n - 1 of sequence ``e``, a writable copy, the
        speedometer drawn where it is drawn on read."""
        view = self.demos.frames[e][start:start + n]
        frames = read_frames(view)
        if not view.flags.writeable and mapped_buffer(view) is not None:
            self._read += view.nbytes
            if self._read >= RELEASE_BYTES:  # pages a read through the map touched (read_frames' fallback, others)
                release_pages(self.demos.frames)
                self._read = 0
        if self._meter is not None and self._meter[e] is not None:  # drawn on the copy (draw_speedometer)
            frames = draw_speedometer(frames, self._meter[e][start:start + n])
        return frames

    def previous_frame(self, e: int, start: int) -> np.ndarray:
        """(H, W, C) uint8: the frame before frame ``start`` of sequence ``e``, or frame 0 itself
        when ``start`` is 0 (an episode's first step has no motion, as when the policy drives); a
        writable copy (read as :meth:`window` reads)."""
        return self._read_window(e, max(start - 1, 0), 1)[0]

    def loss_mask(self, e: int, start: int, n: int, frames: np.ndarray | None = None,
                  prev: np.ndarray | None = None) -> np.ndarray:
        """(n,) bool: the frames of the window that the loss counts (all, or all but the expert's
        stalls with ``skip_stalls``).

        Args:
            frames, prev: the window's frames (n, H, W, C) and :meth:`previous_frame` where the
                caller has read them already (:meth:`window`; the stall test compares the road
                above the dashboard strip, which the speedometer does not touch), else read here.
        """
        if not self.skip_stalls:
            return np.ones(n, bool)
        frames = self._read_window(e, start, n) if frames is None else frames
        prev = self.previous_frame(e, start) if prev is None else prev
        return ~expert_stalls(frames, prev, self.demos.actions[e][start:start + n])

    @property
    def weighted(self) -> bool:
        """Whether the frames carry loss weights (:meth:`loss_weights`), e.g. DAgger's edge weights."""
        return self.demos.weights is not None

    def loss_weights(self, e: int, start: int, n: int) -> np.ndarray:
        """(n,) float32: the loss weights of the window's frames (ones for unweighted episodes)."""
        if self.demos.weights is None:
            return np.ones(n, np.float32)
        return np.asarray(self.demos.weights[e][start:start + n], dtype=np.float32)

    def standstill(self, frames: np.ndarray, targets: np.ndarray, rng: np.random.Generator):
        """With probability ``standstills``, a synthetic standstill made from this window; else None.

        One frame of the window, drawn at random, repeated n times and taken as its own previous
        frame (so the motion channels are exactly zero, as at rest), with the dashboard's speed
        bar blanked to black (CarRacing draws no bar at speed 0) and the speedometer region too
        (:func:`envs.carracing.draw_speedometer` at 0 units/s; the rest of the strip is what a
        ``speed``, ``speedometer`` or ``hidden`` student cannot read, so only those may use this, see
        :func:`agent.train.run.train`). Labels: gas (discrete), or full throttle with the recorded
        steering kept (continuous), the teacher's start rule at rest
        (:meth:`agent.experts.policy.ExpertPolicy.use_start_rule`).

        Args:
            frames: (n, H, W, C) uint8; targets: (n,) int64 or (n, A) float32 (steering, throttle).

        Returns:
            None, or (frames (n, H, W, C) uint8, targets as given, prev (H, W, C) uint8).
        """
        n = len(frames)
        k = self.standstill_pick(rng, n)
        if k is None:
            return None
        frame = np.array(frames[k], copy=True)  # (H, W, C)
        frame[~standstill_keep(*frame.shape[:2])] = 0  # speed bar and speedometer at rest
        targets = np.array(targets, copy=True)
        if targets.ndim == 2:
            targets[:, -1] = 1.0  # full throttle; the steering stays the recorded one
        else:
            targets[:] = CARRACING_GAS
        return np.repeat(frame[None], n, axis=0), targets, frame

    def standstill_pick(self, rng: np.random.Generator, n: int) -> int | None:
        """The draws of :meth:`standstill` for a window of ``n`` frames: None (no standstill, with
        probability 1 - ``standstills``), or the index in [0, n) of the frame the standstill repeats.
        Consumes ``rng`` exactly as :meth:`standstill` does (a device-side batch builder,
        :mod:`agent.train.batches`, draws the same standstills from the same generators)."""
        if self.standstills <= 0 or rng.random() >= self.standstills:
            return None
        return int(rng.integers(n))

    def split(self, val_fraction: float, seed: int) -> tuple["DemonstrationSource", "DemonstrationSource | None"]:
        """(train, validation) by episode: a random ``val_fraction`` of the episodes (at least one
        each when there are two or more; none held out with ``val_fraction`` 0).

        Raises:
            ValueError: ``val_fraction`` outside [0, 1).
        """
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        n = len(self.demos.actions)
        if val_fraction == 0 or n < 2:
            return self, None
        order = np.random.default_rng(seed).permutation(n)
        n_val = min(max(1, round(n * val_fraction)), n - 1)
        train, val = sorted(order[n_val:].tolist()), sorted(order[:n_val].tolist())
        # the held-out episodes are scored as they are: no synthetic standstills
        meter = self._meter or [None] * n
        return (self._derived(self.demos.subset(train), [meter[i] for i in train], self.standstills),
                self._derived(self.demos.subset(val), [meter[i] for i in val], 0.0))

    def draw_speedometer(self) -> "DemonstrationSource":
        """Draw every frame's recorded speed into it for a ``--dashboard speedometer`` or
        ``speed-input`` student (:func:`envs.carracing.draw_speedometer`): in place into frames in
        memory (:meth:`agent.data.recordings.Demonstrations.with_speedometer`); read-only frames
        (memory maps of a frame cache, which is never written to) are drawn on a copy of each
        window as it is read (:meth:`window`, :meth:`previous_frame`), so they stay on disk. The
        pixels are the same either way; the sources that :meth:`split` and :meth:`extend` make
        keep drawing them (the episodes :meth:`extend` adds are taken as they are: DAgger's come
        from an env that draws the speedometer itself).

        Returns:
            this source.

        Raises:
            ValueError: as :meth:`agent.data.recordings.Demonstrations.speedometer_speeds`; nothing
                is drawn then.
        """
        speeds = self.demos.speedometer_speeds()
        meter = list(self._meter or [None] * len(speeds))
        for e, (f, v) in enumerate(zip(self.demos.frames, speeds)):
            if f.flags.writeable:
                draw_speedometer(f, v)
                meter[e] = None
            else:
                meter[e] = v
        self._meter = meter if any(m is not None for m in meter) else None
        return self

    def extend(self, demos) -> "DemonstrationSource":
        """This source with more episodes (DAgger's relabelled rollouts)."""
        meter = None if self._meter is None else self._meter + [None] * len(demos.actions)
        return self._derived(self.demos.extend(demos), meter, self.standstills)

    def describe(self) -> str:
        """One line for the log: episodes, frames and the options that change the loss."""
        skip = ", the expert's stalls left out of the loss" if self.skip_stalls else ""
        still = f", {self.standstills:.0%} of the windows synthetic standstills" if self.standstills else ""
        return f"{len(self.demos.actions)} episodes, {self.demos.n_frames} frames{skip}{still}"


class UdacitySource:
    """Udacity recordings (:class:`agent.data.udacity.UdacityRecording`) as window sequences.

    A sequence is one session segment of one recording. Recordings are raw
    (:class:`agent.data.udacity.UdacityRecording`, preprocessed per window) or cached crops
    (:class:`agent.data.udacity_cache.CachedRecording`, augmented on the crop). Frames are
    66x200 YUV; with ``augment`` (training) each window gets one augmentation draw from the rng
    given to :meth:`window` (else the center camera as recorded). Targets: normalised steering (N,)
    float32 (1.0 = 25 degrees, + = right), optionally a moving average over ``smooth_labels``
    frames, centred or causal (``smooth_mode``; training only: keyboard taps are noisy labels).
    Times: capture times in seconds. ``straight_keep`` < 1: the loss counts only that share of the
    frames without steering (:meth:`loss_mask`, drawn from ``seed``). ``min_speed`` > 0 (mph): the
    loss leaves out the frames recorded slower than it: a stopped car's steering moves nothing, and
    drivers waiting at the start line swing the wheel (up to 0.77 mean |steering| over a driver's
    stopped frames in the public recordings), which teaches a policy to steer at the start view.
    The frames stay in the windows as context. ``skip_reversing``: the loss also leaves out the
    frames where the car drives backwards (:func:`agent.data.udacity.reversing_frames`: multi-point
    turns at full lock, whose steering no forward view tells).

    Raises:
        ValueError: ``straight_keep`` outside (0, 1], a negative or non-finite ``min_speed``, or a
            bad ``smooth_labels`` / ``smooth_mode``.
    """

    target_dtype = np.float32

    def __init__(self, recordings: list, augment=None, smooth_labels: int = 1, smooth_mode: str = "centred",
                 straight_keep: float = 1.0, seed: int = 0, min_speed: float = 0.0, skip_reversing: bool = False):
        if not 0.0 < straight_keep <= 1.0:
            raise ValueError(f"straight_keep must be in (0, 1], got {straight_keep}")
        if not (np.isfinite(min_speed) and min_speed >= 0.0):
            raise ValueError(f"min_speed must be a speed in mph >= 0, got {min_speed}")
        self.raw_recordings = list(recordings)  # as recorded: the held-out split is scored on raw labels
        self.augment, self.smooth_labels, self.smooth_mode = augment, smooth_labels, smooth_mode
        self.straight_keep, self.seed, self.min_speed = straight_keep, seed, float(min_speed)
        self.skip_reversing = bool(skip_reversing)
        self.recordings = [smooth_steering(r, smooth_labels, smooth_mode) for r in self.raw_recordings]
        self._dropped = {"straight": 0, "slow": 0, "reversing": 0}  # frames each rule takes out of the loss
        self._learn = [self._learn_mask(i, r) for i, r in enumerate(self.recordings)]
        self.index = [(r, int(s0), int(s1)) for r, rec in enumerate(self.recordings) for s0, s1 in rec.segments.tolist()]
        self.frame_shape = tuple(INPUT_SHAPE)

    def _learn_mask(self, i: int, rec) -> np.ndarray:
        keep = np.ones(len(rec), bool)
        if self.straight_keep < 1.0:
            keep = (np.abs(rec.steering) >= 1e-3) | (np.random.default_rng([self.seed, i]).random(len(rec))
                                                     < self.straight_keep)
            self._dropped["straight"] += int((~keep).sum())
        if self.min_speed > 0.0:
            slow = np.asarray(rec.speed) < self.min_speed
            self._dropped["slow"] += int(slow.sum())
            keep &= ~slow
        if self.skip_reversing:
            back = reversing_frames(rec.speed, rec.throttle, rec.brake, rec.segments)
            self._dropped["reversing"] += int(back.sum())
            keep &= ~back
        return keep

    @property
    def lengths(self) -> list[int]:
        """Frames in each sequence (one per continuous segment of a recording)."""
        return [s1 - s0 for _, s0, s1 in self.index]

    def targets(self, e: int) -> np.ndarray:
        """The (N_e,) float32 steering targets of sequence ``e`` (center camera; no frames are read)."""
        r, s0, s1 = self.index[e]
        return self.recordings[r].steering[s0:s1].astype(np.float32)

    def window(self, e: int, start: int, n: int, rng: np.random.Generator | None = None):
        """Frames (n, 66, 200, 3) uint8 YUV, steering (n,) float32, times (n,) float64 s from the first."""
        r, s0, _ = self.index[e]
        rec = self.recordings[r]
        idx = np.arange(s0 + start, s0 + start + n)
        if self.augment is not None and rng is not None:
            params, cfg = AugmentParams.sample(rng, self.augment), self.augment
        else:
            params, cfg = AugmentParams(), AugmentConfig()
        if callable(getattr(rec, "crop_window", None)):  # cached crops (agent.data.udacity_cache.CachedRecording)
            frames, steer = rec.crop_window(idx, params, cfg)
        else:
            frames, steer = augmented_window(rec, idx, params, cfg)
            frames = preprocess(frames)
        return frames, steer.astype(np.float32), rec.timestamps[idx] - rec.timestamps[idx[0]]

    def loss_mask(self, e: int, start: int, n: int, frames: np.ndarray | None = None,
                  prev: np.ndarray | None = None) -> np.ndarray:
        """(n,) bool: the frames the loss counts: all, or with ``straight_keep`` < 1 only that share
        of the straight-driving frames (training label |steering| < 0.001), drawn once per frame
        from ``seed`` so the same frames are left out every epoch; with ``min_speed`` > 0 none
        recorded slower than it. ``frames`` and ``prev`` (the window as read, as
        :meth:`DemonstrationSource.loss_mask` takes them) are not needed here and are ignored."""
        r, s0, _ = self.index[e]
        return self._learn[r][s0 + start:s0 + start + n]

    def split(self, val_fraction: float, seed: int = 0) -> tuple["UdacitySource", "UdacitySource | None"]:
        """(train, held-out): the last ``round(N * val_fraction)`` rows of each recording are held
        out as one block (raw labels, no augmentation); ``seed`` is unused (the split is fixed).

        Raises:
            ValueError: ``val_fraction`` outside [0, 1), or a recording too short to split.
        """
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        train, val = [], []
        for rec in self.raw_recordings:
            n = len(rec)
            n_val = int(round(n * val_fraction))
            if n_val and n - n_val < 1:
                raise ValueError(f"{rec.source}: too few rows ({n}) to hold out {val_fraction:.0%}")
            train.append(rec.slice(0, n - n_val))
            if n_val:
                val.append(rec.slice(n - n_val, n))
        return (UdacitySource(train, self.augment, self.smooth_labels, self.smooth_mode, self.straight_keep, self.seed,
                              self.min_speed, self.skip_reversing),
                UdacitySource(val) if val else None)

    def describe(self) -> str:
        """One line for the log: recordings, segments, frames and the options that change the loss."""
        text = f"{len(self.recordings)} recording(s), {len(self.index)} segments, {sum(self.lengths)} frames"
        if self.straight_keep < 1.0:
            text += f", {self._dropped['straight']} straight-driving frames left out of the loss"
        if self.min_speed > 0.0:
            text += f", {self._dropped['slow']} slower than {self.min_speed:g} mph left out of the loss"
        if self.skip_reversing:
            text += f", {self._dropped['reversing']} reversing left out of the loss"
        return text


def smooth_steering(rec, frames: int, mode: str = "centred"):
    """``rec`` with its steering replaced by a moving average over ``frames`` frames, computed
    inside each segment (the average shrinks at segment ends).

    Keyboard drivers steer in short taps (drive-2018: 72% of the labels are exactly 0), so a raw
    label is a noisy sample of the steering the image calls for.

    Args:
        frames: the averaging window (odd for "centred"; 1: ``rec`` itself).
        mode: "centred" (frames i - k .. i + k, k = frames // 2) or "causal" (frames i - frames + 1 .. i:
            only the past, as a driver's wheel position integrates past taps).

    Raises:
        ValueError: ``frames`` < 1, an even ``frames`` for "centred", or an unknown ``mode``.
    """
    if mode not in ("centred", "causal"):
        raise ValueError(f"smoothing mode must be 'centred' or 'causal', got {mode!r}")
    if frames < 1 or (frames % 2 == 0 and mode == "centred"):
        raise ValueError(f"smooth_labels must be an odd number of frames >= 1, got {frames}")
    if frames == 1:
        return rec
    out = rec.steering.astype(np.float64).copy()
    for s0, s1 in rec.segments.tolist():  # a segment may be shorter than the window
        y = rec.steering[s0:s1].astype(np.float64)
        c = np.concatenate([[0.0], np.cumsum(y)])
        i = np.arange(len(y))
        lo = np.maximum(i + 1 - frames, 0) if mode == "causal" else np.maximum(i - frames // 2, 0)
        hi = i + 1 if mode == "causal" else np.minimum(i + frames // 2 + 1, len(y))
        out[s0:s1] = (c[hi] - c[lo]) / (hi - lo)
    return dataclasses.replace(rec, steering=out.astype(np.float32))


class WindowDataset(Dataset):
    """Non-overlapping windows of ``window`` frames over a source's sequences.

    Args:
        source: a :class:`DemonstrationSource` or :class:`UdacitySource`.
        window: T.
        shuffle_borders: draw a random border offset per sequence each epoch (training);
            False: windows start at each sequence's first frame (deterministic).
        seed: seeds the border offsets and the augmentation draws (with the epoch and item).
        previous: items also hold ``prev`` (H, W, C) uint8, the frame before the window's first
            one (:meth:`DemonstrationSource.previous_frame`), for a policy with motion channels.

    Items: ``obs`` (T, H, W, C) uint8, ``target`` (T,) or (T, A), ``t`` (T,) seconds, ``mask`` (T,)
    bool (real frames), and where the source gives them ``prev``, ``learn`` (T,) bool (the frames
    the loss counts) and ``weight`` (T,) float32 (per-frame loss weights; a synthetic standstill
    weighs 1).

    Raises:
        ValueError: ``window`` < 1, a source without frames, or ``previous`` for a source that
            cannot give previous frames (Udacity).
    """

    def __init__(self, source, window: int, shuffle_borders: bool = True, seed: int = 0, previous: bool = False):
        if window < 1:
            raise ValueError(f"window must be >= 1 frame, got {window}")
        if sum(source.lengths) == 0:
            raise ValueError("no frames to train on (the recordings are empty)")
        if previous and not callable(getattr(source, "previous_frame", None)):
            raise ValueError(f"{type(source).__name__} cannot give previous frames; motion channels are CarRacing's")
        self.source, self.window, self.shuffle_borders, self.seed = source, window, shuffle_borders, seed
        self.previous = previous
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Recut the windows for ``epoch`` (as ``DistributedSampler.set_epoch``); call before iterating."""
        self.epoch = epoch
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle_borders else None
        self.items = make_windows(self.source.lengths, self.window, rng)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        e, start, n = self.items[i]
        rng = np.random.default_rng([self.seed, self.epoch, i]) if self.shuffle_borders else None
        frames, target, times = self.source.window(e, start, n, rng)
        read = frames  # the window as read (the loss mask's stall test reuses it, not a standstill drawn over it)
        T = self.window
        obs = np.zeros((T, *frames.shape[1:]), np.uint8)
        tgt = np.zeros((T, *np.shape(target)[1:]), self.source.target_dtype)  # (T,) or (T, A)
        t = np.zeros(T, np.float64)
        mask = np.zeros(T, bool)
        still = None  # a synthetic standstill in place of this window (DemonstrationSource.standstills)
        if rng is not None and callable(getattr(self.source, "standstill", None)):
            still = self.source.standstill(frames, target, rng)  # None unless drawn
            if still is not None:
                frames, target = still[0], still[1]
        obs[:n], tgt[:n], t[:n], mask[:n] = frames, target, times, True
        item = {"obs": torch.from_numpy(obs), "target": torch.from_numpy(tgt), "t": torch.from_numpy(t),
                "mask": torch.from_numpy(mask)}
        prev = None
        if self.previous:
            prev = still[2] if still is not None else self.source.previous_frame(e, start)
            item["prev"] = torch.from_numpy(np.ascontiguousarray(prev))
        if callable(getattr(self.source, "loss_mask", None)):
            learn = np.zeros(T, bool)
            learn[:n] = True if still is not None else \
                self.source.loss_mask(e, start, n, frames=read, prev=prev)
            item["learn"] = torch.from_numpy(learn)
        if getattr(self.source, "weighted", False):  # per-frame loss weights (DAgger's edge weights)
            weight = np.zeros(T, np.float32)
            weight[:n] = 1.0 if still is not None else self.source.loss_weights(e, start, n)
            item["weight"] = torch.from_numpy(weight)
        return item


__all__ = ["CARRACING_GAS", "RELEASE_BYTES", "DemonstrationSource", "expert_stalls", "UdacitySource", "WindowDataset",
           "make_windows", "smooth_steering", "standstill_keep"]
