"""Drawing the live overlays with pygame: the Grad-CAM heat map and the NAC trace panel.

Both are drawers for :class:`agent.drive.hud.Renderer` (``drawer(surface, view)``). Nothing here
calls matplotlib per frame: lines are ``pygame.draw.lines`` over the stored history, the
action-coloured means are written straight into the pixels (``surfarray``), heat strips are
small arrays through a colour lookup table, scaled once into place; static parts (frames,
labels) are drawn once on a cached background.
"""

from __future__ import annotations

import numpy as np

from agent.drive.saliency import blend_heatmap
from agent.drive.traces import CLASS_COLORS, TraceHistory

_BG = (12, 13, 16)
_PLOT_BG = (20, 22, 27)
_GRID = (44, 47, 56)
_TEXT = (225, 228, 235)
_DIM = (120, 125, 140)


def _diverging_lut() -> np.ndarray:
    """(256, 3) uint8 blue-black-red map for signed activity in [-1, 1] (index 128 = 0)."""
    x = np.linspace(-1.0, 1.0, 256)
    r = np.clip(np.where(x > 0, 40 + 215 * x, 40 - 20 * x), 0, 255)
    g = np.clip(40 + 120 * np.abs(x) ** 2, 0, 255)
    b = np.clip(np.where(x < 0, 40 - 215 * x, 40 - 20 * x), 0, 255)
    return np.stack([r, g, b], 1).astype(np.uint8)


class SaliencyDrawer:
    """Blends the step's saliency map (``view.extras["saliency"]``, a SaliencyMap) into the frame.

    A frame filter of :class:`agent.drive.hud.Renderer`: the blend happens at the observation's own
    resolution, which is also the CAM's (Grad-CAM upsamples to the network input), and the
    renderer then scales the result up, so the cost does not grow with the window size.

    Args:
        opacity: peak opacity of the heat map, 0..1 (alpha of a pixel = opacity * cam there).
    """

    def __init__(self, opacity: float = 0.5):
        self.opacity = float(np.clip(opacity, 0.0, 1.0))
        self.enabled = True

    def adjust(self, delta: float) -> None:
        """Change the opacity by ``delta`` (clamped to 0..1)."""
        self.opacity = float(np.clip(self.opacity + delta, 0.0, 1.0))

    def __call__(self, frame: np.ndarray, view) -> np.ndarray:
        sal = view.extras.get("saliency")
        if not self.enabled or sal is None or self.opacity <= 0:
            return frame
        return blend_heatmap(frame, sal.cam, self.opacity)


class PanelNote:
    """A panel drawer that says, in the panel itself, why the panel is empty (e.g. a core without NAC
    neurons to trace). The text is rendered once, word-wrapped to the panel width."""

    def __init__(self, text: str, width: int):
        import pygame

        pygame.font.init()
        font = pygame.font.Font(None, 22)
        lines, line = [], ""
        for word in text.split():
            trial = f"{line} {word}".strip()
            if font.size(trial)[0] > width - 24 and line:
                lines.append(line)
                line = word
            else:
                line = trial
        lines.append(line)
        self.text = text
        self.surfaces = [font.render(s, True, _TEXT) for s in lines]

    def __call__(self, surf, view) -> None:
        for i, s in enumerate(self.surfaces):
            surf.blit(s, (12, 16 + 22 * i))


