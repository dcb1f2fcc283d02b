"""The trace panel's line plots scroll in place (issue 12): after any sequence of steps, head switches,
history clears, range changes and toggles, the panel shows pixel for pixel what a full redraw of the
same history with the same y-ranges shows."""

from __future__ import annotations

import os

os.environ["SDL_VIDEODRIVER"] = "dummy"
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import numpy as np
import pytest
from trace_reference import draw_reference_labels

from agent.drive.hud import StepView
from agent.drive.traces import StepTraces, TraceHistory

H, K, T = 2, 5, 4  # heads, kept keys (more than the window: some keys are older than T frames), window
NAMES = ("left", "right", "gas", "brake", "none")
SIZE = (420, 744)


class Steps:
    """Synthetic NAC traces: random walks with gaps (invalid keys), keys older than the window (in the
    mean but on no line), the first steps with fewer keys, and now and then a step with no key at all."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.walk = np.zeros((4, H, K))
        self.i = 0

    def next(self, scale: dict | None = None) -> tuple[StepTraces, int]:
        rng = self.rng
        self.walk += rng.normal(0, 0.04, self.walk.shape)
        self.i += 1
        ages = np.tile(np.arange(K), (H, 1))  # age K-1 >= T: kept but on no line
        valid = (ages < self.i) & (rng.random((H, K)) > 0.15)
        if rng.random() < 0.02:
            valid[:] = False  # nothing kept: the mean is NaN
        phi = 1 / (1 + np.exp(-3 * self.walk[0])) * 1.04  # a little above 1 at times: clipped
        vals = {"phi": phi, "omega": np.exp(0.5 * self.walk[1]), "logits": self.walk[2],
                "weights": np.abs(self.walk[3])}
        for name, f in (scale or {}).items():
            vals[name] = vals[name] * f
        sensory = rng.uniform(-1, 1, 12)
        sensory[0] = 1.0  # the sensory strip's scale stays 1 (its own hysteresis is not under test)
        tr = StepTraces(**{k: v.astype(np.float32) for k, v in vals.items()}, t_gate=phi.astype(np.float32),
                        indices=np.where(valid, K - 1 - ages, 0), valid=valid, ages=np.where(valid, ages, -1),
                        neurons={"sensory": sensory.astype(np.float32),
                                 "inter": rng.uniform(-1, 1, (H, 6)).astype(np.float32),
                                 "motor": rng.uniform(-1, 1, (H, 3)).astype(np.float32)})
        return tr, int(rng.integers(0, len(NAMES)))


def _panel(length: int | None = None):
    from agent.drive.overlays import TracePanel

    hist = TraceHistory(length or TracePanel.plot_width_for(SIZE[0]))
    return TracePanel(SIZE, hist, H, T, NAMES), hist


def _reference_plot(panel, surf, r, keys, mean, classes, lo, hi) -> None:
    """One plot drawn from scratch as the panel drew every plot before it scrolled them (lines of float
    points, dots through surfarray), clipped to the plot rectangle, with the range [lo, hi]."""
    import pygame as pg

    n = mean.shape[0]
    scale = (r.height - 3) / (hi - lo)
    x = r.right - n + np.arange(n)

    def ys(v):
        return r.bottom - 2 - (np.clip(v, lo, hi) - lo) * scale

    surf.set_clip(r)
    for age in range(keys.shape[1] - 1, -1, -1):
        v = keys[:, age]
        ok = np.isfinite(v)
        pts = np.stack([x, ys(np.where(ok, v, lo))], 1)
        edges = np.flatnonzero(np.diff(ok.astype(np.int8))) + 1
        for seg_ok, seg in zip(np.split(ok, edges), np.split(pts, edges)):
            if seg_ok[0] and len(seg) > 1:
                pg.draw.lines(surf, panel._age_colors[min(age, T - 1)], False, seg.tolist())
    surf.set_clip(None)
    ok = np.isfinite(mean)
    inside = ok & (x >= r.x)
    px = pg.surfarray.pixels3d(surf)
    for dy in (-1, 0, 1):
        px[x[inside], np.clip(ys(mean[inside]).astype(np.int64) + dy, r.top, r.bottom - 1)] = \
            panel._class_rgb[classes[inside]]
    del px
    draw_reference_labels(panel, surf, r, mean, lo, hi)


def _reference(panel, view) -> np.ndarray:
    """What a full redraw of the panel's history shows with the panel's head and y-ranges: a new panel's
    first drawing (background, header, heat strips), its plots and the labels beside them wiped and
    drawn again from scratch with the ranges the panel shows."""
    import pygame

    from agent.drive.overlays import TracePanel

    hist = panel.history
    fresh = TracePanel(SIZE, hist, H, T, NAMES)
    fresh.head = panel.head
    surf = pygame.Surface(SIZE)
    fresh(surf, view)
    bg = fresh._background
    classes = np.clip(hist.view("action_class"), 0, len(NAMES) - 1)
    for (name, _, _), r in zip(panel.plots, panel.plot_rects):
        beside = pygame.Rect(r.right, r.top - 10, SIZE[0] - r.right, r.height + 20)
        surf.blit(bg, beside, beside)
        surf.blit(bg, r, r)
        lo, hi = panel.ranges[name]
        _reference_plot(panel, surf, r, hist.by_age(name, panel.head, T), hist.mean(name, panel.head), classes, lo, hi)
    return pygame.surfarray.array3d(surf)


def _fresh_ranges(panel) -> dict:
    """The ranges a first drawing of the panel's history takes (the padded data range or the fixed one)."""
    import pygame

    from agent.drive.overlays import TracePanel

    fresh = TracePanel(SIZE, panel.history, H, T, NAMES)
    fresh.head = panel.head
    fresh(pygame.Surface(SIZE), StepView(frame=np.zeros((96, 96, 3), np.uint8), step=0))
    return fresh.ranges


