"""The mp4 writer of ``drive --record``: composed frames to H.264 (:class:`VideoWriter`).

The encoding runs beside the drive loop: :meth:`VideoWriter.append` hands the frame to a writer
thread through a bounded queue and returns at once; the thread feeds imageio's ffmpeg writer, and
ffmpeg (libx264, its own process) encodes. The loop therefore pays only for taking the frame out of
the canvas, not for the pipe to ffmpeg, and keeps the env's 50 steps/s as long as ffmpeg keeps up on
average; if it falls behind by more than ``queue_frames`` frames, ``append`` waits (the run slows
down instead of filling the memory). Frames are written in the order appended, every one of them,
and the video's frame rate stays the env's (50 FPS): one video frame per control step.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np

from agent.drive.config import ENV_FPS

#: Frames that may wait for the encoder (996x776 RGB: 2.3 MB each).
QUEUE_FRAMES = 32
#: libx264's preset. "ultrafast" needs about 6.7 ms of ffmpeg CPU per 996x776 frame at imageio's
#: quality 7 (crf 15) on the 2-core development CPU, "veryfast" 15.5 ms: at 50 frames/s that is a third
#: of a core against three quarters, on a machine whose other core runs the drive loop. The price is
#: the file: about 17 KB per frame instead of 6.5 KB (20 s of driving: 17 MB instead of 6.5 MB).
PRESET = "ultrafast"
_STOP = object()


class VideoWriter:
    """Composed frames -> mp4 (imageio-ffmpeg, libx264, yuv420p, ``fps`` frames per second), encoded
    in a writer thread.

    Args:
        path: the .mp4 to write (its folder is created).
        size: (width, height) of every frame, both even (yuv420p).
        fps: frame rate of the video, FPS (the env's 50 by default: one frame per step).
        queue_frames: frames that may wait for the encoder before :meth:`append` blocks.

    Attributes:
        frames: frames appended so far.
        written: frames the writer thread has handed to ffmpeg so far (all of them after :meth:`close`).

    Raises:
        ValueError: an odd frame size.
    """

    def __init__(self, path: Path, size: tuple[int, int], fps: int = ENV_FPS, queue_frames: int = QUEUE_FRAMES):
        import imageio.v2 as imageio

        if size[0] % 2 or size[1] % 2:
            raise ValueError(f"H.264 (yuv420p) needs even frame sizes, got {size}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.size, self.fps = path, (int(size[0]), int(size[1])), int(fps)
        self.frames = self.written = 0
        # macro_block_size=2: the sizes are even already, so imageio must not resize (it would blur the HUD).
        self.writer = imageio.get_writer(str(path), format="FFMPEG", mode="I", fps=fps, codec="libx264",
                                         pixelformat="yuv420p", quality=7, macro_block_size=2,
                                         output_params=["-preset", PRESET])
        self._queue: queue.Queue = queue.Queue(maxsize=max(int(queue_frames), 1))
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._encode, name=f"VideoWriter({path.name})", daemon=True)
        self._thread.start()

    def _encode(self) -> None:
        """The writer thread: frames from the queue to ffmpeg, in order, until the stop mark."""
        while True:
            rgb = self._queue.get()
            if rgb is _STOP:
                return
            if self._error is not None:
                continue  # drain after a failure, so append never blocks on a dead encoder
            try:
                self.writer.append_data(rgb)
                self.written += 1
            except BaseException as exc:  # ffmpeg died (disk full, killed): reported by append/close
                self._error = exc

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"writing {self.path} failed: {self._error}") from self._error

    def append(self, rgb: np.ndarray) -> None:
        """Queue one (height, width, 3) uint8 RGB frame; the writer keeps it, so do not change it afterwards.

        Raises:
            ValueError: a frame of another shape or dtype than the video's.
            RuntimeError: the encoder failed on an earlier frame, or the writer is closed.
        """
        if self._closed:
            raise RuntimeError(f"the video writer of {self.path} is closed")
        self._raise_if_failed()
        w, h = self.size
        if rgb.shape != (h, w, 3) or rgb.dtype != np.uint8:
            raise ValueError(f"frames of this video are ({h}, {w}, 3) uint8, got {rgb.shape} {rgb.dtype}")
        self._queue.put(rgb)
        self.frames += 1

    def close(self) -> None:
        """Write the queued frames, finalise the mp4 and stop the thread (idempotent).

        Raises:
            RuntimeError: the encoder failed (the mp4 may be incomplete).
        """
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        try:
            self.writer.close()
        finally:
            self._raise_if_failed()


__all__ = ["PRESET", "QUEUE_FRAMES", "VideoWriter"]
