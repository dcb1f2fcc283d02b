"""The HUD: :class:`Renderer` composes the scaled frame, the heads-up display and the overlay panel
of one step (:class:`StepView`) into one off-screen ``pygame.Surface``.

pygame is imported when a :class:`Renderer` is made, not with this module.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

DEFAULT_ACTION_NAMES = ("nothing", "right", "left", "gas", "brake")  # CarRacing's (envs.carracing.ACTION_NAMES)
from agent.actors.rollout import STEERING_CLASSES, STEERING_DEADBAND, steering_class  # noqa: F401 - re-exported for the HUD's users


@dataclass
class StepView:
    """What the runner shows for one step: the frame the policy saw and what it decided on it.

    Attributes:
        frame: (H, W, 3) uint8, the observation the policy acted on.
        step: 1-based index of this decision in the episode.
        action: the action chosen on ``frame`` (None before any decision).
        probs: (A,) float action probabilities (softmax of the NAC logits), None for the expert.
        speed: car speed (simulator units per second) when ``frame`` was rendered.
        episode_return: the return collected before this action.
        fps: recent steps per second of the whole loop (env + policy + drawing).
        seed, episode, episodes: the track seed and the 1-based episode index of the run.
        policy_state: the NAC :class:`agent.nn.policy.PolicyState` after this step (overlays read
            ``policy_state.last``); None for the expert.
        extras: overlay data computed per step (``"saliency"``: an :class:`agent.drive.saliency.SaliencyMap`).
        latency_ms: milliseconds from the observation to the action, overlays included.
        status: one line about the overlays (e.g. what the saliency map attributes).
        paused: the run is paused (the HUD says so).
        steering: the normalised steering chosen (a steering policy), +1 = 25 degrees right.
        throttle: the throttle sent with it (-1..1; negative brakes), if known.
        standstill_steps: consecutive steps so far with the car below
            :data:`agent.actors.rollout.STANDSTILL_SPEED` (0 while it moves).
        longest_standstill: the episode's longest such run so far, steps (None: the env reports no speed).
        off_road_steps: steps so far with all four wheels off the road (None: the env has no wheels).
        teacher_class: ``drive --teacher.expert``: the class of the expert's action for this frame (an
            action index, or the steering class of a steering policy); None without a teacher.
        driver_steering: ``drive --replay``: the recording's steering label of this frame (normalised),
            marked on the steering gauge; None otherwise.
        notes: further HUD lines (``drive --replay``: the frame and the running scores against the driver).
    """

    frame: np.ndarray
    step: int = 0
    action: int | None = None
    probs: np.ndarray | None = None
    speed: float = 0.0
    episode_return: float = 0.0
    fps: float = 0.0
    seed: int = 0
    episode: int = 1
    episodes: int = 1
    policy_state: Any = None
    extras: dict = field(default_factory=dict)
    latency_ms: float = 0.0
    status: str = ""
    paused: bool = False
    steering: float | None = None
    throttle: float | None = None
    standstill_steps: int = 0
    longest_standstill: int | None = None
    off_road_steps: int | None = None
    teacher_class: int | None = None
    driver_steering: float | None = None
    notes: tuple[str, ...] = ()


#: An overlay: draws onto its region (a subsurface of the composed Surface) for one step.
PanelDrawer = Callable[["pygame.Surface", StepView], None]  # noqa: F821 - pygame is imported lazily
#: A frame filter: (H, W, 3) uint8 frame, view -> the frame to show (e.g. with a heat map blended in),
#: applied at the observation's own resolution before the upscale (cheap: 96 x 96 for CarRacing).
FrameFilter = Callable[[np.ndarray, StepView], np.ndarray]

_BG = (18, 19, 23)
_HUD_BG = (28, 30, 36)
_PANEL_BG = (12, 13, 16)
_EDGE = (70, 74, 86)
_TEXT = (225, 228, 235)
_DIM = (120, 125, 140)
_ACCENT = (255, 196, 64)
_BAR = (80, 150, 235)
_BAR_TAKEN = (255, 196, 64)
_BAR_BG = (48, 51, 60)
_DRIVER = (90, 220, 120)  # the recorded driver's steering (drive --replay)


#: Rendered strings kept by each :class:`TextCache` (about 5-30 KB of pixels each).
TEXT_CACHE_ENTRIES = 256


class TextCache:
    """Rendered text surfaces, least recently used dropped beyond ``capacity`` entries.

    The HUD and the trace panel redraw a few dozen strings a frame; the labels repeat, the numbers
    (return, latency, FPS, the Grad-CAM time) mostly do not. The caches used to be cleared only at
    4,096 and 2,048 entries: as they filled, ``drive --record`` grew by about 30 MB of text surfaces
    over its first episodes (issue 38: 599 to 635 MB over 3 episodes). An LRU of a few hundred keeps
    the strings that repeat and at most a few MB of pixels.

    Args:
        capacity: entries kept (>= 1).
    """

    def __init__(self, capacity: int = TEXT_CACHE_ENTRIES):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._items: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def render(self, font, s: str, color) -> Any:
        """``font.render(s, True, color)``, from the cache when this font, string and colour were drawn lately."""
        key = (id(font), s, color)
        surf = self._items.get(key)
        if surf is None:
            surf = self._items[key] = font.render(s, True, color)
            if len(self._items) > self.capacity:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        return surf

    def pixel_bytes(self) -> int:
        """Bytes of pixels held by the cached surfaces."""
        return sum(x.get_pitch() * x.get_height() for x in self._items.values())


def wrap_text(font, text: str, width: int, max_lines: int = 2) -> list[str]:
    """``text`` broken at spaces into lines no wider than ``width`` pixels in ``font`` (a pygame Font),
    at most ``max_lines`` of them; the last line ends in "..." when the text does not fit. A word
    wider than ``width`` stands on its own line."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        trial = f"{line} {word}" if line else word
        if line and font.size(trial)[0] > width:
            lines.append(line)
            line = word
        else:
            line = trial
    if line:
        lines.append(line)
    if len(lines) > max_lines:
        last = " ".join(lines[max_lines - 1:])
        while last and font.size(last + " ...")[0] > width:
            last = last[:-1]
        lines = lines[:max_lines - 1] + [last.rstrip() + " ..."]
    return lines