def _draw(panel, surf, step: int) -> StepView:
    view = StepView(frame=np.zeros((96, 96, 3), np.uint8), step=step)
    panel(surf, view)
    return view


def _assert_full_redraw(panel, surf, view, what: str) -> None:
    import pygame

    got, want = pygame.surfarray.array3d(surf), _reference(panel, view)
    bad = np.argwhere((got != want).any(-1))
    assert not len(bad), f"{what}: {len(bad)} pixels differ from a full redraw, first at (x, y) {bad[:5].tolist()}"
    hist = panel.history
    for name, _, _ in panel.plots:  # the newest values drawn are exactly the history's
        np.testing.assert_array_equal(panel.last_drawn["keys"][name], hist.by_age(name, panel.head, T)[-1])
        np.testing.assert_array_equal(panel.last_drawn["mean"][name], hist.mean(name, panel.head)[-1])


@pytest.mark.parametrize("length", [None, 100, 372], ids=["plot-width", "shorter", "longer"])
def test_scrolled_plots_equal_a_full_redraw(length):
    """Step after step on one surface (as the renderer draws): the plots scroll (few full redraws), and
    at every checked step the panel equals a full redraw, before, at and after the history fills."""
    import pygame

    panel, hist = _panel(length)
    W = panel.plot_w
    src = Steps(1)
    surf = pygame.Surface(SIZE)
    total = hist.length + 45
    checks = {1, 2, 3, 4, 6, 30, W - 1, W, W + 1, hist.length - 1, hist.length, hist.length + 1,
              hist.length + 2, total} | set(range(0, total + 1, 37))
    for i in range(1, total + 1):
        hist.push(*src.next())
        view = _draw(panel, surf, i)
        if i in checks:
            _assert_full_redraw(panel, surf, view, f"step {i}")
    # the scrolling path did the work: most draws of every plot were not full redraws
    assert panel.full_redraws < 0.1 * total * len(panel.plots), panel.full_redraws


