"""Udacity simulator recordings: reader, preprocessing and training augmentation.

The simulator's training mode writes ``driving_log.csv`` and an ``IMG/`` folder beside it
(docs/design.md section 5; docs/udacity.md lists the public recordings):

- columns ``center, left, right, steering, throttle, brake, speed``; with or without the header
  line ``center,left,right,steering,throttle,brake,speed``; fields separated by ``,`` or ``, ``;
- image paths are absolute paths of the recording machine (``C:\\Users\\...\\IMG\\center_...jpg``)
  or relative ones (``IMG/center_...jpg``): each is resolved by its BASENAME inside ``IMG/``;
- steering normalised to [-1, 1] (1.0 = 25 degrees, positive = right); throttle and brake in
  [0, 1]; speed in mph;
- 320x160 RGB JPEGs whose names carry the capture time ``yyyy_MM_dd_HH_mm_ss_fff``; frames come
  at about 15 Hz with irregular gaps, which the NAC reads as timestamps.

Shapes: N frames; H x W x C = 160 x 320 x 3 raw RGB frames; 66 x 200 x 3 network input (YUV).

Preprocessing and augmentation follow naokishibuya/car-behavioral-cloning (``utils.py``), which
the NAC paper cites for its Udacity experiment (arXiv 2512.10282, Appendix D.3.3):
crop rows 60..135, resize to 200x66, RGB -> YUV; for training a random camera (left +0.2,
right -0.2 steering), a random horizontal flip (steering negated), a random shift (steering
+0.002 per pixel of horizontal shift), a random shadow and a random brightness.
"""

from __future__ import annotations

import csv
import re
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import cv2
import numpy as np

from agent.data.frame_cache import take_frames
from agent.log import progress as bar_for
from envs.udacity.camera import CameraImageError, decode_camera_jpeg

HEADER = ("center", "left", "right", "steering", "throttle", "brake", "speed")
CAMERAS = ("center", "left", "right")
FRAME_SHAPE = (160, 320, 3)  # H, W, C of the simulator's camera images
CROP_ROWS = (60, 135)  # rows kept (top inclusive, bottom exclusive): drops the sky and the bonnet
INPUT_SHAPE = (66, 200, 3)  # H, W, C of the network input (PilotNet)
MAX_GAP_S = 1.0  # a gap longer than this between frames starts a new session segment
#: mph, the fastest speed a row may record: the simulator's cars top out at about 30 mph, so a faster one is a corrupt
#: or crafted row (speed 1e300 once became inf in float32)
MAX_SPEED_MPH = 200.0
#: the closed range each value column must lie in, else the row is skipped as bad (issue 38, item 4: a steering of
#: 1e9 once trained a policy to a loss of 4.4e16 without a warning). Steering is normalised (1.0 = 25 degrees);
#: the simulator records throttle and brake in [0, 1]; [-1, 1] is allowed (braking recorded as a negative throttle),
#: so that only absurd values are dropped.
VALUE_RANGES = {"steering": (-1.0, 1.0), "throttle": (-1.0, 1.0), "brake": (-1.0, 1.0), "speed": (0.0, MAX_SPEED_MPH)}
#: characters, the longest line of ``driving_log.csv`` read (its rows are a few hundred characters: three image
#: paths and four numbers); a longer one stops the read with an error naming the file and the line before it is
#: held in memory. It is below the csv module's own field limit (131,072), whose error would be a bare traceback.
MAX_CSV_LINE_CHARS = 64 * 1024

_STAMP = re.compile(r"(\d{4})_(\d{2})_(\d{2})_(\d{2})_(\d{2})_(\d{2})_(\d{3})")


# --------------------------------------------------------------------------------------------
# The loaded recording
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BadRow:
    """A CSV row that could not be used: its 1-based line number in the CSV and why."""

    row: int
    reason: str

    def __str__(self) -> str:
        return f"row {self.row}: {self.reason}"


