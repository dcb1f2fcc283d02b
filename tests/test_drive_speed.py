"""The fast paths of the live runner: the threaded video writer, the window's framebuffer choice,
``agent bench drive --window`` without a display, and the per-step CPU time."""

from __future__ import annotations

import os

os.environ["SDL_VIDEODRIVER"] = "dummy"  # never open a window in tests
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import numpy as np
import pytest

from agent.drive.video import VideoWriter


def _numbered_frame(i: int, size=(64, 48)) -> np.ndarray:
    """A frame whose left half has grey level 8 * i and right half 255 - 8 * i (flat blocks survive H.264)."""
    w, h = size
    f = np.empty((h, w, 3), np.uint8)
    f[:, : w // 2] = 8 * i
    f[:, w // 2:] = 255 - 8 * i
    return f


def test_threaded_writer_writes_every_frame_in_order_at_50_fps(tmp_path):
    import imageio.v2 as imageio

    out = tmp_path / "v.mp4"
    n = 30
    w = VideoWriter(out, (64, 48), fps=50, queue_frames=4)  # a short queue: append must wait, not drop
    for i in range(n):
        w.append(_numbered_frame(i))
    assert w.frames == n
    w.close()
    assert w.written == n
    reader = imageio.get_reader(str(out), format="FFMPEG")
    try:
        assert reader.get_meta_data()["fps"] == 50
        frames = [f for f in reader]
    finally:
        reader.close()
    assert len(frames) == n
    left = np.array([f[:, :32].mean() for f in frames])
    right = np.array([f[:, 32:].mean() for f in frames])
    assert np.abs(left - 8 * np.arange(n)).max() < 3  # frame i is the i-th appended
    assert np.abs(right - (255 - 8 * np.arange(n))).max() < 3


def test_writer_refuses_wrong_frames_and_appends_after_close(tmp_path):
    w = VideoWriter(tmp_path / "v.mp4", (64, 48))
    with pytest.raises(ValueError, match=r"\(48, 64, 3\) uint8"):
        w.append(np.zeros((64, 48, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        w.append(np.zeros((48, 64, 3), np.float32))
    w.append(_numbered_frame(0))
    w.close()
    w.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        w.append(_numbered_frame(1))
    with pytest.raises(ValueError, match="even frame sizes"):
        VideoWriter(tmp_path / "odd.mp4", (63, 48))


def test_writer_reports_an_encoder_failure(tmp_path):
    """A frame ffmpeg cannot take (the first one fixes the size: imageio refuses another) fails the run
    at the next append or at close, with the file named, instead of being dropped silently."""
    w = VideoWriter(tmp_path / "v.mp4", (64, 48))
    w.append(_numbered_frame(0))
    w.size = (32, 24)  # let a frame of another size through the writer's own check
    w.append(np.zeros((24, 32, 3), np.uint8))
    with pytest.raises(RuntimeError, match="v.mp4"):
        w.close()
    assert w.written == 1


def test_window_takes_the_x11_framebuffer_without_opengl(monkeypatch):
    """On X11 the window asks SDL for the XShm framebuffer (SDL_FRAMEBUFFER_ACCELERATION=0) unless the
    user chose otherwise; other drivers are left alone. Checked through SDL's driver name on a fake."""
    import pygame

    from agent.drive import window

    monkeypatch.delenv(window.FRAMEBUFFER_HINT, raising=False)
    monkeypatch.setattr(pygame.display, "get_driver", lambda: "x11")
    w = window.Window((64, 48), "t", 0)
    try:
        assert w.framebuffer_acceleration == "0" and os.environ[window.FRAMEBUFFER_HINT] == "0"
    finally:
        w.close()
    monkeypatch.setenv(window.FRAMEBUFFER_HINT, "opengl")
    w = window.Window((64, 48), "t", 0)
    try:
        assert w.framebuffer_acceleration == "opengl"  # the user's choice wins
    finally:
        w.close()
    monkeypatch.delenv(window.FRAMEBUFFER_HINT)
    monkeypatch.setattr(pygame.display, "get_driver", lambda: "wayland")
    w = window.Window((64, 48), "t", 0)
    try:
        assert w.framebuffer_acceleration is None and window.FRAMEBUFFER_HINT not in os.environ
    finally:
        w.close()


def test_bench_window_says_why_without_a_display(monkeypatch, capsys):
    from agent.bench import drive as bench
    from agent.cli import main

    with pytest.raises(bench.DisplayUnavailable, match="SDL_VIDEODRIVER=dummy"):
        bench.bench_drive("nac.pt", steps=10, window=True)
    monkeypatch.delenv("SDL_VIDEODRIVER")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)  # as on a machine without Xvfb
    with pytest.raises(bench.DisplayUnavailable, match="apt-get install -y xvfb"):
        bench.bench_drive("nac.pt", steps=10, window=True)
    assert main(["bench", "drive", "--window", "--steps", "10"]) == 2
    err = capsys.readouterr().err
    assert "--window: no X display (DISPLAY is unset) and no Xvfb" in err


def test_bench_window_starts_its_own_xvfb(monkeypatch):
    """With DISPLAY unset and Xvfb installed, the benchmark runs on a private Xvfb and stops it after."""
    import shutil

    from agent.bench.drive import x_display

    if shutil.which("Xvfb") is None:
        pytest.skip("Xvfb is not installed (apt-get install -y xvfb)")
    monkeypatch.delenv("SDL_VIDEODRIVER")
    monkeypatch.delenv("DISPLAY", raising=False)
    with x_display() as where:
        display = os.environ["DISPLAY"]
        assert display.startswith(":") and "started for the run" in where
        number = int(display[1:])
        assert os.path.exists(f"/tmp/.X11-unix/X{number}")
    assert "DISPLAY" not in os.environ
