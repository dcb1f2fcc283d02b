"""Tiny Udacity recordings written by the tests themselves (JPEGs via cv2.imencode + driving_log.csv)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import cv2
import numpy as np

START = datetime(2018, 7, 16, 17, 11, 43, 382000)


def stamp(t: datetime) -> str:
    return t.strftime("%Y_%m_%d_%H_%M_%S_") + f"{t.microsecond // 1000:03d}"


def frame(i: int, rgb: tuple[int, int, int] | None = None) -> np.ndarray:
    """A smooth 160x320x3 uint8 RGB frame that differs with i (cheap to encode)."""
    if rgb is not None:
        return np.broadcast_to(np.array(rgb, np.uint8), (160, 320, 3)).copy()
    rng = np.random.default_rng(i)
    small = rng.integers(0, 256, (10, 20, 3), dtype=np.uint8)
    return cv2.resize(small, (320, 160), interpolation=cv2.INTER_LINEAR)


def write_jpeg(path: Path, rgb: np.ndarray) -> None:
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    path.write_bytes(buf.tobytes())


def write_recording(root: Path, n: int = 6, gaps_ms=None, header: bool = False, windows_paths: bool = True,
                    sep: str = ",", steering=None, rgb=None) -> tuple[Path, list[float]]:
    """Write ``root/driving_log.csv`` and ``root/IMG/*.jpg`` with n rows.

    gaps_ms: n - 1 gaps between frames in milliseconds (default ~15 Hz, irregular).
    Returns (root, expected timestamps in seconds relative to the first frame).
    """
    root = Path(root)
    img = root / "IMG"
    img.mkdir(parents=True, exist_ok=True)
    gaps_ms = list(gaps_ms) if gaps_ms is not None else [68, 71, 75, 66, 70, 72, 69, 74, 67, 73, 70][: n - 1] + \
        [70] * max(0, n - 12)
    steering = steering if steering is not None else [round(0.1 * ((i % 5) - 2), 3) for i in range(n)]
    lines = ["center,left,right,steering,throttle,brake,speed"] if header else []
    t, times = START, []
    for i in range(n):
        if i:
            t = t + timedelta(milliseconds=gaps_ms[i - 1])
        times.append((t - START).total_seconds())
        paths = []
        for j, cam in enumerate(("center", "left", "right")):
            name = f"{cam}_{stamp(t)}.jpg"
            write_jpeg(img / name, frame(3 * i + j, rgb))
            paths.append(f"C:\\Users\\Amer\\Desktop\\new_track\\IMG\\{name}" if windows_paths else f"IMG/{name}")
        lines.append(sep.join(paths + [str(steering[i]), "0.5", "0", "30.1"]))
    (root / "driving_log.csv").write_text("\n".join(lines) + "\n")
    return root, times
