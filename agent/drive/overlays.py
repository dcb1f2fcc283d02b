"""Drawing the live overlays with pygame: the Grad-CAM heat map and the NAC trace panel.

Both are drawers for :class:`agent.drive.hud.Renderer` (``drawer(surface, view)``). Nothing here
calls matplotlib per frame: lines are ``pygame.draw.lines`` over the stored history, the
action-coloured means are written straight into the pixels (``surfarray``), heat strips are
small arrays through a colour lookup table, scaled once into place; static parts (frames,
labels) are drawn once on a cached background. Line plots and heat strips keep their image
between frames and scroll it by one pixel column per step, drawing only the newest column.
"""

from __future__ import annotations

import math

import numpy as np

from agent.drive.hud import TextCache
from agent.drive.saliency import blend_heatmap
from agent.drive.traces import CLASS_COLORS, TraceHistory, masked_mean

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


def plot_label_layout(r, last: float | None, lo: float, hi: float, value_h: int | None, hi_h: int,
                      lo_h: int) -> dict[str, int | None]:
    """Where the labels beside one trace plot go: the top pixel row (y) of each, or None to leave it out.

    The newest value's label sits at the height of its point on the line (clamped into the plot);
    the range labels sit at the plot's top (``hi``) and bottom (``lo``). A range label that the
    value's label would cover is left out, since the value then says where the line is (the omega
    panel's lower range label used to print under the current value).

    Args:
        r: the plot's rectangle (anything with ``top``, ``bottom``, ``height``), pixels.
        last: the newest finite value (None: no value label).
        lo, hi: the plot's value range (hi > lo).
        value_h, hi_h, lo_h: the labels' heights in pixels (value_h None when ``last`` is None).

    Returns:
        ``{"value": y or None, "hi": y or None, "lo": y or None}``.
    """
    out: dict[str, int | None] = {"value": None, "hi": r.top, "lo": r.bottom - 11}
    if last is None or value_h is None:
        return out
    y = (r.bottom - 2) - (min(max(last, lo), hi) - lo) * ((r.height - 3) / (hi - lo))
    top = int(y) - 7  # centred on the point for the panel's font (the label rects of _layout assume these offsets)
    out["value"] = top
    bottom = top + value_h
    if top < r.top + hi_h:  # overlaps the hi label's rows
        out["hi"] = None
    if bottom > out["lo"]:
        out["lo"] = None
    return out