@dataclass(frozen=True)
class UdacityRecording:
    """One training-mode recording, all frames decoded in memory.

    Attributes:
        frames_center, frames_left, frames_right: (N, 160, 320, 3) uint8 RGB camera frames.
        steering: (N,) float32, normalised steering in [-1, 1] (1.0 = 25 degrees, + = right).
        throttle, brake: (N,) float32 in [0, 1].
        speed: (N,) float32, mph.
        timestamps: (N,) float64 capture times in seconds (from the file names), relative to the
            first frame of the file they were read from; only differences are meaningful.
        rows: (N,) int64, 1-based CSV line number of each frame.
        segments: (S, 2) int64 half-open [start, stop) frame ranges of continuous driving; a
            new segment starts where the gap to the previous frame exceeds ``MAX_GAP_S`` or
            time goes backwards. Temporal windows never span two segments.
        source: the CSV file the frames came from.
        bad_rows: the rows that were skipped.

    Raises:
        ValueError: if the arrays do not have the shapes above or the segments do not tile 0..N.
    """

    frames_center: np.ndarray
    frames_left: np.ndarray
    frames_right: np.ndarray
    steering: np.ndarray
    throttle: np.ndarray
    brake: np.ndarray
    speed: np.ndarray
    timestamps: np.ndarray
    rows: np.ndarray
    segments: np.ndarray
    source: str = ""
    bad_rows: tuple[BadRow, ...] = field(default_factory=tuple)

    def __post_init__(self):
        n = len(self.steering)
        for name in ("frames_center", "frames_left", "frames_right"):
            a = getattr(self, name)
            if a.dtype != np.uint8 or a.shape != (n, *FRAME_SHAPE):
                raise ValueError(f"{name} must be ({n}, 160, 320, 3) uint8, got {a.shape} {a.dtype}")
        for name in ("steering", "throttle", "brake", "speed", "timestamps", "rows"):
            a = getattr(self, name)
            if a.shape != (n,):
                raise ValueError(f"{name} must be ({n},), got {a.shape}")
        seg = self.segments
        if seg.ndim != 2 or seg.shape[1] != 2:
            raise ValueError(f"segments must be (S, 2), got {seg.shape}")
        if n and (seg.shape[0] == 0 or seg[0, 0] != 0 or seg[-1, 1] != n or np.any(seg[1:, 0] != seg[:-1, 1])
                  or np.any(seg[:, 1] <= seg[:, 0])):
            raise ValueError(f"segments must tile frames 0..{n} without gaps, got {seg.tolist()}")

    def __len__(self) -> int:
        return len(self.steering)

    def camera(self, name: str) -> np.ndarray:
        """(N, 160, 320, 3) frames of camera ``name`` (center, left or right)."""
        if name not in CAMERAS:
            raise ValueError(f"camera must be one of {CAMERAS}, got {name!r}")
        return getattr(self, f"frames_{name}")

    def slice(self, start: int, stop: int) -> "UdacityRecording":
        """Frames [start, stop) as a recording (array views, no copy); segments are cut at the ends."""
        start, stop, _ = slice(start, stop).indices(len(self))
        seg = np.clip(self.segments, start, stop) - start
        seg = seg[seg[:, 1] > seg[:, 0]].reshape(-1, 2)
        s = np.s_[start:stop]
        return UdacityRecording(self.frames_center[s], self.frames_left[s], self.frames_right[s], self.steering[s],
                                self.throttle[s], self.brake[s], self.speed[s], self.timestamps[s], self.rows[s],
                                seg.astype(np.int64), self.source, self.bad_rows)


def find_segments(timestamps: np.ndarray, max_gap: float = MAX_GAP_S) -> np.ndarray:
    """(S, 2) [start, stop) ranges split where the gap exceeds ``max_gap`` s or time goes backwards."""
    n = len(timestamps)
    if n == 0:
        return np.zeros((0, 2), np.int64)
    gaps = np.diff(timestamps)
    breaks = np.flatnonzero((gaps > max_gap) | (gaps <= 0)) + 1
    bounds = np.concatenate([[0], breaks, [n]])
    return np.stack([bounds[:-1], bounds[1:]], 1).astype(np.int64)


#: mph; a local minimum of speed below this is a stop, where the car may change direction
STOP_MPH = 3.0


