"""The fast paths of the live runner: the threaded video writer, the window's framebuffer choice,
``agent bench drive --window`` without a display, and the per-step CPU time."""

from __future__ import annotations

import os

os.environ["SDL_VIDEODRIVER"] = "dummy"  # never open a window in tests
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import numpy as np
import pytest
from trace_reference import draw_reference_labels

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


# ----------------------------------------------------------------------------- drawing: partial redraw
def _policy():
    import torch

    from agent.nn.policy import DrivingPolicy, default_config

    torch.manual_seed(0)
    return DrivingPolicy(default_config("carracing", window=4)).eval()


def _trace_steps(policy, n: int, seed: int = 0):
    """n steps of the policy on random frames: (frame, action class, StepTraces) each."""
    import torch

    from agent.drive.traces import step_traces

    rng = np.random.default_rng(seed)
    out, st = [], None
    for _ in range(n):
        f = rng.integers(0, 255, (96, 96, 3), dtype=np.uint8)
        y, st = policy.step(torch.as_tensor(f)[None], st, return_intermediates=True)
        out.append((f, int(y.argmax()), step_traces(st.last["intermediates"], 0, st.core.length - 1,
                                                     policy.nac.topk)))
    return out


def _canvas(r) -> np.ndarray:
    import pygame

    return pygame.surfarray.array3d(r.canvas).copy()


@pytest.mark.parametrize("scale", [6, 3])
def test_partial_redraw_equals_a_full_redraw(scale):
    """compose() restores only the HUD, the frame's margins and a non-opaque panel from the background;
    after a busy step (PAUSED, status, other values) the next step's canvas equals that step composed on
    a fresh renderer (nothing of the earlier step is left anywhere), with the trace panel and without."""
    from agent.drive.hud import Renderer, StepView
    from agent.drive.overlays import PanelNote, TracePanel
    from agent.drive.traces import TraceHistory

    policy = _policy()
    steps = _trace_steps(policy, 12)
    names = policy.config.action_names
    busy = StepView(frame=steps[0][0], step=1, action=2, probs=np.full(5, 0.2), speed=55.5, episode_return=-3.0,
                    fps=48.0, paused=True, status="Grad-CAM: logit of 'left', 4.2 ms", latency_ms=9.9,
                    standstill_steps=3, longest_standstill=3, off_road_steps=2)

    def build(panel_kind):
        r = Renderer(scale=scale, action_names=names, policy_label="p")
        hist = TraceHistory(TracePanel.plot_width_for(r.panel_rect.width))
        if panel_kind == "traces":
            r.panels.append(TracePanel(r.panel_rect.size, hist, policy.nac.num_heads, policy.config.window, names))
        else:
            r.panels.append(PanelNote("NAC traces off: a reason", r.panel_rect.width))
        return r, hist

    for kind in ("traces", "note"):
        r1, h1 = build(kind)
        r2, h2 = build(kind)
        for f, a, tr in steps[:-1]:
            h1.push(tr, a)
            h2.push(tr, a)
        r1.compose(busy)
        f, a, tr = steps[-1]
        h1.push(tr, a)
        h2.push(tr, a)
        view = StepView(frame=f, step=12, action=a, probs=np.eye(5)[a], speed=1.0, fps=50.0)
        assert kind != "traces" or r1.panels[0].opaque
        r1.compose(view)
        r2.compose(view)
        np.testing.assert_array_equal(_canvas(r1), _canvas(r2))


def _reference_plot(panel, surf, r, keys, mean, classes, fixed):
    """The trace plot as drawn before the fast path: every age split into its runs of finite values."""
    import pygame as pg

    n = mean.shape[0]
    if fixed is not None:
        lo, hi = fixed
    else:
        both = np.concatenate([keys[np.isfinite(keys)], mean[np.isfinite(mean)]])
        lo, hi = (float(both.min()), float(both.max())) if both.size else (0.0, 1.0)
        pad = 0.08 * (hi - lo) if hi > lo else max(abs(hi), 1e-3) * 0.1
        lo, hi = lo - pad, hi + pad
    scale = (r.height - 3) / (hi - lo)
    x = r.right - n + np.arange(n)

    def ys(v):
        return r.bottom - 2 - (np.clip(v, lo, hi) - lo) * scale

    for age in range(keys.shape[1] - 1, -1, -1):
        v = keys[:, age]
        ok = np.isfinite(v)
        if ok.sum() < 2:
            continue
        pts = np.stack([x, ys(np.where(ok, v, lo))], 1)
        edges = np.flatnonzero(np.diff(ok.astype(np.int8))) + 1
        for seg_ok, seg in zip(np.split(ok, edges), np.split(pts, edges)):
            if seg_ok[0] and len(seg) > 1:
                pg.draw.lines(surf, panel._age_colors[min(age, len(panel._age_colors) - 1)], False, seg.tolist())
    ok = np.isfinite(mean)
    if ok.any():
        px = pg.surfarray.pixels3d(surf)
        for dy in (-1, 0, 1):
            px[x[ok], np.clip(ys(mean[ok]).astype(np.int64) + dy, r.top, r.bottom - 1)] = panel._class_rgb[classes[ok]]
        del px
    draw_reference_labels(panel, surf, r, mean, lo, hi)


@pytest.mark.parametrize("fixed", [None, (0.0, 1.0)])
def test_fast_trace_plot_draws_the_reference_pixels(fixed):
    """The plot's one-line-per-age path (all values finite) and its run-splitting path (gaps) give the
    pixels of the reference."""
    import pygame

    from agent.drive.overlays import TracePanel
    from agent.drive.traces import TraceHistory

    panel = TracePanel((420, 744), TraceHistory(TracePanel.plot_width_for(420)), 2, 4, ("a", "b", "c"))
    rng = np.random.default_rng(1)
    n = panel.plot_w
    keys = rng.random((n, 4)).astype(np.float32) * 1.2 - 0.1
    keys[:40, 3] = np.nan  # early steps: the oldest key not there yet
    keys[100:103, 2] = np.nan  # a gap inside a line
    keys[200, 1] = np.nan  # a single missing point
    keys[5, 0] = np.nan
    keys[7, 0] = np.nan  # an isolated finite point between gaps: not drawn
    mean = np.nanmean(np.where(np.isfinite(keys), keys, np.nan), 1)
    classes = rng.integers(0, 3, n)
    r = panel.plot_rects[1]
    fast, ref = pygame.Surface((420, 744)), pygame.Surface((420, 744))
    panel._plot(fast, r, keys, mean, classes, fixed)
    _reference_plot(panel, ref, r, keys, mean, classes, fixed)
    a, b = pygame.surfarray.array3d(fast), pygame.surfarray.array3d(ref)
    assert (a != 0).any()
    np.testing.assert_array_equal(a, b)