class TracePanel:
    """The NAC trace panel: four scrolling line plots and four neuron heat strips for one head.

    Plots (newest step at the right, one pixel column per step of ``history``): phi, omega, the
    logit and the attention weight. Thin lines are the kept keys by age (bright = the newest
    frame, darker = older frames); the thick dotted line is the mean over the kept keys, each
    dot coloured by the action taken at that step (legend at the bottom). Heat strips: the
    sensory (q, k, v), inter, command and motor neurons of the shown head over the same steps
    (blue negative, red positive; the sensory strip is scaled by its largest magnitude).

    Scrolling: each plot keeps its image (a Surface of the plot's size) between calls. When
    exactly one step was pushed since the last call (``history.pushed`` grew by one and the
    previous newest step is still the one drawn), the head is the same and the plot's y-range
    did not change, the image is scrolled left by one pixel and only the columns that changed are
    redrawn (the newest point's and its neighbour's, and, once the history is full, the column of
    the step that dropped out); the result is pixel for pixel the full drawing of the same history
    with the same range. Anything else (first call, another head, a cleared history, several steps
    at once, a new range) redraws the plot from the whole history. No step pushed: the image is
    reused as it is.

    Y-range of the auto-scaled plots (omega and the logit; phi and the weight are fixed to
    [0, 1]): the data range is the smallest and largest finite value among the shown keys and
    means, padded by 8 % of its span on each side (10 % of its magnitude when it is a single
    value). The shown range is sticky: a full redraw for the first call, another head, a cleared
    history or several steps at once takes the padded data range; afterwards, at every call, it
    first grows at once to the union with the padded data range when data falls outside it, then
    shrinks to the padded data range when that is narrower than :attr:`SHRINK` (60 %) of the
    shown span, and otherwise stays (so the same data never changes it twice). Each change
    redraws the plot in full.

    Painting: the first call on a surface (and the first after a message such as "traces off")
    paints the whole panel background; later calls on the same surface repaint only the header,
    the plots, the labels beside them and the heat strips, so nothing else may draw on the
    panel's area between calls (the renderer leaves an :attr:`opaque` panel alone).

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
        ranges: the y-range each plot shows now, ``{quantity: (lo, hi)}`` in the quantity's units.
        full_redraws: plots drawn from the whole history so far (the others were scrolled or
            reused); a diagnostic count.
    """

    PLOTS = (("phi", "phi  content gate", (0.0, 1.0)), ("omega", "omega  time-constant gate", None),
             ("logits", "logit  a = ODE solution", None), ("weights", "attention weight", (0.0, 1.0)))
    GROUPS = ("sensory", "inter", "command", "motor")
    #: Every call leaves the whole panel painted (see "Painting"), so the renderer need not clear it.
    opaque = True
    MARGIN, VALUE_W, PLOT_H, LABEL_H, STRIP_H = 10, 58, 84, 18, 30
    #: An auto-scaled plot's range shrinks when the padded data range is below this fraction of the shown span.
    SHRINK = 0.6

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
        self._class_colors = [tuple(int(c) for c in rgb) for rgb in self._class_rgb]
        self._age_colors = [tuple(int(c) for c in np.array((90, 220, 255)) * (1 - 0.75 * a / max(self.window - 1, 1)))
                            for a in range(self.window)]
        #: the panel's rendered strings (:class:`agent.drive.hud.TextCache`)
        self.text_cache = TextCache()
        self._strips: dict[str, dict] = {}
        self._plot_state: dict[str, dict] = {}
        self.ranges: dict[str, tuple[float, float]] = {}
        self.full_redraws = 0
        self._painted = None  # the surface whose whole background the last call left painted
        self._header_head = None  # the head named in the header painted there
        self._last_step = None  # (head, history.pushed, the newest step's stored values) at the last call
        self._layout()
        self._background = self._make_background()
        # one plot's empty image (all plots have the same size and grid): columns are cleared from it
        self._plot_bg = self._background.subsurface(self.plot_rects[0]).copy() if self.plot_rects else None

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
        # where the labels beside a plot can land (hi, lo and the newest value, which follows the line)
        top = min(r.top for r in self.plot_rects) if self.plot_rects else 0
        self.header_rect = pg.Rect(0, 0, self.size[0], min(30, top))
        fh, fs = self.font.get_height(), self.font_small.get_height()
        self.label_rects = []  # the labels start at r.right + 4 (clipped at the panel's right edge)
        for r in self.plot_rects:
            y0, y1 = r.top - 8, max(r.bottom - 9 + fh, r.bottom - 11 + fs) + 1
            self.label_rects.append(pg.Rect(r.right + 4, y0, max(self.size[0] - r.right - 4, 0), y1 - y0))

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
        return self.text_cache.render(self.font_small if small else self.font, s, color)

    def next_head(self) -> None:
        """Show the next head (wraps around)."""
        self.head = (self.head + 1) % self.num_heads

    # ------------------------------------------------------------------ drawing
    def __call__(self, surf, view) -> None:
        message = self.note or ("traces off (T to show)" if not self.enabled else
                                "" if len(self.history) else "waiting for the first step")
        if message:
            surf.blit(self._background, (0, 0))
            surf.blit(self._text(message, _DIM), (self.MARGIN, 8))
            self._painted = None
            return
        h = self.head
        if self._painted is not surf:
            surf.blit(self._background, (0, 0))
            self._painted, self._header_head = surf, None
        if self._header_head != h:  # the header changes with the head only
            surf.blit(self._background, self.header_rect, self.header_rect)
            surf.blit(self._text(f"NAC head {h + 1}/{self.num_heads}   (H: next head)"), (self.MARGIN, 8))
            self._header_head = h
        hist = self.history
        drawn = {"step": view.step, "head": h, "mean": {}, "keys": {}, "neurons": {}}
        steps, newest = self._continued()
        if self.plots:
            self._draw_plots(surf, drawn, steps, newest)
        for g, r in zip(self.groups, self.strip_rects):
            key = "neuron_" + g
            try:
                a = hist.view(key)
            except KeyError:
                continue
            a = a[:, h] if a.ndim == 3 else a  # (n, N)
            drawn["neurons"][g] = a[-1].copy()
            self._strip(surf, r, g, a, signed_unit=(g != "sensory"), steps=steps)
        self.last_drawn = drawn

    # -- the line plots, scrolled in place
    def _continued(self):
        """Whether the history continued what the last call drew.

        Returns:
            steps: 0 (the same newest step), 1 (exactly one step pushed, the previous newest one
                being the one drawn last) or None (anything else: the first call, another head, a
                cleared history, several steps); compared on the stored values of the plotted
                quantities, the key ages and the action class, so a history cleared and refilled to
                one step more is not taken for a continuation.
            newest: (raw (P, K), ages (K,), class) of the newest step, P = the plotted quantities.
        """
        hist, h = self.history, self.head
        n, count = len(hist), hist.pushed
        s = max(n - 2, 0)
        raw = np.stack([hist.view(name)[s:n, h] for name, _, _ in self.PLOTS])  # (4, m, K), m = 1 or 2
        ages = hist.view("ages")[s:n, h]  # (m, K)
        classes = hist.view("action_class")[s:n]

        def stored(j: int) -> bytes:
            return raw[:, j].tobytes() + ages[j].tobytes() + classes[j].tobytes()

        newest, last, steps = stored(-1), self._last_step, None
        if last is not None and last[0] == h:
            if count == last[1] and newest == last[2]:
                steps = 0
            elif count == last[1] + 1 and n >= 2 and stored(-2) == last[2]:
                steps = 1
        self._last_step = (h, count, newest)
        shown = [i for i, pl in enumerate(self.PLOTS) if pl in self.plots]
        return steps, (raw[shown, -1], ages[-1], int(classes[-1]))

    def _draw_plots(self, surf, drawn: dict, steps, newest) -> None:
        """Every line plot of the shown head (:meth:`_plot_scrolled`); fills ``drawn["keys"/"mean"]``.
        ``steps`` and ``newest`` as :meth:`_continued` returns them."""
        T = self.window
        v, a, cls = newest  # (P, K), (K,), class
        # the newest step by age and its mean over the kept keys, as TraceHistory.by_age and .mean give them
        keys = np.full((len(self.plots), T), np.nan, np.float32)
        kept = np.flatnonzero((a >= 0) & (a < T))
        keys[:, a[kept]] = v[:, kept]
        means = masked_mean(np.nan_to_num(v), np.isfinite(v))  # (P,)
        cls = min(max(cls, 0), len(self._class_rgb) - 1)
        for i, ((name, _, fixed), r, lr) in enumerate(zip(self.plots, self.plot_rects, self.label_rects)):
            self._plot_scrolled(surf, r, lr, name, fixed, steps, keys[i], float(means[i]), cls)
            drawn["keys"][name] = keys[i].copy()
            drawn["mean"][name] = float(means[i])

    @staticmethod
    def _step_extremes(keys: np.ndarray, mean: np.ndarray):
        """Per step, the smallest and largest finite value among keys (m, T) and mean (m,): two (m,)
        float64 arrays, +inf / -inf where a step has none."""
        both = np.column_stack((keys, mean)).astype(np.float64)
        ok = np.isfinite(both)
        return np.where(ok, both, np.inf).min(1), np.where(ok, both, -np.inf).max(1)

    @staticmethod
    def _padded(lo: float, hi: float) -> tuple[float, float]:
        """The data range [lo, hi] padded as the plots show it (no finite data: lo, hi = inf, -inf -> [0, 1])."""
        if not (math.isfinite(lo) and math.isfinite(hi)):
            lo, hi = 0.0, 1.0
        pad = 0.08 * (hi - lo) if hi > lo else max(abs(hi), 1e-3) * 0.1
        return lo - pad, hi + pad

    def _plot_scrolled(self, surf, r, label_rect, name: str, fixed, steps, key_row: np.ndarray, mean: float,
                       cls: int) -> None:
        """Bring plot ``name``'s kept image up to date, blit it into ``r`` of ``surf`` and draw the
        labels beside it in ``label_rect``.

        Args:
            steps: steps pushed since the last call when the history continued what it drew (0 or 1),
                else None; with 1 the image is scrolled, with 0 reused, unless the range changes (see
                the class docstring).
            key_row: (T,) the newest step's keys by age; mean: their mean; cls: its action class.
        """
        hist = self.history
        n, count, L = len(hist), hist.pushed, hist.length
        W = r.width
        st = self._plot_state.get(name)
        if st is None:
            steps = None
        dropped = steps == 1 and n == st["n"]  # the history was full: its oldest step dropped out
        full = None
        if steps is None:
            full = (hist.by_age(name, self.head, self.window), hist.mean(name, self.head),
                    np.clip(hist.view("action_class"), 0, len(self._class_rgb) - 1))
            if st is None:
                # per step of the history, in a ring (step g at slot g % L): the drawn rows of the keys by
                # age and of the mean (image pixels), whether they are finite, the action class, and the
                # smallest and largest finite value (+inf / -inf: none)
                T = self.window
                st = self._plot_state[name] = {
                    "surface": self.pg.Surface(r.size), "y": np.zeros((L, T), np.int64), "ok": np.zeros((L, T), bool),
                    "ym": np.zeros(L, np.int64), "okm": np.zeros(L, bool), "cls": np.zeros(L, np.int64),
                    "lows": np.full(L, np.inf), "highs": np.full(L, -np.inf)}
            slots = (count - n + np.arange(n)) % L
            st["lows"][:], st["highs"][:] = np.inf, -np.inf
            st["lows"][slots], st["highs"][slots] = self._step_extremes(full[0], full[1])
        elif steps == 1:
            slot = (count - 1) % L  # (the slot of the step that dropped out, if one did)
            vals = [x for x in (*key_row.tolist(), mean) if math.isfinite(x)]
            st["lows"][slot] = min(vals) if vals else math.inf
            st["highs"][slot] = max(vals) if vals else -math.inf
        if fixed is not None:
            lo, hi = float(fixed[0]), float(fixed[1])
        else:
            dlo, dhi = float(st["lows"].min()), float(st["highs"].max())
            tlo, thi = self._padded(dlo, dhi)
            if steps is None:
                lo, hi = tlo, thi
            else:
                lo, hi = st["lo"], st["hi"]
                if dlo < lo or dhi > hi:  # data outside the shown range: grow at once
                    lo, hi = min(lo, tlo), max(hi, thi)
                if thi - tlo < self.SHRINK * (hi - lo):  # the data needs much less room: shrink
                    lo, hi = tlo, thi
                if (lo, hi) != (st["lo"], st["hi"]):
                    steps = None  # a new range: redraw in full
                    full = (hist.by_age(name, self.head, self.window), hist.mean(name, self.head),
                            np.clip(hist.view("action_class"), 0, len(self._class_rgb) - 1))
        image = st["surface"]
        if steps is None:
            image.blit(self._plot_bg, (0, 0))
            keys, means, classes = full
            y_keys, ok_keys, y_mean, ok_mean = self._draw_rows(image, r, r.topleft, r.right - n + np.arange(n),
                                                               keys, means, classes, lo, hi)
            slots = (count - n + np.arange(n)) % L
            st["y"][slots], st["ok"][slots], st["ym"][slots], st["okm"][slots] = y_keys, ok_keys, y_mean, ok_mean
            st["cls"][slots] = classes
            finite = np.flatnonzero(ok_mean)
            st["label"] = (count - n + int(finite[-1]), float(means[finite[-1]])) if finite.size else None
            self.full_redraws += 1
        elif steps == 1:
            slot = (count - 1) % L
            ok = np.isfinite(key_row)
            st["y"][slot] = self._ys(np.where(ok, key_row, lo), r, lo, hi) - r.y
            st["ok"][slot] = ok
            finite_mean = math.isfinite(mean)
            st["ym"][slot] = self._ys(np.array([mean], np.float64), r, lo, hi)[0] - r.y if finite_mean else 0
            st["okm"][slot], st["cls"][slot] = finite_mean, cls
            image.scroll(-1, 0)
            # the newest point's column and its neighbour's (the new segment runs across both)
            m = min(n, 3)
            self._redraw_columns(image, r, W - 2, W - 1, W - m, st, (count - m + np.arange(m)) % L)
            if dropped and W - n >= 0:  # the step that dropped out drew into the new oldest column
                self._redraw_columns(image, r, W - n - 1, W - n, W - n, st, (count - n + np.arange(min(n, 2))) % L)
            label = st["label"]
            if finite_mean:
                st["label"] = (count - 1, mean)
            elif label is not None and label[0] < count - n:  # the labelled step scrolled out
                means = hist.mean(name, self.head)
                finite = np.flatnonzero(np.isfinite(means))
                st["label"] = (count - n + int(finite[-1]), float(means[finite[-1]])) if finite.size else None
        st.update(head=self.head, n=n, lo=lo, hi=hi)
        self.ranges[name] = (lo, hi)
        surf.blit(image, r)
        surf.blit(self._background, label_rect, label_rect)
        label = st["label"]
        self._labels(surf, r, None if label is None else label[1], lo, hi)

    @staticmethod
    def _ys(v: np.ndarray, r, lo: float, hi: float) -> np.ndarray:
        """Panel rows (int64) of finite values ``v`` in the range [lo, hi] (clipped to it), truncated
        as pygame truncates float coordinates. Keys (float32) are computed in float32, means in float64."""
        scale = (r.height - 3) / (hi - lo)
        return ((r.bottom - 2) - (np.minimum(np.maximum(v, lo), hi) - lo) * scale).astype(np.int64)

    def _redraw_columns(self, image, r, c0: int, c1: int, x0: int, st: dict, slots: np.ndarray) -> None:
        """Repaint columns c0..c1 of a plot's kept ``image`` from consecutive steps, the first of them
        in image column ``x0``: their drawn rows at ``slots`` of the plot's ring ``st`` (y by age,
        finite by age, the mean's y and whether it is finite, the action class; image pixels, as
        :meth:`_draw_rows` computes them). The steps must include every point in columns
        c0 - 1 .. c1 + 1 (the segments that cross c0..c1). Lines are clipped to the columns pixel by
        pixel (pygame's clip), so the columns come out as in the full drawing."""
        pg = self.pg
        c0, c1 = max(c0, 0), min(c1, r.width - 1)
        if c0 > c1:
            return
        cols = pg.Rect(c0, 0, c1 - c0 + 1, r.height)
        image.blit(self._plot_bg, cols, cols)
        image.set_clip(cols)
        y, ok = st["y"][slots].tolist(), st["ok"][slots].tolist()
        for age in range(self.window - 1, -1, -1):  # oldest first, newest on top
            color = self._age_colors[min(age, len(self._age_colors) - 1)]
            for j in range(len(y) - 1):
                if ok[j][age] and ok[j + 1][age]:
                    pg.draw.line(image, color, (x0 + j, y[j][age]), (x0 + j + 1, y[j + 1][age]))
        top, bottom = r.top - r.y, r.bottom - 1 - r.y
        for j, (ym, okm, cls) in enumerate(zip(st["ym"][slots].tolist(), st["okm"][slots].tolist(),
                                               st["cls"][slots].tolist())):
            if okm and c0 <= x0 + j <= c1:  # the dot: three pixels, clipped to the plot
                a, b = min(max(ym - 1, top), bottom), min(max(ym + 1, top), bottom)
                image.fill(self._class_colors[cls], (x0 + j, a, 1, b - a + 1))
        image.set_clip(None)

    def _draw_rows(self, dst, r, origin, x: np.ndarray, keys: np.ndarray, mean: np.ndarray, classes: np.ndarray,
                   lo: float, hi: float):
        """Draw consecutive history steps of a plot in full: the key lines by age (oldest first; NaN
        points split a line, a lone finite point draws nothing) and the mean dots on top.

        Args:
            dst: the Surface to draw on; its pixel (0, 0) is the panel pixel ``origin``.
            r: the plot's rectangle in panel pixels.
            x: (m,) the steps' panel columns.
            keys: (m, T) by age; mean: (m,); classes: (m,) action classes (dot colours).
            lo, hi: the y-range.

        Returns:
            y_keys (m, T) and y_mean (m,), int64 rows in ``dst`` pixels (meaningless where not finite),
            and the finite masks (m, T) and (m,) of keys and mean.
        """
        pg = self.pg
        m = mean.shape[0]
        ox, oy = origin
        xl = (np.asarray(x) - ox).astype(np.int64)
        finite = np.isfinite(keys)  # (m, T)
        y_keys = self._ys(np.where(finite, keys, lo), r, lo, hi) - oy  # non-finite points are never drawn
        for age in range(keys.shape[1] - 1, -1, -1):  # oldest first, newest on top
            ok = finite[:, age]
            color = self._age_colors[min(age, len(self._age_colors) - 1)]
            if ok.all():  # the usual case once the window is full: one line, no splitting
                if m > 1:
                    pg.draw.lines(dst, color, False, np.column_stack((xl, y_keys[:, age])).tolist())
                continue
            if ok.sum() < 2:
                continue
            pts = np.column_stack((xl, y_keys[:, age]))
            # split into runs of finite values
            edges = np.flatnonzero(np.diff(ok.astype(np.int8))) + 1
            for seg_ok, seg in zip(np.split(ok, edges), np.split(pts, edges)):
                if seg_ok[0] and len(seg) > 1:
                    pg.draw.lines(dst, color, False, seg.tolist())
        ok = np.isfinite(mean)
        y_mean = self._ys(np.where(ok, mean, lo), r, lo, hi)
        dot = ok & (xl >= 0) & (xl < dst.get_width())  # (pixel writes are not clipped; never wrap around)
        if dot.any():
            xi, yi = xl[dot], y_mean[dot]
            col = self._class_rgb[classes[dot]]
            px = pg.surfarray.pixels3d(dst)
            for dy in (-1, 0, 1):
                px[xi, np.clip(yi + dy, r.top, r.bottom - 1) - oy] = col
            del px  # unlock the surface
        return y_keys, finite, y_mean - oy, ok

    def _labels(self, surf, r, last: float | None, lo: float, hi: float) -> None:
        """The labels beside plot ``r``: its range (hi at the top, lo at the bottom) and the newest
        finite mean ``last`` at its height (None: no label); see :func:`plot_label_layout`."""
        value = None if last is None else self._text(f"{last:8.3f}", _TEXT)
        hi_s, lo_s = self._text(f"{hi:.3g}", _DIM, True), self._text(f"{lo:.3g}", _DIM, True)
        layout = plot_label_layout(r, last, lo, hi, None if value is None else value.get_height(),
                                   hi_s.get_height(), lo_s.get_height())
        for surface, key in ((value, "value"), (hi_s, "hi"), (lo_s, "lo")):
            if surface is not None and layout[key] is not None:
                surf.blit(surface, (r.right + 4, layout[key]))

    def _plot(self, surf, r, keys: np.ndarray, mean: np.ndarray, classes: np.ndarray, fixed) -> None:
        """Draw a whole plot straight onto ``surf`` at ``r`` (no background): lines, dots and labels
        of keys (n, T), mean (n,), classes (n,), newest at the right edge, with the range ``fixed``
        or, when None, the padded data range. The full drawing the scrolled images are checked against."""
        if fixed is not None:
            lo, hi = float(fixed[0]), float(fixed[1])
        else:
            lows, highs = self._step_extremes(keys, mean)
            lo, hi = self._padded(float(lows.min()), float(highs.max())) if len(mean) else self._padded(np.inf, -np.inf)
        n = mean.shape[0]
        self._draw_rows(surf, r, (0, 0), r.right - n + np.arange(n), keys, mean, classes, lo, hi)
        ok = np.isfinite(mean)
        self._labels(surf, r, float(mean[ok][-1]) if ok.any() else None, lo, hi)

    def _strip(self, surf, r, group: str, a: np.ndarray, signed_unit: bool, steps=None) -> None:
        """Heat strip of (n, N) activity: one pixel column per step, scrolled in place.

        The small (plot_w x N) image is kept between frames; a new step (``steps`` == 1, see
        :meth:`_continued`) scrolls it by one column and colours only that column, no new step
        (``steps`` == 0) reuses it. It is rebuilt from the history otherwise (another head, a
        history that restarted or moved on by several steps) and when (sensory) the colour scale
        grows by more than 10 %.
        """
        pg = self.pg
        a = a[-self.plot_w:]  # a history longer than the strip shows its newest steps
        n, N = a.shape
        count = self.history.pushed
        cached = self._strips.get(group)
        scale = 1.0
        if not signed_unit:
            m = float(np.abs(a[-1]).max()) if a.size else 0.0
            scale = cached["scale"] if cached else 0.0
            if m > 1.1 * scale or scale == 0.0:
                scale, cached = max(m, float(np.abs(a).max()), 1e-6), None
        same = cached is not None and cached["head"] == self.head and cached["N"] == N
        if same and steps == 0 and count == cached["count"]:
            small = cached["surface"]
        elif same and steps == 1 and count == cached["count"] + 1:
            small = cached["surface"]
            small.scroll(-1, 0)
            idx = np.clip((a[-1] / scale + 1.0) * 127.5, 0, 255).astype(np.uint8)
            col = pg.surfarray.pixels3d(small)
            col[-1] = self._lut[idx]
            if n == cached["n"] and n < self.plot_w:  # a full history shorter than the strip: its oldest step left
                col[self.plot_w - n - 1] = _PLOT_BG
            del col
        else:
            idx = np.clip((a / scale + 1.0) * 127.5, 0, 255).astype(np.uint8)
            img = np.empty((self.plot_w, N, 3), np.uint8)
            img[:] = _PLOT_BG
            img[self.plot_w - n:] = self._lut[idx]  # (n, N, 3): x = step, y = neuron
            small = pg.surfarray.make_surface(img)
        self._strips[group] = {"surface": small, "head": self.head, "N": N, "count": count, "n": n, "scale": scale}
        pg.transform.scale(small, r.size, surf.subsurface(r))


__all__ = ["SaliencyDrawer", "TracePanel", "plot_label_layout"]