def reversing_frames(speed, throttle, brake, segments=None, stop_mph: float = STOP_MPH) -> np.ndarray:
    """Which frames the car was driving backwards: (N,) bool.

    The simulator records speed without a sign, and the brake key held past a stop reverses the car.
    The direction can only change at a stop (a local minimum of speed below ``stop_mph``), so each
    stretch between two stops (and the recording's ends) goes one way: backwards when the pedal that
    sped the car up was the brake (over the stretch's accelerating frames, the brake's sum exceeds
    the throttle's) and the car got past ``stop_mph``. Driving forwards, braking never speeds the car
    up. In the fourteen public drivers' recordings this finds the multi-point turns after leaving the
    road, 0-5.5 % of a driver's frames, held at full lock; a forward-looking policy cannot tell them
    from forward driving, and the simulator's autonomous mode never reverses (an observation of the
    recordings, docs/experiments/2026-11-28-udacity-reversing.md).

    Args:
        speed: (N,) mph, >= 0. throttle, brake: (N,) pedal positions in [0, 1].
        segments: (S, 2) [start, stop) session segments (a stretch never spans two); None: one.
        stop_mph: a local minimum of speed below this is a stop.

    Returns:
        (N,) bool, True where the car was reversing.

    Raises:
        ValueError: arrays of different lengths.
    """
    speed, throttle, brake = (np.asarray(a, np.float64) for a in (speed, throttle, brake))
    n = len(speed)
    if not len(throttle) == len(brake) == n:
        raise ValueError(f"speed, throttle and brake must have one value per frame, got {n}, {len(throttle)}, "
                         f"{len(brake)}")
    rev = np.zeros(n, bool)
    for a, b in (np.asarray(segments).tolist() if segments is not None else [(0, n)]):
        v = speed[a:b]
        inner = np.arange(1, len(v) - 1)
        stops = inner[(v[inner] < stop_mph) & (v[inner] <= v[inner - 1]) & (v[inner] <= v[inner + 1])]
        edges = [0, *stops.tolist(), len(v)]
        for lo, hi in zip(edges[:-1], edges[1:]):
            if hi - lo < 2:
                continue
            faster = np.diff(v[lo:hi]) > 0  # frame lo+i -> lo+i+1 sped up
            pedal = slice(a + lo, a + hi - 1)
            moved = v[lo:hi].max() >= stop_mph  # creeping below a stop's speed is not driving either way
            rev[a + lo:a + hi] = moved and brake[pedal][faster].sum() > throttle[pedal][faster].sum()
    return rev


def timestamp_of(name: str) -> datetime | None:
    """The capture time in an image name like ``center_2018_07_16_17_11_43_382.jpg`` (or None)."""
    m = _STAMP.search(name)
    if not m:
        return None
    y, mo, d, h, mi, s, ms = map(int, m.groups())
    try:
        return datetime(y, mo, d, h, mi, s, ms * 1000)
    except ValueError:
        return None


def _basename(path: str) -> str:
    return re.split(r"[\\/]", path.strip())[-1]


