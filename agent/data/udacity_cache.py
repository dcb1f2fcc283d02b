"""Udacity recordings as preprocessed crops cached on disk: many drivers without 30 GB of RAM.

:func:`agent.data.udacity.load_recording` keeps the three raw 160x320 RGB cameras of every row in
memory (460 KB a row): the fourteen public recordings of ``SOURCES.md`` (70,000 rows) would take
32 GB. :func:`load_cached` decodes each JPEG once, crops and resizes it exactly as the network
reads it (:func:`agent.data.udacity.preprocess`: rows 60..135, 200x66, YUV) and writes the crops of
the three cameras into one uint8 ``.npy`` per recording (119 KB a row, 8.3 GB for all fourteen),
read back as a memory map; the labels go beside it in an ``.npz`` of plain arrays (no pickle).
The map is made by :func:`agent.data.frame_cache.open_frames`, and a window's crops are read past it
with positional reads (:func:`agent.data.frame_cache.take_frames`, one read a row of the camera asked
for): reading through the map would leave up to a 2 MB page-cache folio resident per 40 KB crop, so
a training run's resident set would grow toward the 8.3 GB of crops (the frame cache's docstring).

Cache files: ``CACHE_DIR/<folder>-<key>.npy`` (crops, (N, 3, 66, 200, 3) uint8, cameras in
:data:`agent.data.udacity.CAMERAS` order) and ``.npz`` (steering, throttle, brake, speed, capture
times, CSV rows, skipped rows). ``key`` hashes the cache format, the preprocessing settings
(crop rows, input size), the CSV's bytes and the name and size of every image the CSV names, so
an edited recording or other preprocessing never reuses a stale cache. Both files are written
to temporary names and renamed into place (the ``.npz`` last: it marks a complete cache), so an
interrupted build leaves nothing that is read later.

Training augmentation on crops (:func:`augment_crops`) applies naokishibuya's augmentation
(:func:`agent.data.udacity.augment_frames`) to the crop instead of the raw frame: the flip is
exact (cropping and resizing commute with a horizontal flip), the shift is scaled to the crop
(dx * 200/320, dy * 66/75 pixels; the rows the raw shift would bring in from above and below the
crop are filled with black), and the shadow and brightness scale RGB, which in YUV scales Y and
the chroma's distance from 128 (exact up to RGB clipping). Steering labels are the same
(:func:`agent.data.udacity.augment_steering`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from agent.atomic import write_atomic
from agent.bounded import ZipMemberTooLarge, check_zip_sizes
from agent.data.frame_cache import open_frames, take_frames
from agent.data.udacity import (CAMERAS, CROP_ROWS, FRAME_SHAPE, INPUT_SHAPE, MAX_GAP_S, VALUE_RANGES, AugmentConfig,
                                AugmentParams, BadRow, _bad_rows_message, _decode, augment_steering, find_segments,
                                parse_log, preprocess)
from agent.log import progress as bar_for

#: 2: rows outside :data:`agent.data.udacity.VALUE_RANGES` are skipped (format 1 caches may hold them: not reused)
CACHE_FORMAT = 2
#: bytes, the most a labels ``.npz`` may declare in all before it is read (about 60 bytes a row: 4 M rows); a larger
#: one is not a cache this module wrote (:func:`agent.bounded.check_zip_sizes`)
MAX_LABELS_BYTES = 256 * 2**20
#: the arrays a labels ``.npz`` holds (and so its most members)
_LABEL_KEYS = ("steering", "throttle", "brake", "speed", "timestamps", "rows", "bad_lines", "bad_reasons", "source",
               "format")
#: the default cache folder (``--udacity.crop-cache`` of agent train and agent evaluate)
DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nac-drive" / "udacity-crops"
_YUV_BLACK = (0, 128, 128)  # YUV of RGB black: what the shift brings in at the borders


@dataclass(frozen=True)
class CachedRecording:
    """One training-mode recording as preprocessed crops (usually a read-only memory map).

    Attributes:
        crops: (N, 3, 66, 200, 3) uint8 YUV crops of the center, left and right cameras.
        steering: (N,) float32 normalised steering in [-1, 1] (1.0 = 25 degrees, + = right).
        throttle, brake: (N,) float32 in [0, 1]. speed: (N,) float32, mph.
        timestamps: (N,) float64 capture times in seconds from the first usable row.
        rows: (N,) int64, 1-based CSV line numbers.
        segments: (S, 2) int64 [start, stop) ranges of continuous driving (as
            :class:`agent.data.udacity.UdacityRecording`).
        source: the CSV file. bad_rows: the rows that were skipped.

    Raises:
        ValueError: arrays of other shapes, or segments that do not tile 0..N.
    """

    crops: np.ndarray
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
        if self.crops.dtype != np.uint8 or self.crops.shape != (n, len(CAMERAS), *INPUT_SHAPE):
            raise ValueError(f"crops must be ({n}, 3, 66, 200, 3) uint8, got {self.crops.shape} {self.crops.dtype}")
        for name in ("throttle", "brake", "speed", "timestamps", "rows"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name} must be ({n},), got {getattr(self, name).shape}")
        seg = self.segments
        if seg.ndim != 2 or seg.shape[1] != 2 or (n and (seg.shape[0] == 0 or seg[0, 0] != 0 or seg[-1, 1] != n or
                                                         np.any(seg[1:, 0] != seg[:-1, 1]))):
            raise ValueError(f"segments must tile frames 0..{n} without gaps, got {seg.tolist()}")

    def __len__(self) -> int:
        return len(self.steering)

    def camera(self, name: str) -> np.ndarray:
        """(N, 66, 200, 3) crops of camera ``name`` (center, left or right), a view."""
        if name not in CAMERAS:
            raise ValueError(f"camera must be one of {CAMERAS}, got {name!r}")
        return self.crops[:, CAMERAS.index(name)]

    def slice(self, start: int, stop: int) -> "CachedRecording":
        """Rows [start, stop) as a recording (views, no copy); segments are cut at the ends."""
        start, stop, _ = slice(start, stop).indices(len(self))
        seg = np.clip(self.segments, start, stop) - start
        seg = seg[seg[:, 1] > seg[:, 0]].reshape(-1, 2)
        s = np.s_[start:stop]
        return CachedRecording(self.crops[s], self.steering[s], self.throttle[s], self.brake[s], self.speed[s],
                               self.timestamps[s], self.rows[s], seg.astype(np.int64), self.source, self.bad_rows)

    def crop_window(self, index: np.ndarray, params: AugmentParams,
                    cfg: AugmentConfig = AugmentConfig()) -> tuple[np.ndarray, np.ndarray]:
        """Crops (T, 66, 200, 3) uint8 YUV and steering (T,) float32 of rows ``index``, augmented by ``params``."""
        crops = take_frames(self.camera(params.camera), index)  # past the map: see the module docstring
        return augment_crops(crops, params), augment_steering(self.steering[index], params, cfg)


def _scale_yuv(crops: np.ndarray, gain) -> np.ndarray:
    """YUV of RGB * gain: Y * gain, (U, V) = 128 + (U - 128) * gain; gain broadcasts over (T, H, W, 1)."""
    x = crops.astype(np.float32)
    x[..., :1] *= gain
    x[..., 1:] = 128.0 + (x[..., 1:] - 128.0) * gain
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def augment_crops(crops: np.ndarray, params: AugmentParams) -> np.ndarray:
    """:func:`agent.data.udacity.augment_frames` on preprocessed crops (T, 66, 200, 3) uint8 YUV.

    ``params`` are in raw-frame units (pixels of the 160x320 frame); see the module docstring for
    how each operation maps to the crop. Returns a new (T, 66, 200, 3) uint8 array.

    Raises:
        ValueError: crops not (T, 66, 200, 3).
    """
    if crops.ndim != 4 or crops.shape[1:] != INPUT_SHAPE:
        raise ValueError(f"crops must be (T, 66, 200, 3) YUV, got {crops.shape}")
    h, w = INPUT_SHAPE[:2]
    sx, sy = w / FRAME_SHAPE[1], h / (CROP_ROWS[1] - CROP_ROWS[0])  # crop pixels per raw pixel
    out = crops[:, :, ::-1] if params.flip else crops
    dx, dy = params.shift
    if dx or dy:
        m = np.float32([[1, 0, dx * sx], [0, 1, dy * sy]])
        out = np.stack([cv2.warpAffine(np.ascontiguousarray(f), m, (w, h), borderValue=_YUV_BLACK) for f in out])
    gain = None
    if params.shadow is not None:
        x1, x2, side, ratio = params.shadow
        # the raw-frame coordinates of each crop pixel's centre
        yr = CROP_ROWS[0] + (np.arange(h) + 0.5) / sy - 0.5
        xr = (np.arange(w) + 0.5) / sx - 0.5
        ym, xm = np.meshgrid(yr, xr, indexing="ij")
        above = (xm - x1) * FRAME_SHAPE[0] - (x2 - x1) * ym > 0  # as augment_frames: line (x1, 0) -> (x2, 160)
        gain = np.where(above == bool(side), np.float32(ratio), np.float32(1.0))[None, :, :, None]
    if params.brightness != 1.0:
        gain = np.float32(params.brightness) if gain is None else gain * np.float32(params.brightness)
    if gain is not None:
        out = _scale_yuv(out, gain)
    return np.ascontiguousarray(out)


def _cache_key(csv_path: Path, good: list) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": CACHE_FORMAT, "crop_rows": CROP_ROWS, "input": INPUT_SHAPE}).encode())
    h.update(csv_path.read_bytes())
    for _, images, _, _ in good:
        for p in images:
            h.update(f"{p.name}:{p.stat().st_size};".encode())
    return h.hexdigest()[:20]


def cache_paths(path: str | Path, cache_dir: str | Path = DEFAULT_CACHE_DIR) -> tuple[Path, Path]:
    """(crops .npy, labels .npz) where the cache of the recording at ``path`` lives (they may not exist yet).

    Raises:
        FileNotFoundError: no ``driving_log.csv`` at ``path``.
    """
    csv_path, good, _ = parse_log(path)
    return _paths(csv_path, good, Path(cache_dir))


def _paths(csv_path: Path, good: list, cache_dir: Path) -> tuple[Path, Path]:
    folder = csv_path.resolve().parent
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{folder.parent.name}+{folder.name}")[-80:]
    stem = cache_dir / f"{name}-{_cache_key(csv_path, good)}"
    return stem.with_suffix(".npy"), stem.with_suffix(".npz")


def build_cache(path: str | Path, cache_dir: str | Path = DEFAULT_CACHE_DIR,
                progress: bool = True) -> tuple[Path, Path]:
    """Decode, preprocess and write the crops of a recording to ``cache_dir`` (if not there yet).

    Rows are streamed: memory stays at a few rows whatever the recording's length. Every row is
    kept in the cache with the bad ones listed (pass 1's and the decoder's), so the skip/error
    choice is made when loading.

    Returns:
        (crops .npy, labels .npz) paths.

    Raises:
        FileNotFoundError: no ``driving_log.csv`` at ``path``.
        ValueError: no usable row at all.
    """
    csv_path, good, bad = parse_log(path)
    cache_dir = Path(cache_dir)
    npy, npz = _paths(csv_path, good, cache_dir)
    if npy.is_file() and npz.is_file():
        return npy, npz
    if not good:
        raise ValueError(f"{csv_path}: no usable rows" + (f" ({_bad_rows_message(csv_path, bad)})" if bad else ""))
    cache_dir.mkdir(parents=True, exist_ok=True)
    n = len(good)
    tmp = npy.with_name(f".{npy.name}.{os.getpid()}.tmp")
    crops = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(n, len(CAMERAS), *INPUT_SHAPE))
    keep = np.ones(n, bool)
    try:
        for i, (line, images, _, _) in enumerate(bar_for(good, desc=f"caching {csv_path.parent.name}", unit="row",
                                                       disable=not progress, leave=False)):
            for c, p in enumerate(images):
                img = _decode(p)
                if isinstance(img, str):
                    bad.append(BadRow(line, img))
                    keep[i] = False
                    break
                crops[i, c] = preprocess(img)
        if not keep.any():
            raise ValueError(f"{csv_path}: no usable rows ({_bad_rows_message(csv_path, bad)})")
        if not keep.all():  # compact: the kept rows only
            kept = np.flatnonzero(keep)
            tmp2 = tmp.with_name(tmp.name + "2")
            out = np.lib.format.open_memmap(tmp2, mode="w+", dtype=np.uint8, shape=(len(kept), *crops.shape[1:]))
            for j in range(0, len(kept), 512):
                out[j:j + 512] = crops[kept[j:j + 512]]
            out.flush()
            del crops, out
            os.replace(tmp2, tmp)
        else:
            crops.flush()
            del crops
        os.replace(tmp, npy)
    except BaseException:
        for t in (tmp, tmp.with_name(tmp.name + "2")):
            t.unlink(missing_ok=True)
        raise
    rows = [g for g, k in zip(good, keep) if k]
    values = np.array([g[2] for g in rows], np.float32)
    t0 = rows[0][3]
    bad.sort(key=lambda b: b.row)
    arrays = dict(steering=values[:, 0], throttle=values[:, 1], brake=values[:, 2], speed=values[:, 3],
                  timestamps=np.array([(g[3] - t0).total_seconds() for g in rows], np.float64),
                  rows=np.array([g[0] for g in rows], np.int64),
                  bad_lines=np.array([b.row for b in bad], np.int64),
                  bad_reasons=np.array([b.reason for b in bad], dtype=str).reshape(len(bad)),
                  source=np.array(str(csv_path)), format=np.array(CACHE_FORMAT))
    write_atomic(npz, lambda fh: np.savez(fh, **arrays), what="label cache")
    return npy, npz


def load_cached(path: str | Path, cache_dir: str | Path = DEFAULT_CACHE_DIR, on_bad_row: str = "skip",
                max_gap: float = MAX_GAP_S, progress: bool = True, mmap: bool = True) -> CachedRecording:
    """A recording as crops from the cache (built first if missing; see :func:`build_cache`).

    Args:
        path: the recording folder or its ``driving_log.csv``.
        cache_dir: where the cache lives.
        on_bad_row: "skip" (warn, listing the skipped rows) or "error" (raise, returning nothing),
            as :func:`agent.data.udacity.load_recording`.
        max_gap: seconds; a longer gap between consecutive frames starts a new segment.
        progress: progress bar while building. mmap: read the crops as a memory map (else into memory).

    Raises:
        FileNotFoundError: no ``driving_log.csv`` at ``path``.
        ValueError: bad rows in "error" mode, an unknown ``on_bad_row``, no usable row, or a cache
            file that does not match its labels, whose labels declare more than
            :data:`MAX_LABELS_BYTES` or hold values outside
            :data:`agent.data.udacity.VALUE_RANGES` (delete it to rebuild).
    """
    if on_bad_row not in ("skip", "error"):
        raise ValueError(f"on_bad_row must be 'skip' or 'error', got {on_bad_row!r}")
    npy, npz = build_cache(path, cache_dir, progress)
    rebuild = f"delete {npy} and {npz} to rebuild it"
    try:
        is_zip = check_zip_sizes(npz, npz, MAX_LABELS_BYTES, len(_LABEL_KEYS))
    except ZipMemberTooLarge as exc:
        raise ValueError(f"the crop cache's labels are refused: {exc}; {rebuild}") from None
    if not is_zip:
        raise ValueError(f"the crop cache's labels {npz} are not an .npz file; {rebuild}")
    with np.load(npz, allow_pickle=False) as z:
        lab = {k: z[k] for k in z.files}
    missing = set(_LABEL_KEYS) - set(lab)
    if missing:
        raise ValueError(f"the crop cache's labels {npz} lack {sorted(missing)}; {rebuild}")
    for name, (lo, hi) in VALUE_RANGES.items():  # as parse_log checks each row: a cache holds only good rows
        v = np.asarray(lab[name])
        if v.size and not (np.isfinite(v).all() and lo <= v.min() and v.max() <= hi):
            raise ValueError(f"the crop cache's labels {npz} hold {name} values outside [{lo:g}, {hi:g}] "
                             f"(agent.data.udacity.VALUE_RANGES); {rebuild}")
    bad = [BadRow(int(r), str(s)) for r, s in zip(lab["bad_lines"], lab["bad_reasons"])]
    csv_path = Path(str(lab["source"]))
    if bad and on_bad_row == "error":
        raise ValueError(_bad_rows_message(csv_path, bad))
    if bad:
        warnings.warn(_bad_rows_message(csv_path, bad, skipped=True), stacklevel=2)
    # always mapped first: the shape its header declares is checked against the labels before anything is read
    try:
        crops = open_frames(npy)
        rec = CachedRecording(crops, lab["steering"], lab["throttle"], lab["brake"], lab["speed"], lab["timestamps"],
                              lab["rows"], find_segments(lab["timestamps"], max_gap), str(csv_path), tuple(bad))
    except ValueError as exc:
        raise ValueError(f"the crop cache {npy} does not match its labels ({exc}); {rebuild}") from None
    return rec if mmap else dataclasses.replace(rec, crops=np.array(rec.crops))


__all__ = ["CACHE_FORMAT", "CachedRecording", "DEFAULT_CACHE_DIR", "MAX_LABELS_BYTES", "augment_crops", "build_cache",
           "cache_paths", "load_cached"]