def test_head_switch_clear_range_change_toggle_and_pause_give_the_full_redraw():
    import pygame

    panel, hist = _panel()
    src = Steps(2)
    surf = pygame.Surface(SIZE)
    step = 0

    def push_draw(n=1, scale=None):
        nonlocal step
        for _ in range(n):
            hist.push(*src.next(scale))
            step += 1
            view = _draw(panel, surf, step)
        return view

    view = push_draw(200)
    _assert_full_redraw(panel, surf, view, "200 steps")

    # another head: redrawn from its own history, with the ranges a first drawing takes
    panel.next_head()
    view = _draw(panel, surf, step)
    _assert_full_redraw(panel, surf, view, "next head")
    assert panel.ranges == _fresh_ranges(panel)
    view = push_draw(5)
    _assert_full_redraw(panel, surf, view, "next head, 5 more steps")

    # a value far outside the shown range: the range grows at once and the plot is redrawn
    before, redraws = panel.ranges["omega"], panel.full_redraws
    view = push_draw(1, {"omega": 40.0})
    assert panel.ranges["omega"][1] > 10 * before[1] and panel.full_redraws > redraws
    _assert_full_redraw(panel, surf, view, "out-of-range omega")
    grown = panel.ranges["omega"]
    view = push_draw(20)  # the range sticks while the spike is shown, and the plots scroll again
    assert panel.ranges["omega"] == grown
    _assert_full_redraw(panel, surf, view, "20 steps after the spike")
    redraws = panel.full_redraws
    push_draw(10)
    assert panel.full_redraws == redraws, "steps inside a sticky range redraw nothing in full"
    # once the spike has scrolled out, the data needs much less room: the range shrinks to it
    view = push_draw(hist.length)
    assert panel.ranges["omega"][1] < 0.5 * grown[1]
    assert panel.ranges["omega"] == _fresh_ranges(panel)["omega"]
    _assert_full_redraw(panel, surf, view, "after the spike scrolled out")

    # paused: the same step drawn again is the same image, and nothing is redrawn in full
    redraws = panel.full_redraws
    _draw(panel, surf, step)
    _assert_full_redraw(panel, surf, view, "drawn twice")
    assert panel.full_redraws == redraws

    # a cleared history (a new episode), and one refilled to exactly one step more than drawn
    hist.clear()
    view = push_draw(1)
    assert panel.ranges == _fresh_ranges(panel)
    _assert_full_redraw(panel, surf, view, "cleared, 1 step")
    view = push_draw(2)
    _assert_full_redraw(panel, surf, view, "cleared, 3 steps")
    hist.clear()
    for _ in range(4):
        hist.push(*src.next())
    view = _draw(panel, surf, step)
    _assert_full_redraw(panel, surf, view, "cleared and refilled with one step more")

    # toggled off and on: with steps pushed meanwhile, and without
    push_draw(30)
    for pushed_while_off in (6, 0):
        panel.enabled = False
        _draw(panel, surf, step)
        assert not (pygame.surfarray.array3d(surf) == _reference(panel, view)).all()  # "traces off" shown
        for _ in range(pushed_while_off):
            hist.push(*src.next())
        panel.enabled = True
        view = _draw(panel, surf, step)
        _assert_full_redraw(panel, surf, view, f"toggled off and on, {pushed_while_off} steps while off")
        view = push_draw(3)
        _assert_full_redraw(panel, surf, view, "toggled, 3 more steps")


def test_a_new_surface_gets_the_whole_panel():
    """The first drawing on another surface paints the background too (nothing is left of what was
    there), and the panel keeps scrolling on the new one."""
    import pygame

    panel, hist = _panel()
    src = Steps(3)
    first = pygame.Surface(SIZE)
    for i in range(50):
        hist.push(*src.next())
        _draw(panel, first, i)
    other = pygame.Surface(SIZE)
    other.fill((255, 0, 255))
    view = _draw(panel, other, 50)
    _assert_full_redraw(panel, other, view, "a new surface")
    for i in range(5):
        hist.push(*src.next())
        view = _draw(panel, other, 51 + i)
    _assert_full_redraw(panel, other, view, "a new surface, 5 more steps")