class Renderer:
    """Composes the scaled frame, the HUD and the overlay panel into one off-screen Surface.

    Layout (``size`` is always even, for H.264)::

        +------------------------+-----------------+
        |  frame (96*scale)^2    |  overlay panel  |
        +------------------------+  (panel_width)  |
        |  HUD                   |                 |
        +------------------------+-----------------+

    Overlays plug in as callables: :attr:`frame_filters` ``filter(frame, view) -> frame`` change
    the frame before it is scaled up (the saliency heat map is blended in there),
    :attr:`frame_overlays` ``drawer(surface, view)`` draw on the scaled frame's subsurface and
    :attr:`panels` on the panel's subsurface (after the HUD). Fonts and the static background (panel, labels,
    bar outlines) are made once; :meth:`compose` reuses one canvas Surface (copy it to keep it).

    Args:
        frame_size: (width, height) of the observation, 96 x 96 for CarRacing.
        scale: integer upscale of the frame.
        action_names: names of the discrete actions.
        policy_label: first HUD line, e.g. "NAC policy nac.pt" or "expert (privileged state)".
        show_probs: draw action-probability bars (a NAC policy); else a note that there are none.
        panel_width: width of the overlay panel (0 = none).
        help_text: a line of key help drawn at the bottom of the HUD.
        steering: a steering policy: draw a steering gauge (view.steering, normalised, and
            view.throttle) instead of action probabilities.
        speed_unit: shown after the speed (e.g. "mph").
        steering_degrees: the steering angle of a steering output of 1 (Udacity: 25 degrees), shown
            beside the value; None shows the value alone, "-1 left, +1 right" (CarRacing's
            continuous configuration, whose second control, throttle, fills the throttle bar).
    """

    HUD_HEIGHT = 200
    MIN_LEFT_WIDTH = 480  # the HUD needs this much even when the frame is small
    MIN_PANEL_HEIGHT = 744  # the trace panel's plots and strips fit (the HUD grows to match)

    def __init__(self, frame_size: tuple[int, int] = (96, 96), scale: int = 6,
                 action_names: tuple[str, ...] = DEFAULT_ACTION_NAMES, policy_label: str = "",
                 show_probs: bool = True, panel_width: int = 420, help_text: str = "", steering: bool = False,
                 speed_unit: str = "", steering_degrees: float | None = 25.0):
        import pygame

        if scale < 1:
            raise ValueError(f"scale must be >= 1, got {scale}")
        pygame.font.init()
        self.pygame = pygame
        self.action_names = tuple(action_names)
        self.policy_label = policy_label
        self.show_probs = show_probs and not steering
        self.steering = steering
        self.speed_unit = speed_unit
        self.steering_degrees = steering_degrees
        self.help_text = help_text
        fw, fh = int(frame_size[0]) * scale, int(frame_size[1]) * scale
        self.frame_size = (int(frame_size[0]), int(frame_size[1]))
        left_w = max(fw, self.MIN_LEFT_WIDTH)
        width = left_w + max(int(panel_width), 0)
        height = max(fh + self.HUD_HEIGHT, self.MIN_PANEL_HEIGHT if panel_width > 0 else 0)
        width, height = width + width % 2, height + height % 2
        self.size = (width, height)
        self.frame_rect = pygame.Rect((left_w - fw) // 2, 0, fw, fh)
        self.hud_rect = pygame.Rect(0, fh, left_w, height - fh)
        self.panel_rect = pygame.Rect(left_w, 0, width - left_w, height)

        self.panels: list[PanelDrawer] = []
        self.frame_overlays: list[PanelDrawer] = []
        self.frame_filters: list[FrameFilter] = []

        self.font = pygame.font.Font(None, 22)
        self.font_small = pygame.font.Font(None, 19)
        self.font_big = pygame.font.Font(None, 34)
        self.line_h = self.font.get_linesize() + 2

        self.canvas = pygame.Surface(self.size)
        self._frame_src = pygame.Surface(self.frame_size, 0, self.canvas)  # same format: scale() into the canvas
        self._frame_view = self.canvas.subsurface(self.frame_rect)
        self._panel_view = self.canvas.subsurface(self.panel_rect) if self.panel_rect.width else None
        #: the HUD's rendered strings (:class:`TextCache`)
        self.text_cache = TextCache()
        self._layout_hud()
        self.background = self._make_background()

    # ------------------------------------------------------------------ static parts
    def _layout_hud(self) -> None:
        hud = self.hud_rect
        self._text_x = hud.x + 14
        self._text_y = hud.y + 10
        # probability bars: label | bar | percent, in the right part of the HUD
        self._bars_x = hud.x + max(hud.width - 262, 250)
        self._bar_label_w = 62
        self._bar_w = hud.right - 52 - (self._bars_x + self._bar_label_w) - 8
        self._bar_h = 14
        self._bar_pitch = 24
        self._bars_y = hud.y + 34
        self._gauge_w = hud.right - 20 - self._bars_x

    def _make_background(self):
        pg = self.pygame
        bg = pg.Surface(self.size)
        bg.fill(_BG)
        pg.draw.rect(bg, _HUD_BG, self.hud_rect)
        pg.draw.line(bg, _EDGE, self.hud_rect.topleft, (self.hud_rect.right - 1, self.hud_rect.top), 2)
        if self.panel_rect.width:
            pg.draw.rect(bg, _PANEL_BG, self.panel_rect)
            pg.draw.line(bg, _EDGE, self.panel_rect.topleft, (self.panel_rect.left, self.panel_rect.bottom - 1), 2)
        header_y = self.hud_rect.y + 10
        if self.steering:
            title = (f"steering (normalised, 1 = {self.steering_degrees:g} deg)" if self.steering_degrees is not None
                     else "steering (-1 left, +1 right)")
            bg.blit(self.font_small.render(title, True, _DIM), (self._bars_x, header_y))
            pg.draw.rect(bg, _BAR_BG, (self._bars_x, self._bars_y + 8, self._gauge_w, self._bar_h))
            cx = self._bars_x + self._gauge_w // 2
            pg.draw.line(bg, _EDGE, (cx, self._bars_y + 2), (cx, self._bars_y + 8 + self._bar_h + 6), 2)
            bg.blit(self.font_small.render("left", True, _DIM), (self._bars_x, self._bars_y + 30))
            t = self.font_small.render("right", True, _DIM)
            bg.blit(t, (self._bars_x + self._gauge_w - t.get_width(), self._bars_y + 30))
            bg.blit(self.font_small.render("throttle", True, _DIM), (self._bars_x, self._bars_y + 62))
            pg.draw.rect(bg, _BAR_BG, (self._bars_x, self._bars_y + 80, self._gauge_w, self._bar_h))
        elif self.show_probs:
            bg.blit(self.font_small.render("action probabilities", True, _DIM), (self._bars_x, header_y))
            for i, name in enumerate(self.action_names):
                y = self._bars_y + i * self._bar_pitch
                bg.blit(self.font_small.render(name, True, _TEXT), (self._bars_x, y))
                pg.draw.rect(bg, _BAR_BG, (self._bars_x + self._bar_label_w, y, self._bar_w, self._bar_h))
        else:
            bg.blit(self.font_small.render("action probabilities: none", True, _DIM), (self._bars_x, header_y))
            bg.blit(self.font_small.render("(the expert acts from", True, _DIM), (self._bars_x, header_y + 22))
            bg.blit(self.font_small.render(" privileged state)", True, _DIM), (self._bars_x, header_y + 42))
        bg.blit(self.font_small.render(self.policy_label, True, _DIM), (self._text_x, self.hud_rect.bottom - 24))
        if self.help_text:
            bg.blit(self.font_small.render(self.help_text, True, _DIM), (self._text_x, self.hud_rect.bottom - 44))
        return bg

    @property
    def status_width(self) -> int:
        """Pixels the status line may take, from the HUD's left text margin to before the probability bars."""
        return self._bars_x - self._text_x - 12

    def _text(self, font, s: str, color=_TEXT):
        """Rendered text, from the HUD's LRU cache (:class:`TextCache`)."""
        return self.text_cache.render(font, s, color)

    # ------------------------------------------------------------------ per step
    def compose(self, view: StepView):
        """Draw ``view`` onto the canvas and return it (the same Surface every call)."""
        pg = self.pygame
        c = self.canvas
        # Redraw only what the steps change: the background goes under the HUD and the margins
        # beside the frame, not under the scaled frame (it covers its rectangle) nor under a panel
        # whose drawers all paint their whole area first (``opaque``).
        panel_opaque = bool(self.panels) and all(getattr(d, "opaque", False) for d in self.panels)
        for r in self._background_rects(panel_opaque):
            c.blit(self.background, r, r)
        frame = np.ascontiguousarray(view.frame[..., :3], dtype=np.uint8)
        if frame.shape[:2] != (self.frame_size[1], self.frame_size[0]):
            raise ValueError(f"frame of shape {frame.shape} does not fit the renderer's {self.frame_size} (w, h)")
        for apply in self.frame_filters:
            frame = apply(frame, view)
        pg.surfarray.blit_array(self._frame_src, frame.swapaxes(0, 1))
        pg.transform.scale(self._frame_src, self.frame_rect.size, self._frame_view)
        for draw in self.frame_overlays:
            draw(self._frame_view, view)
        self._draw_hud(view)
        if self._panel_view is not None:
            for draw in self.panels:
                draw(self._panel_view, view)
        return c

    def _background_rects(self, panel_opaque: bool) -> list:
        """The canvas rectangles :meth:`compose` restores from the background: everything but the
        frame (and the panel when ``panel_opaque``)."""
        pg = self.pygame
        f, hud = self.frame_rect, self.hud_rect
        left_w = hud.width
        rects = [pg.Rect(0, 0, f.left, f.height), pg.Rect(f.right, 0, left_w - f.right, f.height), hud]
        if self.panel_rect.width and not panel_opaque:
            rects.append(self.panel_rect)
        return [r for r in rects if r.width > 0 and r.height > 0]

    def _draw_hud(self, v: StepView) -> None:
        pg = self.pygame
        c = self.canvas
        x, y, lh = self._text_x, self._text_y, self.line_h
        if self.steering:
            name = STEERING_CLASSES[steering_class(v.steering)] if v.steering is not None else "-"
        else:
            name = self.action_names[v.action] if v.action is not None and 0 <= v.action < len(self.action_names) \
                else "-"
        big = self._text(self.font_big, name.upper(), _ACCENT)
        c.blit(big, (x, y))
        if v.teacher_class is not None:  # drive --teacher.expert: highlighted where the teacher would do otherwise
            names = STEERING_CLASSES if self.steering else self.action_names
            mine = steering_class(v.steering) if self.steering and v.steering is not None else v.action
            t = names[v.teacher_class] if 0 <= v.teacher_class < len(names) else "-"
            c.blit(self._text(self.font_small, f"teacher: {t}", _ACCENT if v.teacher_class != mine else _DIM),
                   (x + max(120, big.get_width() + 16), y + 6))
        y += self.font_big.get_linesize() + 4
        c.blit(self._text(self.font, f"speed   {v.speed:6.1f} {self.speed_unit}".rstrip()), (x, y))
        y += lh
        c.blit(self._text(self.font, f"return  {v.episode_return:7.1f}"), (x, y))
        y += lh
        c.blit(self._text(self.font, f"step    {v.step:5d}"), (x, y))
        c.blit(self._text(self.font_small, f"seed {v.seed}  ep {v.episode}/{v.episodes}", _DIM), (x + 120, y + 2))
        y += lh
        c.blit(self._text(self.font, f"FPS     {v.fps:6.1f}"), (x, y))
        c.blit(self._text(self.font_small, f"step latency {v.latency_ms:5.1f} ms", _DIM), (x + 120, y + 2))
        y += lh
        stalls = []
        if v.longest_standstill is not None:
            stalls.append(f"standstill {v.standstill_steps} (longest {v.longest_standstill})")
        if v.off_road_steps is not None:
            stalls.append(f"off-road {v.off_road_steps}")
        if stalls:
            color = _ACCENT if v.standstill_steps > 0 else _DIM  # highlighted while the car stands
            c.blit(self._text(self.font_small, "steps: " + "   ".join(stalls), color), (x, y + 2))
            y += lh
        for i, line in enumerate(v.notes):  # the first (the replay's frame and driver) in the driver's colour
            c.blit(self._text(self.font_small, line, _DRIVER if i == 0 and v.driver_steering is not None else _TEXT),
                   (x, y + 2 + 18 * i))
        if v.paused:
            c.blit(self._text(self.font_big, "PAUSED", _ACCENT), (x + 150, self._text_y))
        if v.status:  # up to two lines, left of the probability bars
            for i, line in enumerate(wrap_text(self.font_small, v.status, self.status_width, max_lines=2)):
                c.blit(self._text(self.font_small, line, _DIM), (x, self.hud_rect.bottom - 64 + 18 * i))
        if self.steering and v.steering is not None:
            w, cx = self._gauge_w, self._bars_x + self._gauge_w // 2
            s = float(np.clip(v.steering, -1.0, 1.0))
            px = int(round(s * w / 2))
            pg.draw.rect(c, _BAR_TAKEN, (min(cx, cx + px), self._bars_y + 8, max(abs(px), 2), self._bar_h))
            deg = self.steering_degrees
            label = self._text(self.font_small, f"{s:+.3f}  ({deg * s:+.1f} deg)" if deg is not None else f"{s:+.3f}")
            c.blit(label, (cx - label.get_width() // 2, self._bars_y + 30))
            if v.throttle is not None:
                th = float(np.clip(v.throttle, -1.0, 1.0))
                tw = int(round(abs(th) * w))
                if tw:
                    pg.draw.rect(c, _BAR if th >= 0 else (235, 90, 80), (self._bars_x, self._bars_y + 80, tw, self._bar_h))
                c.blit(self._text(self.font_small, f"{th:+.2f}"), (self._bars_x + 64, self._bars_y + 62))
        if self.steering and v.driver_steering is not None:  # the driver's label: a mark across the gauge
            w, cx = self._gauge_w, self._bars_x + self._gauge_w // 2
            dx = cx + int(round(float(np.clip(v.driver_steering, -1.0, 1.0)) * w / 2))
            pg.draw.line(c, _DRIVER, (dx, self._bars_y + 2), (dx, self._bars_y + 8 + self._bar_h + 4), 3)
        if self.show_probs and v.probs is not None:
            bx = self._bars_x + self._bar_label_w
            for i, p in enumerate(np.asarray(v.probs, dtype=np.float64)[: len(self.action_names)]):
                by = self._bars_y + i * self._bar_pitch
                w = int(round(float(np.clip(p, 0.0, 1.0)) * self._bar_w))
                if w:
                    pg.draw.rect(c, _BAR_TAKEN if i == v.action else _BAR, (bx, by, w, self._bar_h))
                c.blit(self._text(self.font_small, f"{100 * p:3.0f}%"), (bx + self._bar_w + 8, by))

    def to_rgb(self) -> np.ndarray:
        """The canvas as an (H, W, 3) uint8 array (for video)."""
        w, h = self.size
        return np.frombuffer(self.pygame.image.tobytes(self.canvas, "RGB"), np.uint8).reshape(h, w, 3)


__all__ = ["DEFAULT_ACTION_NAMES", "FrameFilter", "PanelDrawer", "Renderer", "STEERING_CLASSES", "STEERING_DEADBAND", "wrap_text",
           "TEXT_CACHE_ENTRIES", "TextCache",
           "StepView", "steering_class"]