def _decode(path: Path) -> np.ndarray | str:
    """RGB uint8 image, or the reason it cannot be used. The live bridge decodes the simulator's
    frames with the same function (:func:`envs.udacity.camera.decode_camera_jpeg`), so the policy
    sees in the simulator exactly what it saw in training."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"cannot read image IMG/{path.name}: {exc}"
    try:
        return decode_camera_jpeg(data)
    except CameraImageError as exc:
        return f"unreadable image IMG/{path.name}: it {exc}"


#: how many folder levels below a given folder :func:`find_driving_log` looks for the recording
#: (public recordings are often zipped with one or two wrapping folders: ``Data/``, ``track/``)
SEARCH_DEPTH = 3


def find_driving_log(path: str | Path) -> Path:
    """The ``driving_log.csv`` of a recording given as the file, its folder, or a folder above it.

    A folder without a ``driving_log.csv`` of its own is searched up to :data:`SEARCH_DEPTH` levels
    down (hidden folders skipped); exactly one recording found there is taken. This is how public
    recordings unpack (``driver+repo/Data/driving_log.csv``).

    Args:
        path: a ``driving_log.csv``, the folder holding it, or a folder above that one.

    Returns:
        The path of the CSV file.

    Raises:
        FileNotFoundError: nothing at ``path``, or a folder with no recording within
            :data:`SEARCH_DEPTH` levels.
        ValueError: a folder holding several recordings below it: the message lists them, so one
            can be passed (each recording is one driver and one session).
    """
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"no Udacity recording at {path}: there is no such file or folder")
    if (path / "driving_log.csv").is_file():
        return path / "driving_log.csv"
    found, level = [], [path]
    for _ in range(SEARCH_DEPTH):
        level = sorted(d for p in level for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))
        found = [d / "driving_log.csv" for d in level if (d / "driving_log.csv").is_file()]
        if found or not level:
            break
    if not found:
        raise FileNotFoundError(f"no Udacity recording at {path} (expected a driving_log.csv inside it, or in a "
                                f"folder up to {SEARCH_DEPTH} levels below)")
    if len(found) > 1:
        shown = "; ".join(str(f.parent) for f in found[:8]) + ("; ..." if len(found) > 8 else "")
        raise ValueError(f"{path} holds {len(found)} Udacity recordings ({shown}): pass each one as its own path")
    return found[0]


def parse_log(path: str | Path, on_bad_row: str = "skip") -> tuple[Path, list, list[BadRow]]:
    """Pass 1 of reading a recording: parse ``driving_log.csv`` without decoding any image.

    Checks the cheap things: column count, finite numbers within :data:`VALUE_RANGES` (steering
    in [-1, 1], throttle and brake in [-1, 1], speed in [0, :data:`MAX_SPEED_MPH`] mph), that the
    three images exist in ``IMG/`` (resolved by basename), and the timestamp in the center image's
    name. Lines are read at most :data:`MAX_CSV_LINE_CHARS` characters at a time.

    Args:
        path: the recording folder (or a folder above it, :func:`find_driving_log`) or its
            ``driving_log.csv``.
        on_bad_row: "skip" or "error" (checked here; the caller acts on the bad rows).

    Returns:
        (csv_path, good, bad): ``good`` lists (CSV line, [center, left, right] image paths,
        [steering, throttle, brake, speed], capture datetime) per usable row, in file order;
        ``bad`` the :class:`BadRow` s found so far (decoding may find more).

    Raises:
        FileNotFoundError: no CSV at ``path`` (:func:`find_driving_log`).
        ValueError: several recordings below ``path``; an unknown ``on_bad_row``; a line longer
            than :data:`MAX_CSV_LINE_CHARS` or one the csv module cannot parse (the message names the file and the line).
    """
    if on_bad_row not in ("skip", "error"):
        raise ValueError(f"on_bad_row must be 'skip' or 'error', got {on_bad_row!r}")
    csv_path = find_driving_log(path)
    img_dir = csv_path.parent / "IMG"
    bad: list[BadRow] = []
    good: list[tuple[int, list[Path], list[float], datetime]] = []
    with open(csv_path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(_bounded_lines(fh, csv_path), skipinitialspace=True)
        first = True
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:  # e.g. a quoted field over the csv module's field limit
                raise ValueError(f"{csv_path}, line {reader.line_num}: cannot parse the CSV ({exc}); a "
                                 "driving_log.csv row is three image paths and four numbers") from None
            line = reader.line_num
            fields = [f.strip() for f in fields]
            if not any(fields):
                continue  # blank line
            if first and fields[0].lower() == "center":
                first = False
                continue  # header
            first = False
            if len(fields) != len(HEADER):
                bad.append(BadRow(line, f"expected {len(HEADER)} columns ({','.join(HEADER)}), got {len(fields)}"))
                continue
            wrong = [i for i in range(3, len(HEADER)) if not _is_number(fields[i])]
            if wrong:
                bad.append(BadRow(line, f"{HEADER[wrong[0]]} {fields[wrong[0]]!r} is not a finite number"))
                continue
            values = [float(v) for v in fields[3:]]
            out = value_out_of_range(values)
            if out:
                bad.append(BadRow(line, out))
                continue
            images = [img_dir / _basename(f) for f in fields[:3]]
            missing = [p for p in images if not p.is_file()]
            if missing:
                bad.append(BadRow(line, "missing image " + ", ".join(f"IMG/{p.name}" for p in missing)))
                continue
            stamp = timestamp_of(images[0].name)
            if stamp is None:
                bad.append(BadRow(line, f"no timestamp (yyyy_MM_dd_HH_mm_ss_fff) in image name {images[0].name}"))
                continue
            good.append((line, images, values, stamp))
    return csv_path, good, bad


def load_recording(path: str | Path, on_bad_row: str = "skip", max_gap: float = MAX_GAP_S,
                   progress: bool = True) -> UdacityRecording:
    """Read a training-mode recording: ``driving_log.csv`` (or the folder holding it) and ``IMG/``.

    Every image is decoded once into memory (uint8; drive-2018's 4053 rows x 3 cameras take
    1.9 GB).

    Args:
        path: the recording folder or its ``driving_log.csv``.
        on_bad_row: "skip" drops unusable rows with one warning that lists them; "error" raises
            instead and returns nothing. A row is bad if it has the wrong number of columns, a
            non-numeric or non-finite value, a value outside :data:`VALUE_RANGES` (steering
            beyond [-1, 1], |throttle| or |brake| above 1, speed below 0 or above
            :data:`MAX_SPEED_MPH`), an image that is missing, unreadable or not 320x160, or no
            timestamp in its center image name.
        max_gap: seconds; a longer gap between consecutive frames starts a new segment.
        progress: show a progress bar while decoding (only where stderr is a terminal).

    Raises:
        FileNotFoundError: no CSV at ``path``.
        ValueError: bad rows in "error" mode (listing each with its line number), an unknown
            ``on_bad_row``, no usable row at all, or a CSV line too long to be a row (as
            :func:`parse_log`).
    """
    csv_path, good, bad = parse_log(path, on_bad_row)

    # pass 2: decode every image once (also in "error" mode, so the error lists every bad row)
    n = len(good)
    frames = {c: np.empty((n, *FRAME_SHAPE), np.uint8) for c in CAMERAS}
    keep = np.ones(n, bool)
    for i, (line, images, _, _) in enumerate(bar_for(good, desc=f"reading {csv_path.parent.name}", unit="row",
                                                   disable=not progress, leave=False)):
        for cam, p in zip(CAMERAS, images):
            img = _decode(p)
            if isinstance(img, str):
                bad.append(BadRow(line, img))
                keep[i] = False
                break
            frames[cam][i] = img
    bad.sort(key=lambda b: b.row)
    if bad and on_bad_row == "error":
        raise ValueError(_bad_rows_message(csv_path, bad))
    if bad:
        warnings.warn(_bad_rows_message(csv_path, bad, skipped=True), stacklevel=2)
    if not keep.all():
        good = [g for g, k in zip(good, keep) if k]
        frames = {c: f[keep] for c, f in frames.items()}
    if not good:
        raise ValueError(f"{csv_path}: no usable rows")
    values = np.array([g[2] for g in good], np.float32)  # (N, 4) steering, throttle, brake, speed
    t0 = good[0][3]
    timestamps = np.array([(g[3] - t0).total_seconds() for g in good], np.float64)
    return UdacityRecording(
        frames_center=frames["center"], frames_left=frames["left"], frames_right=frames["right"],
        steering=values[:, 0].copy(), throttle=values[:, 1].copy(), brake=values[:, 2].copy(),
        speed=values[:, 3].copy(), timestamps=timestamps, rows=np.array([g[0] for g in good], np.int64),
        segments=find_segments(timestamps, max_gap), source=str(csv_path), bad_rows=tuple(bad))


def value_out_of_range(values) -> str:
    """Why a row's (steering, throttle, brake, speed) cannot be used ("" if it can): a value that is
    not finite or lies outside its :data:`VALUE_RANGES` range (checked in float32, the type the
    recordings hold, so that 1e300 counts as the inf it would become)."""
    for name, v in zip(VALUE_RANGES, values):
        lo, hi = VALUE_RANGES[name]
        with np.errstate(over="ignore"):
            v32 = np.float32(v)
        if not (np.isfinite(v32) and lo <= v32 <= hi):
            unit = " mph" if name == "speed" else ""
            return f"{name} {v:g}{unit} is outside [{lo:g}, {hi:g}]{unit}"
    return ""


def _bounded_lines(fh, csv_path: Path):
    """The lines of ``fh``, each read at most :data:`MAX_CSV_LINE_CHARS` + 1 characters at a time.

    Raises:
        ValueError: a longer line (naming the file and the 1-based line number).
    """
    number = 0
    while True:
        line = fh.readline(MAX_CSV_LINE_CHARS + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_CSV_LINE_CHARS:
            raise ValueError(f"{csv_path}, line {number}: longer than {MAX_CSV_LINE_CHARS:,} characters "
                             "(agent.data.udacity.MAX_CSV_LINE_CHARS); a driving_log.csv row is three image paths "
                             "and four numbers, a few hundred characters: not a recording of the Udacity simulator")
        yield line


def _is_number(v: str) -> bool:
    try:
        return bool(np.isfinite(float(v)))
    except ValueError:
        return False


def _bad_rows_message(csv_path: Path, bad: list[BadRow], skipped: bool = False, show: int = 10) -> str:
    listed = "; ".join(str(b) for b in bad[:show]) + (f"; ... and {len(bad) - show} more" if len(bad) > show else "")
    what = "skipped" if skipped else "found"
    hint = "" if skipped else " (pass on_bad_row='skip' / --udacity.on-bad-row skip to drop them)"
    return f"{csv_path}: {what} {len(bad)} bad row(s){hint}: {listed}"


# --------------------------------------------------------------------------------------------
# Preprocessing (naokishibuya utils.preprocess)
# --------------------------------------------------------------------------------------------


def preprocess(frames: np.ndarray) -> np.ndarray:
    """Crop rows 60..135, resize to 200x66 (bilinear), RGB -> YUV.

    Args:
        frames: (..., 160, 320, 3) uint8 RGB.

    Returns:
        (..., 66, 200, 3) uint8 YUV.

    Raises:
        ValueError: frames not (..., 160, 320, 3).
    """
    frames = np.asarray(frames)
    if frames.shape[-3:] != FRAME_SHAPE:
        raise ValueError(f"frames must be (..., 160, 320, 3) RGB, got {frames.shape}")
    lead = frames.shape[:-3]
    flat = frames.reshape(-1, *FRAME_SHAPE)
    out = np.empty((len(flat), *INPUT_SHAPE), np.uint8)
    h, w = INPUT_SHAPE[:2]
    for i, f in enumerate(flat):
        crop = np.ascontiguousarray(f[CROP_ROWS[0]:CROP_ROWS[1]])  # (75, 320, 3)
        out[i] = cv2.cvtColor(cv2.resize(crop, (w, h), interpolation=cv2.INTER_LINEAR), cv2.COLOR_RGB2YUV)
    return out.reshape(*lead, *INPUT_SHAPE)


# --------------------------------------------------------------------------------------------
# Augmentation (naokishibuya utils.augument), one draw per temporal window
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AugmentConfig:
    """Ranges of the training augmentation (naokishibuya's values).

    Attributes:
        p_augment: probability that a window is augmented (else: center camera, as recorded).
        camera_correction: steering added for the left camera, subtracted for the right one.
        shift_x, shift_y: full ranges in pixels of the random translation (uniform +-range/2).
        steering_per_pixel: steering added per pixel of horizontal shift (right shift -> +).
        shadow_ratio: range of the darkening factor inside the shadow.
        brightness: full range of the brightness factor (uniform 1 +- brightness/2).
    """

    p_augment: float = 0.6
    camera_correction: float = 0.2
    shift_x: float = 100.0
    shift_y: float = 10.0
    steering_per_pixel: float = 0.002
    shadow_ratio: tuple[float, float] = (0.2, 0.5)
    brightness: float = 0.4


@dataclass(frozen=True)
class AugmentParams:
    """One draw of the augmentation, applied alike to every frame of a window.

    Attributes:
        camera: "center", "left" or "right".
        flip: mirror left-right (steering negated).
        shift: (dx, dy) pixels of translation (applied after the flip).
        shadow: None, or (x_top, x_bottom, side, ratio): pixels on ``side`` (0 or 1) of the line
            from (x_top, 0) to (x_bottom, 160) are multiplied by ``ratio``.
        brightness: factor on all pixels.
    """

    camera: str = "center"
    flip: bool = False
    shift: tuple[float, float] = (0.0, 0.0)
    shadow: tuple[float, float, int, float] | None = None
    brightness: float = 1.0

    @classmethod
    def sample(cls, rng: np.random.Generator, cfg: AugmentConfig = AugmentConfig()) -> "AugmentParams":
        if rng.random() >= cfg.p_augment:
            return cls()
        h, w = FRAME_SHAPE[:2]
        return cls(camera=CAMERAS[int(rng.integers(3))], flip=bool(rng.random() < 0.5),
                   shift=(float(cfg.shift_x * (rng.random() - 0.5)), float(cfg.shift_y * (rng.random() - 0.5))),
                   shadow=(float(w * rng.random()), float(w * rng.random()), int(rng.integers(2)),
                           float(rng.uniform(*cfg.shadow_ratio))),
                   brightness=float(1.0 + cfg.brightness * (rng.random() - 0.5)))


def augment_steering(steering: np.ndarray, params: AugmentParams, cfg: AugmentConfig = AugmentConfig()) -> np.ndarray:
    """The steering label that goes with frames augmented by ``params`` (float32, not clipped)."""
    s = np.asarray(steering, np.float32).copy()
    s += {"center": 0.0, "left": cfg.camera_correction, "right": -cfg.camera_correction}[params.camera]
    if params.flip:
        s = -s
    return (s + params.shift[0] * cfg.steering_per_pixel).astype(np.float32)


#: the band of the network's 66x200 crop where :func:`measure_camera_offset` compares the cameras: its
#: bottom third, the road just ahead of the car (raw rows 110..135)
OFFSET_BAND = (44, 66)


def measure_camera_offset(recordings, frames_per_recording: int = 60, band: tuple[int, int] = OFFSET_BAND,
                          steering_per_pixel: float = AugmentConfig.steering_per_pixel) -> dict:
    """How far the side cameras see the road beside the center camera's view, as a steering correction.

    The side cameras' +-0.2 steering correction is a rule of thumb (naokishibuya; NVIDIA's PilotNet
    paper, Bojarski et al. 2016, Section 5.2, shifts views by the cameras' real offsets instead). This
    measures the offset in the frames: for evenly spaced rows of each recording, the horizontal shift
    between the center crop and each side crop over ``band`` (phase correlation,
    ``cv2.phaseCorrelate`` with a Hann window, on the Y channel of the network's 66x200 YUV crop),
    in raw 320-pixel units. Converted with the shift augmentation's own steering per pixel, the
    two augmentations then agree: a left-camera view is labelled like the center view shifted by the
    measured pixels.

    Args:
        recordings: :class:`UdacityRecording` or cached recordings (anything with ``camera(name)``
            and ``len``): raw (N, 160, 320, 3) RGB frames are cropped as the network reads them.
        frames_per_recording: rows sampled from each recording (evenly spaced).
        band: (top, bottom) rows of the 66-row crop compared.
        steering_per_pixel: steering per raw pixel of horizontal shift (:class:`AugmentConfig`).

    Returns:
        {"left_px", "right_px": the median shifts (left positive, right negative, raw pixels),
        "px": the mean of their sizes, "correction": px x steering_per_pixel, "frames": rows compared}.

    Raises:
        ValueError: no recording holds a frame, or a band outside the crop.
    """
    return camera_offset([camera_shifts(rec, frames_per_recording, band) for rec in recordings], steering_per_pixel)


def camera_shifts(recording, frames_per_recording: int = 60, band: tuple[int, int] = OFFSET_BAND) -> dict:
    """The per-frame part of :func:`measure_camera_offset` for one recording: {"left", "right"}, each a
    (frames,) float64 array of horizontal shifts of that side crop from the center crop, raw pixels
    (empty for an empty recording). Pool several with :func:`camera_offset`.

    Raises:
        ValueError: a band outside the crop.
    """
    if not 0 <= band[0] < band[1] <= INPUT_SHAPE[0]:
        raise ValueError(f"band must lie in rows 0..{INPUT_SHAPE[0]} of the crop, got {band}")
    window = cv2.createHanningWindow((INPUT_SHAPE[1], band[1] - band[0]), cv2.CV_32F)
    shifts = {"left": [], "right": []}
    n = len(recording)
    if n:
        rows = np.unique(np.linspace(0, n - 1, min(n, frames_per_recording)).astype(np.int64))
        cams = {}
        for name in CAMERAS:
            f = np.asarray(take_frames(recording.camera(name), rows))  # a crop cache: read past its map
            cams[name] = (preprocess(f) if f.shape[-3:] == FRAME_SHAPE else f)[:, band[0]:band[1], :, 0]
        for i in range(len(rows)):
            c = np.ascontiguousarray(cams["center"][i], np.float32)
            for side in ("left", "right"):
                (dx, _), _ = cv2.phaseCorrelate(c, np.ascontiguousarray(cams[side][i], np.float32), window)
                shifts[side].append(dx * FRAME_SHAPE[1] / INPUT_SHAPE[1])
    return {k: np.asarray(v, np.float64) for k, v in shifts.items()}


def camera_offset(shifts: list[dict], steering_per_pixel: float = AugmentConfig.steering_per_pixel) -> dict:
    """:func:`measure_camera_offset`'s result from the :func:`camera_shifts` of several recordings (pooled).

    Raises:
        ValueError: no frames in any of them.
    """
    left = np.concatenate([s["left"] for s in shifts]) if shifts else np.empty(0)
    right = np.concatenate([s["right"] for s in shifts]) if shifts else np.empty(0)
    if not len(left):
        raise ValueError("measure_camera_offset: the recordings hold no frames")
    lm, rm = float(np.median(left)), float(np.median(right))
    px = (abs(lm) + abs(rm)) / 2
    return {"left_px": lm, "right_px": rm, "px": px, "correction": px * steering_per_pixel, "frames": len(left)}


def augment_frames(frames: np.ndarray, params: AugmentParams) -> np.ndarray:
    """Flip, shift, shadow and brightness of ``params`` on frames (T, 160, 320, 3) uint8 RGB.

    The camera is chosen by the caller (it picks which frames to pass). The HLS-lightness
    shadow of naokishibuya is approximated by scaling RGB (exact where lightness <= 0.5); the
    HSV-value brightness scaling is exactly an RGB scaling. Returns a new (T, 160, 320, 3) array.
    """
    out = frames[:, :, ::-1] if params.flip else frames
    dx, dy = params.shift
    if dx or dy:
        h, w = out.shape[1:3]
        m = np.float32([[1, 0, dx], [0, 1, dy]])
        out = np.stack([cv2.warpAffine(np.ascontiguousarray(f), m, (w, h)) for f in out])
    gain = None
    if params.shadow is not None:
        h, w = out.shape[1:3]
        x1, x2, side, ratio = params.shadow
        ym, xm = np.mgrid[0:h, 0:w]
        above = (xm - x1) * h - (x2 - x1) * ym > 0  # which side of the line (x1, 0) -> (x2, h)
        gain = np.where(above == bool(side), np.float32(ratio), np.float32(1.0))[None, :, :, None]
    if params.brightness != 1.0:
        gain = np.float32(params.brightness) if gain is None else gain * np.float32(params.brightness)
    if gain is not None:
        out = np.clip(out.astype(np.float32) * gain, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(out)


def augmented_window(rec: UdacityRecording, index: np.ndarray, params: AugmentParams,
                     cfg: AugmentConfig = AugmentConfig()) -> tuple[np.ndarray, np.ndarray]:
    """Frames (T, 160, 320, 3) uint8 RGB and steering (T,) float32 of frames ``index``, augmented."""
    frames = rec.camera(params.camera)[index]
    return augment_frames(frames, params), augment_steering(rec.steering[index], params, cfg)


__all__ = ["AugmentConfig", "AugmentParams", "BadRow", "CAMERAS", "CROP_ROWS", "FRAME_SHAPE", "INPUT_SHAPE",
           "MAX_CSV_LINE_CHARS", "MAX_SPEED_MPH", "OFFSET_BAND", "SEARCH_DEPTH", "UdacityRecording", "VALUE_RANGES",
           "augment_frames", "augment_steering", "augmented_window", "camera_offset", "camera_shifts",
           "find_driving_log", "find_segments", "load_recording", "measure_camera_offset", "parse_log", "preprocess",
           "timestamp_of", "value_out_of_range"]
