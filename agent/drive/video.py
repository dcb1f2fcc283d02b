"""The mp4 writer of ``drive --record``: composed frames to H.264 (:class:`VideoWriter`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.drive.args import ENV_FPS


class VideoWriter:
    """Composed frames -> mp4 (imageio-ffmpeg, libx264, yuv420p, 50 FPS)."""

    def __init__(self, path: Path, size: tuple[int, int], fps: int = ENV_FPS):
        import imageio.v2 as imageio

        if size[0] % 2 or size[1] % 2:
            raise ValueError(f"H.264 (yuv420p) needs even frame sizes, got {size}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.frames = path, 0
        # macro_block_size=2: the sizes are even already, so imageio must not resize (it would blur the HUD).
        self.writer = imageio.get_writer(str(path), format="FFMPEG", mode="I", fps=fps, codec="libx264",
                                         pixelformat="yuv420p", quality=7, macro_block_size=2,
                                         output_params=["-preset", "veryfast"])

    def append(self, rgb: np.ndarray) -> None:
        self.writer.append_data(rgb)
        self.frames += 1

    def close(self) -> None:
        self.writer.close()


__all__ = ["VideoWriter"]