class TracePanel:
    """The NAC trace panel: four scrolling line plots and four neuron heat strips for one head.

    Plots (newest step at the right, one pixel column per step of ``history``): phi, omega, the
    logit and the attention weight. Thin lines are the kept keys by age (bright = the newest
    frame, darker = older frames); the thick dotted line is the mean over the kept keys, each
    dot coloured by the action taken at that step (legend at the bottom). Heat strips: the
    sensory (q, k, v), inter, command and motor neurons of the shown head over the same steps
    (blue negative, red positive; the sensory strip is scaled by its largest magnitude).

    Args:
        size: (width, height) of the panel surface.
        history: the :class:`agent.drive.traces.TraceHistory` the runner pushes to; its length should be
            :meth:`plot_width` for one pixel per step.
        num_heads: H, for cycling heads.
        window: T, the frames the NAC sees (ages 0..T-1 get a line each).
        class_names: names of the action classes (colours from ``CLASS_COLORS``).

    Attributes:
        head: the head shown (0-based); :meth:`next_head` cycles it.
        last_drawn: what the last call drew for the newest step: ``{"step", "head",
            "mean": {quantity: float}, "keys": {quantity: (T,) by age}, "neurons": {group: (N,)}}``.
        enabled: False draws only the note "traces off".
        note: a line shown instead of plots (e.g. why there are no traces).
    """

    PLOTS = (("phi", "phi  content gate", (0.0, 1.0)), ("omega", "omega  time-constant gate", None),
             ("logits", "logit  a = ODE solution", None), ("weights", "attention weight", (0.0, 1.0)))
    GROUPS = ("sensory", "inter", "command", "motor")
    #: Every call paints the whole panel (its background first), so the renderer need not clear it.
    opaque = True
    MARGIN, VALUE_W, PLOT_H, LABEL_H, STRIP_H = 10, 58, 84, 18, 30

    def __init__(self, size: tuple[int, int], history: TraceHistory, num_heads: int, window: int,
                 class_names: tuple[str, ...]):
        import pygame

        pygame.font.init()
        self.pg = pygame
        self.size = (int(size[0]), int(size[1]))
        self.history = history
        self.num_heads = max(1, int(num_heads))
        self.window = max(1, int(window))
        self.class_names = tuple(class_names)
        self.head = 0
        self.enabled = True
        self.note = ""
        self.last_drawn: dict = {}
        self.font = pygame.font.Font(None, 19)
        self.font_small = pygame.font.Font(None, 16)
        self._lut = _diverging_lut()
        self._class_rgb = np.array([CLASS_COLORS[i % len(CLASS_COLORS)] for i in range(max(len(class_names), 1))],
                                   np.uint8)
        self._age_colors = [tuple(int(c) for c in np.array((90, 220, 255)) * (1 - 0.75 * a / max(self.window - 1, 1)))
                            for a in range(self.window)]
        self._text_cache: dict = {}
        self._strips: dict[str, dict] = {}
        self._layout()
        self._background = self._make_background()

    # ------------------------------------------------------------------ layout
    @classmethod
    def plot_width_for(cls, panel_width: int) -> int:
        """Pixels (= steps of history) of each plot for a panel ``panel_width`` wide."""
        return max(int(panel_width) - 2 * cls.MARGIN - cls.VALUE_W, 16)

    def _layout(self) -> None:
        pg = self.pg
        m = self.MARGIN
        self.plot_w = self.plot_width_for(self.size[0])
        y = 30
        self.plot_rects = []
        for _ in self.PLOTS:
            self.plot_rects.append(pg.Rect(m, y + self.LABEL_H, self.plot_w, self.PLOT_H))
            y += self.LABEL_H + self.PLOT_H + 6
        y += 4
        self.strip_rects = []
        for _ in self.GROUPS:
            self.strip_rects.append(pg.Rect(m, y + self.LABEL_H - 2, self.plot_w, self.STRIP_H))
            y += self.LABEL_H - 2 + self.STRIP_H + 4
        self.legend_y = y + 4
        # a short panel (a small --scale) shows what fits, top down
        H = self.size[1]
        self.plots = [pl for pl, r in zip(self.PLOTS, self.plot_rects) if r.bottom <= H]
        self.plot_rects = self.plot_rects[:len(self.plots)]
        self.groups = [g for g, r in zip(self.GROUPS, self.strip_rects) if r.bottom <= H]
        self.strip_rects = self.strip_rects[:len(self.groups)]
        self.show_legend = self.legend_y + 30 <= H

    def _make_background(self):
        pg = self.pg
        bg = pg.Surface(self.size)
        bg.fill(_BG)
        for (name, label, _), r in zip(self.plots, self.plot_rects):
            bg.blit(self.font.render(label, True, _DIM), (r.x, r.y - self.LABEL_H + 2))
            pg.draw.rect(bg, _PLOT_BG, r)
            for f in (0.25, 0.5, 0.75):
                yy = r.y + int(f * r.height)
                pg.draw.line(bg, _GRID, (r.x, yy), (r.right - 1, yy))
        labels = {"sensory": "sensory neurons (q, k, v)", "inter": "inter neurons", "command": "command neurons",
                  "motor": "motor neurons"}
        for g, r in zip(self.groups, self.strip_rects):
            bg.blit(self.font_small.render(labels[g], True, _DIM), (r.x, r.y - self.LABEL_H + 4))
            pg.draw.rect(bg, _PLOT_BG, r)
        if not self.show_legend:
            return bg
        x = self.MARGIN
        bg.blit(self.font_small.render("action:", True, _DIM), (x, self.legend_y))
        x += 48
        for i, name in enumerate(self.class_names):
            pg.draw.rect(bg, tuple(int(c) for c in self._class_rgb[i]), (x, self.legend_y + 2, 10, 10))
            t = self.font_small.render(name, True, _TEXT)
            bg.blit(t, (x + 13, self.legend_y))
            x += 13 + t.get_width() + 10
        bg.blit(self.font_small.render("lines: kept keys by age (bright = newest); dots: mean over kept keys",
                                       True, _DIM), (self.MARGIN, self.legend_y + 16))
        return bg

    def _text(self, s: str, color=_TEXT, small: bool = False):
        key = (s, color, small)
        surf = self._text_cache.get(key)
        if surf is None:
            if len(self._text_cache) > 2048:
                self._text_cache.clear()
            surf = self._text_cache[key] = (self.font_small if small else self.font).render(s, True, color)
        return surf

    def next_head(self) -> None:
        """Show the next head (wraps around)."""
        self.head = (self.head + 1) % self.num_heads

    # ------------------------------------------------------------------ drawing
    def __call__(self, surf, view) -> None:
        surf.blit(self._background, (0, 0))
        if not self.enabled or self.note or not len(self.history):
            msg = self.note or ("traces off (T to show)" if not self.enabled else "waiting for the first step")
            surf.blit(self._text(msg, _DIM), (self.MARGIN, 8))
            if self.note or not self.enabled:
                return
        if not len(self.history):
            return
        h = self.head
        surf.blit(self._text(f"NAC head {h + 1}/{self.num_heads}   (H: next head)"), (self.MARGIN, 8))
        hist = self.history
        classes = np.clip(hist.view("action_class"), 0, len(self._class_rgb) - 1)
        drawn = {"step": view.step, "head": h, "mean": {}, "keys": {}, "neurons": {}}
        for (name, _, fixed), r in zip(self.plots, self.plot_rects):
            keys = hist.by_age(name, h, self.window)  # (n, T)
            mean = hist.mean(name, h)  # (n,)
            drawn["keys"][name] = keys[-1].copy()
            drawn["mean"][name] = float(mean[-1])
            self._plot(surf, r, keys, mean, classes, fixed)
        for g, r in zip(self.groups, self.strip_rects):
            key = "neuron_" + g
            try:
                a = hist.view(key)
            except KeyError:
                continue
            a = a[:, h] if a.ndim == 3 else a  # (n, N)
            drawn["neurons"][g] = a[-1].copy()
            self._strip(surf, r, g, a, signed_unit=(g != "sensory"))
        self.last_drawn = drawn

    def _plot(self, surf, r, keys: np.ndarray, mean: np.ndarray, classes: np.ndarray, fixed) -> None:
        pg = self.pg
        n = mean.shape[0]
        if fixed is not None:
            lo, hi = fixed
        else:
            both = np.concatenate([keys[np.isfinite(keys)], mean[np.isfinite(mean)]])
            lo, hi = (float(both.min()), float(both.max())) if both.size else (0.0, 1.0)
            pad = 0.08 * (hi - lo) if hi > lo else max(abs(hi), 1e-3) * 0.1
            lo, hi = lo - pad, hi + pad
        scale = (r.height - 3) / (hi - lo)
        x = (r.right - n + np.arange(n)).astype(np.float64)  # newest at the right edge
        base = r.bottom - 2

        def ys(v):
            return base - (np.clip(v, lo, hi) - lo) * scale

        finite = np.isfinite(keys)  # (n, T)
        y_keys = ys(keys)  # NaN stays NaN: those points are never drawn
        for age in range(keys.shape[1] - 1, -1, -1):  # oldest first, newest on top
            ok = finite[:, age]
            color = self._age_colors[min(age, len(self._age_colors) - 1)]
            if ok.all():  # the usual case once the window is full: one line, no splitting
                if n > 1:
                    pg.draw.lines(surf, color, False, np.column_stack((x, y_keys[:, age])).tolist())
                continue
            if ok.sum() < 2:
                continue
            pts = np.column_stack((x, y_keys[:, age]))
            # split into runs of finite values
            edges = np.flatnonzero(np.diff(ok.astype(np.int8))) + 1
            for seg_ok, seg in zip(np.split(ok, edges), np.split(pts, edges)):
                if seg_ok[0] and len(seg) > 1:
                    pg.draw.lines(surf, color, False, seg.tolist())
        ok = np.isfinite(mean)
        if ok.any():
            xi = x[ok].astype(np.int64)
            yi = ys(mean[ok]).astype(np.int64)
            col = self._class_rgb[classes[ok]]
            px = pg.surfarray.pixels3d(surf)
            for dy in (-1, 0, 1):
                yy = np.clip(yi + dy, r.top, r.bottom - 1)
                px[xi, yy] = col
            del px  # unlock the surface
            last = mean[ok][-1]
            surf.blit(self._text(f"{last:8.3f}", _TEXT), (r.right + 4, int(ys(last)) - 7))
        surf.blit(self._text(f"{hi:.3g}", _DIM, True), (r.right + 4, r.top))
        surf.blit(self._text(f"{lo:.3g}", _DIM, True), (r.right + 4, r.bottom - 11))

    def _strip(self, surf, r, group: str, a: np.ndarray, signed_unit: bool) -> None:
        """Heat strip of (n, N) activity: one pixel column per step, scrolled in place.

        The small (plot_w x N) image is kept between frames; a new step scrolls it by one column
        and colours only that column. It is rebuilt from the history when the head changes, the
        history restarts, or (sensory) the colour scale grows by more than 10 %.
        """
        pg = self.pg
        n, N = a.shape
        count = self.history.pushed
        cached = self._strips.get(group)
        scale = 1.0
        if not signed_unit:
            m = float(np.abs(a[-1]).max()) if a.size else 0.0
            scale = cached["scale"] if cached else 0.0
            if m > 1.1 * scale or scale == 0.0:
                scale, cached = max(m, float(np.abs(a).max()), 1e-6), None
        if cached is not None and cached["head"] == self.head and cached["N"] == N and count == cached["count"] + 1:
            small = cached["surface"]
            small.scroll(-1, 0)
            idx = np.clip((a[-1] / scale + 1.0) * 127.5, 0, 255).astype(np.uint8)
            col = pg.surfarray.pixels3d(small)
            col[-1] = self._lut[idx]
            del col
        else:
            idx = np.clip((a / scale + 1.0) * 127.5, 0, 255).astype(np.uint8)
            img = np.empty((self.plot_w, N, 3), np.uint8)
            img[:] = _PLOT_BG
            img[self.plot_w - n:] = self._lut[idx]  # (n, N, 3): x = step, y = neuron
            small = pg.surfarray.make_surface(img)
        self._strips[group] = {"surface": small, "head": self.head, "N": N, "count": count, "scale": scale}
        pg.transform.scale(small, r.size, surf.subsurface(r))


__all__ = ["SaliencyDrawer", "TracePanel"]
