"""The live runner behind ``drive``: a policy drives CarRacing in a pygame window, or headless.

``drive --env carracing --policy nac.pt [--episodes N] [--seed S] [--max-steps M] [--headless]
[--record out.mp4]`` loads the policy once and drives episodes on tracks S, S+1, ... For every
step it shows the 96x96 frame the policy sees (scaled up, nearest neighbour), a HUD with the
action chosen on that frame, the NAC policy's action probabilities (the expert has none), the
car speed, the return so far, the step and the frame rate, and a right-hand panel kept free for
overlays (Grad-CAM saliency, NAC neuron traces) that plug into :attr:`Renderer.panels`.

Everything is drawn onto one off-screen ``pygame.Surface`` (:meth:`Renderer.compose`); a window
shows it, ``--record`` writes it to an mp4 (libx264, 50 FPS, the env's own rate). With
``--headless``, or when no display is available, no window is opened (``SDL_VIDEODRIVER=dummy``)
and the run is never rate-limited; without ``--record`` a headless run skips drawing entirely.

Heavy modules (pygame, torch, imageio, gymnasium) are imported lazily, so building the command
line parser stays cheap.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from agent.drive.traces import step_traces

os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # no pygame banner on stdout

#: The first track never used for training (``envs.carracing.EVAL_SEED_BASE``; kept literal here so
#: that building the parser does not import gymnasium; a test checks the two agree).
DEFAULT_SEED = 1_000_000
#: CarRacing's simulation rate (``envs.carracing.FPS``); also the rate of recorded videos.
ENV_FPS = 50
DEFAULT_ACTION_NAMES = ("nothing", "left", "right", "gas", "brake")

EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 2, 130
ENVS = ("carracing", "udacity")
#: Frame upscale per simulator: CarRacing's 96x96 and Udacity's 320x160 camera.
DEFAULT_SCALE = {"carracing": 6, "udacity": 2}
STEERING_CLASSES = ("straight", "left", "right")
STEERING_DEADBAND = 0.05  # |normalised steering| below this counts as straight


def steering_class(steering: float) -> int:
    """0 straight, 1 left (steering < -0.05), 2 right (> 0.05); normalised steering, +1 = full right."""
    return 1 if steering < -STEERING_DEADBAND else 2 if steering > STEERING_DEADBAND else 0


# ---------------------------------------------------------------------------------------- CLI
def add_drive_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``drive`` options to ``parser`` (run them with :func:`run_drive`)."""
    parser.add_argument("--env", default="carracing", choices=list(ENVS),
                        help="simulator: carracing (gymnasium, built in) or udacity (the Udacity self-driving-car "
                             "simulator, started by you in Autonomous mode; it connects to --host:--port) "
                             "(default: %(default)s)")
    parser.add_argument("--policy", default="nac.pt",
                        help="policy file: a NAC policy (.pt) or the PPO expert (.zip); a name that is not an "
                             "existing path is looked up in the repository's policies/ folder (default: %(default)s)")
    parser.add_argument("--episodes", type=int, default=1, help="episodes to drive (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help="track seed of the first episode; episode i drives track seed+i. The default "
                             "%(default)s is the first track never used for training")
    parser.add_argument("--max-steps", type=int, default=None, metavar="M",
                        help="step limit per episode (default: the env's own, 1000 steps = 20 s at 50 FPS)")
    parser.add_argument("--headless", action="store_true",
                        help="no window (also chosen automatically when no display is available); "
                             "runs as fast as possible")
    parser.add_argument("--record", default=None, metavar="PATH",
                        help="write the composed view (frame + HUD) to this .mp4 (H.264, 50 FPS)")
    parser.add_argument("--scale", type=int, default=None,
                        help="upscale factor of the frame, nearest neighbour (default: 6 for CarRacing's 96x96, "
                             "2 for Udacity's 320x160)")
    parser.add_argument("--fps-limit", type=float, default=float(ENV_FPS),
                        help="frame-rate cap of the window, 50 = CarRacing's own rate; 0 = as fast as possible. "
                             "Headless runs are never limited (default: %(default)g)")
    ud = parser.add_argument_group("udacity", "the bridge the Udacity simulator connects to (socket.io)")
    ud.add_argument("--host", default="127.0.0.1",
                    help="interface to listen on; the loopback default means nobody on the network can steer "
                         "the car (default: %(default)s)")
    ud.add_argument("--port", type=int, default=4567,
                    help="TCP port; the simulator always connects to 4567 (default: %(default)s)")
    ud.add_argument("--target-speed", type=float, default=15.0, metavar="MPH",
                    help="cruise speed of the throttle controller, mph (default: %(default)s)")
    ud.add_argument("--connect-timeout", type=float, default=300.0, metavar="S",
                    help="seconds to wait for the simulator to connect (default: %(default)s)")
    ov = parser.add_argument_group("overlays", "live interpretability: Grad-CAM saliency over the frame and the "
                                    "NAC neuron traces (phi, omega, logits, weights, NCP neuron groups) in the "
                                    "right panel. Keys in the window: P/space pause, N/. single step, S saliency, "
                                    "T traces, H next head, [ and ] heat-map opacity, R restart the episode, "
                                    "Q/Esc quit")
    ov.add_argument("--no-overlay", action="store_true", help="no saliency, no traces, no panel (plain view)")
    ov.add_argument("--no-saliency", action="store_true", help="start with the Grad-CAM overlay off (not computed)")
    ov.add_argument("--no-traces", action="store_true", help="start without the NAC trace panel")
    ov.add_argument("--cam-opacity", type=float, default=0.5, metavar="A",
                    help="peak opacity of the Grad-CAM heat map, 0..1 (default: %(default)s)")
    ov.add_argument("--dump-traces", default=None, metavar="PATH",
                    help="write every step's NAC traces (phi, omega, logits, weights, kept keys, neuron groups), "
                         "actions and rewards to this .npz; plot them with `agent plot-traces`")


# ---------------------------------------------------------------------------------------- view
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
    """

    HUD_HEIGHT = 200
    MIN_LEFT_WIDTH = 480  # the HUD needs this much even when the frame is small
    MIN_PANEL_HEIGHT = 744  # the trace panel's plots and strips fit (the HUD grows to match)

    def __init__(self, frame_size: tuple[int, int] = (96, 96), scale: int = 6,
                 action_names: tuple[str, ...] = DEFAULT_ACTION_NAMES, policy_label: str = "",
                 show_probs: bool = True, panel_width: int = 420, help_text: str = "", steering: bool = False,
                 speed_unit: str = ""):
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
        self._text_cache: dict[tuple[int, str, tuple], Any] = {}
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
            bg.blit(self.font_small.render("steering (normalised, 1 = 25 deg)", True, _DIM), (self._bars_x, header_y))
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

    def _text(self, font, s: str, color=_TEXT):
        """Rendered text, cached (the HUD repeats a small set of strings)."""
        key = (id(font), s, color)
        surf = self._text_cache.get(key)
        if surf is None:
            if len(self._text_cache) > 4096:
                self._text_cache.clear()
            surf = self._text_cache[key] = font.render(s, True, color)
        return surf

    # ------------------------------------------------------------------ per step
    def compose(self, view: StepView):
        """Draw ``view`` onto the canvas and return it (the same Surface every call)."""
        pg = self.pygame
        c = self.canvas
        c.blit(self.background, (0, 0))
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

    def _draw_hud(self, v: StepView) -> None:
        pg = self.pygame
        c = self.canvas
        x, y, lh = self._text_x, self._text_y, self.line_h
        if self.steering:
            name = STEERING_CLASSES[steering_class(v.steering)] if v.steering is not None else "-"
        else:
            name = self.action_names[v.action] if v.action is not None and 0 <= v.action < len(self.action_names) \
                else "-"
        c.blit(self._text(self.font_big, name.upper(), _ACCENT), (x, y))
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
        if v.paused:
            c.blit(self._text(self.font_big, "PAUSED", _ACCENT), (x + 150, self._text_y))
        if v.status:
            c.blit(self._text(self.font_small, v.status, _DIM), (x, self.hud_rect.bottom - 64))
        if self.steering and v.steering is not None:
            w, cx = self._gauge_w, self._bars_x + self._gauge_w // 2
            s = float(np.clip(v.steering, -1.0, 1.0))
            px = int(round(s * w / 2))
            pg.draw.rect(c, _BAR_TAKEN, (min(cx, cx + px), self._bars_y + 8, max(abs(px), 2), self._bar_h))
            label = self._text(self.font_small, f"{s:+.3f}  ({25 * s:+.1f} deg)")
            c.blit(label, (cx - label.get_width() // 2, self._bars_y + 30))
            if v.throttle is not None:
                th = float(np.clip(v.throttle, -1.0, 1.0))
                tw = int(round(abs(th) * w))
                if tw:
                    pg.draw.rect(c, _BAR if th >= 0 else (235, 90, 80), (self._bars_x, self._bars_y + 80, tw, self._bar_h))
                c.blit(self._text(self.font_small, f"{th:+.2f}"), (self._bars_x + 64, self._bars_y + 62))
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


# ---------------------------------------------------------------------------------------- acting
@dataclass
class Decision:
    """One control step's decision and what the overlays need to explain it.

    Attributes:
        action: what the env is given: a discrete action index (int), or an array for a
            continuous action space (normalised steering for Udacity).
        action_class: the class that colours the traces (the action index; for steering
            0 straight, 1 left, 2 right).
        probs: (A,) action probabilities, or None.
        output: the policy's raw output for this frame, (1, A) logits or (1, 1) steering; None
            for policies without one (the expert).
        state_before, state: the policy state given to and returned by ``step``.
        t: (1,) the timestamp given to the policy in seconds, or None.
        intermediates: the NAC intermediates of this step, or None.
    """

    action: Any
    action_class: int = 0
    probs: np.ndarray | None = None
    output: Any = None
    state_before: Any = None
    state: Any = None
    t: Any = None
    intermediates: Any = None


class _Driver:
    """Chooses actions for the runner and exposes what the HUD shows about the decision."""

    label = "policy"
    has_probs = False
    traces_reason = "the policy has no NAC layer (no intermediates to trace)"

    def reset(self) -> None: ...

    def act(self, obs: np.ndarray, env, info: dict | None = None) -> Decision:
        raise NotImplementedError


class _NACDriver(_Driver):
    """Any policy with ``step(obs, state, return_intermediates, t)`` and an ``output_kind``."""

    def __init__(self, policy, name: str):
        import torch

        self.policy, self.state, self.torch = policy, None, torch
        self.kind = getattr(policy, "output_kind", "discrete")
        self.has_probs = self.kind == "discrete"
        self.want_intermediates = False
        self.traces_reason = None
        self.label = f"NAC policy {name} (window {policy.config.window})"

    def reset(self) -> None:
        self.state = None

    def act(self, obs, env, info=None):
        torch = self.torch
        x = torch.from_numpy(np.array(obs, dtype=np.uint8)).to(self.policy.device)[None]  # a writable copy
        t = None
        if info is not None and "time_s" in info:
            t = torch.tensor([float(info["time_s"])], dtype=torch.float64, device=x.device)
        before = self.state
        if self.policy.training:
            self.policy.eval()
        out, self.state = self.policy.step(x, before, return_intermediates=self.want_intermediates, t=t)
        inter = self.state.last.get("intermediates") if self.want_intermediates else None
        if self.want_intermediates and inter is None and self.traces_reason is None:
            self.traces_reason = f"{type(self.policy).__name__}.step returns no NAC intermediates"
            self.want_intermediates = False
        if self.kind == "discrete":
            probs = torch.softmax(out[0].float(), -1).cpu().numpy()
            a = int(out[0].argmax())
            return Decision(a, a, probs, out, before, self.state, t, inter)
        steer = float(out.reshape(-1)[0].clamp(-1, 1))
        return Decision(np.array([steer], np.float32), steering_class(steer), None, out, before, self.state, t, inter)


class _ActorDriver(_Driver):
    def __init__(self, actor, label: str):
        self.actor, self.label = actor, label

    def reset(self) -> None:
        self.actor.reset()

    def act(self, obs, env, info=None):
        a = int(self.actor.act(obs, env))
        return Decision(a, a)


def _make_driver(policy, name: str) -> _Driver:
    from agent.train.expert import ExpertPolicy
    from agent.loading import make_actor

    if callable(getattr(policy, "step", None)) and hasattr(policy, "config") and not isinstance(policy, ExpertPolicy):
        return _NACDriver(policy, name)
    label = "expert (privileged state)" if isinstance(policy, ExpertPolicy) else f"policy {name}"
    return _ActorDriver(make_actor(policy), label)


# ---------------------------------------------------------------------------------------- overlays
class Overlays:
    """The live interpretability of one run: Grad-CAM saliency and NAC neuron traces.

    Built once per run. Saliency needs a policy with the CNN saliency hooks; traces need NAC
    intermediates from the policy's ``step``. When either is impossible it stays off and
    :attr:`reasons` says why (the runner prints it). Toggles (keys S and T) switch the work off,
    not just the drawing.

    Args:
        policy: the loaded policy (any kind).
        driver: the runner's driver for it.
        renderer: where the drawers go (None: nothing is shown; traces may still be dumped).
        saliency, traces: whether to try each.
        dump: keep every step's traces for ``--dump-traces``.
        opacity: initial heat-map opacity (0..1).
        class_names: names of the action classes.
    """

    def __init__(self, policy, driver: _Driver, renderer: "Renderer | None", *, saliency: bool, traces: bool,
                 dump: bool = False, opacity: float = 0.5, class_names: tuple[str, ...] = DEFAULT_ACTION_NAMES):
        self.reasons: dict[str, str] = {}
        self.saliency = None
        self.saliency_drawer = None
        self.history = self.panel = self.recorder = None
        self.class_names = tuple(class_names)
        self.topk = getattr(getattr(policy, "nac", None), "topk", None)
        nac_driver = isinstance(driver, _NACDriver)
        if saliency and renderer is not None:
            from agent.drive.overlays import SaliencyDrawer
            from agent.drive.saliency import SaliencyOverlay, saliency_unavailable_reason

            reason = saliency_unavailable_reason(policy) if nac_driver else \
                f"{driver.label} acts without a CNN on the frame"
            if reason:
                self.reasons["saliency"] = reason
            else:
                self.saliency = SaliencyOverlay(policy, tuple(getattr(policy.config, "action_names", ())))
                self.saliency_drawer = SaliencyDrawer(opacity)
                renderer.frame_filters.append(self.saliency_drawer)
        if (traces and renderer is not None) or dump:
            if not nac_driver:
                self.reasons["traces"] = driver.traces_reason
            else:
                from agent.drive.traces import TraceHistory, TraceRecorder

                driver.want_intermediates = True
                if dump:
                    self.recorder = TraceRecorder()
                if traces and renderer is not None and renderer.panel_rect.width:
                    from agent.drive.overlays import TracePanel

                    size = renderer.panel_rect.size
                    self.history = TraceHistory(TracePanel.plot_width_for(size[0]))
                    self.panel = TracePanel(size, self.history, policy.config.num_heads, policy.config.window,
                                            self.class_names)
                    renderer.panels.append(self.panel)
        self.driver = driver

    # ------------------------------------------------------------------ toggles
    @property
    def saliency_on(self) -> bool:
        return self.saliency_drawer is not None and self.saliency_drawer.enabled

    def toggle_saliency(self) -> None:
        if self.saliency_drawer is not None:
            self.saliency_drawer.enabled = not self.saliency_drawer.enabled

    def toggle_traces(self) -> None:
        if self.panel is not None:
            self.panel.enabled = not self.panel.enabled

    def next_head(self) -> None:
        if self.panel is not None:
            self.panel.next_head()

    def adjust_opacity(self, delta: float) -> None:
        if self.saliency_drawer is not None:
            self.saliency_drawer.adjust(delta)

    def new_episode(self) -> None:
        if self.history is not None:
            self.history.clear()

    # ------------------------------------------------------------------ per step
    def explain(self, obs: np.ndarray, d: Decision, extras: dict) -> str:
        """Compute this step's overlays into ``extras``; returns the status line for the HUD."""
        status = []
        if self.saliency is not None:
            if self.saliency_on and d.output is not None:
                sal = self.saliency.compute(obs, d.state_before, d.output, d.t)
                extras["saliency"] = sal
                status.append(f"Grad-CAM: {sal.target}, {1000 * sal.seconds:.1f} ms, opacity "
                              f"{self.saliency_drawer.opacity:.1f}")
            else:
                self.saliency.discard()  # the hooks saw the policy's own step; keep nothing
                status.append("Grad-CAM off")
        if d.intermediates is not None:
            cache = getattr(d.state, "cache", None)
            tr = step_traces(d.intermediates, 0, cache.length - 1 if cache is not None else None, self.topk)
            extras["traces"] = tr
            if self.history is not None and self.panel.enabled:
                self.history.push(tr, d.action_class)
        if self.panel is not None and self.driver.traces_reason:
            self.panel.note = f"traces off: {self.driver.traces_reason}"
        return "   ".join(status)

    def record(self, extras: dict, d: Decision, reward: float, episode: int, step: int, time_s: float) -> None:
        if self.recorder is not None and "traces" in extras:
            action = d.action if np.isscalar(d.action) else float(np.asarray(d.action).reshape(-1)[0])
            self.recorder.add(extras["traces"], action=action, action_class=d.action_class, reward=reward,
                              episode=episode, step=step, time_s=time_s)

    def close(self) -> None:
        """Release Grad-CAM's hooks."""
        if self.saliency is not None:
            self.saliency.close()


# ---------------------------------------------------------------------------------------- window
_NO_WINDOW_DRIVERS = ("dummy", "offscreen")
HELP_TEXT = "P pause  N step  S saliency  T traces  H head  [ ] opacity  R restart  Q quit"


def _display_unavailable_reason() -> str | None:
    """Why no window can be opened, or None if one probably can."""
    driver = os.environ.get("SDL_VIDEODRIVER", "").lower()
    if driver in _NO_WINDOW_DRIVERS:
        return f"SDL_VIDEODRIVER={driver}"
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return "no display (DISPLAY and WAYLAND_DISPLAY are unset)"
    return None


class _Window:
    """The pygame window: shows composed Surfaces, handles events through :attr:`keys`.

    ``keys`` maps a pygame key code to a callable (the runner adds its controls).

    Raises:
        pygame.error: the display could not be opened (or SDL fell back to a driver without a window).
    """

    def __init__(self, size: tuple[int, int], caption: str, fps_limit: float):
        import pygame

        self.pygame = pygame
        pygame.display.init()
        try:
            driver = pygame.display.get_driver()
            if driver in _NO_WINDOW_DRIVERS:  # SDL falls back to "offscreen" silently when X11/Wayland fail
                raise pygame.error(f"SDL found no display (video driver {driver!r})")
            self.screen = pygame.display.set_mode(size)
        except pygame.error:
            pygame.display.quit()
            raise
        pygame.display.set_caption(caption)
        self.clock = pygame.time.Clock()
        self.fps_limit = fps_limit
        self.quit_requested = False
        self.keys: dict[int, Callable[[], None]] = {pygame.K_ESCAPE: self.request_quit, pygame.K_q: self.request_quit}

    def request_quit(self) -> None:
        self.quit_requested = True

    def poll(self) -> None:
        pg = self.pygame
        for event in pg.event.get():
            if event.type == pg.QUIT:
                self.request_quit()
            elif event.type == pg.KEYDOWN:
                handler = self.keys.get(event.key)
                if handler is not None:
                    handler()

    def present(self, canvas) -> None:
        self.screen.blit(canvas, (0, 0))
        self.pygame.display.flip()
        if self.fps_limit > 0:
            self.clock.tick(self.fps_limit)

    def close(self) -> None:
        self.pygame.display.quit()


# ---------------------------------------------------------------------------------------- video
class _VideoWriter:
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


# ---------------------------------------------------------------------------------------- run
def _check_args(args) -> str | None:
    if args.env not in ENVS:
        return f"--env {args.env!r} is not supported (choices: {', '.join(ENVS)})"
    if args.episodes < 1:
        return f"--episodes must be >= 1, got {args.episodes}"
    if args.max_steps is not None and args.max_steps < 1:
        return f"--max-steps must be >= 1, got {args.max_steps}"
    if args.scale is not None and args.scale < 1:
        return f"--scale must be >= 1, got {args.scale}"
    if args.env == "udacity" and not (0 <= args.port < 65536):
        return f"--port must be in 0..65535, got {args.port}"
    if args.env == "udacity" and (args.target_speed <= 0 or args.connect_timeout <= 0):
        return "--target-speed and --connect-timeout must be > 0"
    if args.fps_limit < 0:
        return f"--fps-limit must be >= 0, got {args.fps_limit}"
    if args.record is not None and Path(args.record).suffix.lower() != ".mp4":
        return f"--record writes an mp4 video; give a path ending in .mp4, got {args.record!r}"
    if not 0.0 <= args.cam_opacity <= 1.0:
        return f"--cam-opacity must be in 0..1, got {args.cam_opacity}"
    if args.dump_traces is not None and Path(args.dump_traces).suffix.lower() != ".npz":
        return f"--dump-traces writes a .npz file; give a path ending in .npz, got {args.dump_traces!r}"
    return None


def _err(msg: str) -> None:
    print(f"drive: error: {msg}", file=sys.stderr)


def run_drive(args: argparse.Namespace) -> int:
    """Drive ``args.episodes`` episodes with ``args.policy``; print per-episode and mean returns.

    ``args`` holds the options of :func:`add_drive_arguments`. Returns the exit code: 0 (done, or
    the window was closed / Escape / Q), 2 (bad options or policy file: a message on stderr), 130
    (Ctrl-C; the video and the traces so far are still written).
    """
    problem = _check_args(args)
    if problem:
        _err(problem)
        return EXIT_ERROR
    from agent.loading import load_policy, resolve_policy_path

    try:
        path = resolve_policy_path(args.policy)
        policy = load_policy(path)
    except (FileNotFoundError, ValueError) as exc:
        _err(str(exc))
        return EXIT_ERROR

    headless = bool(args.headless)
    if not headless:
        reason = _display_unavailable_reason()
        if reason:
            print(f"drive: note: {reason}; running headless (no window)", file=sys.stderr)
            headless = True
    if headless:
        import pygame

        if not pygame.display.get_init():
            os.environ["SDL_VIDEODRIVER"] = "dummy"  # never open a window, even if something inits the display
    try:
        session = DriveSession(args, policy, path.name, headless=headless)
    except (ValueError, OSError) as exc:  # a policy for another simulator; the port is taken
        _err(str(exc))
        return EXIT_ERROR
    try:
        where = (f"tracks {args.seed}..{args.seed + args.episodes - 1}" if args.env == "carracing" else
                 f"serving {session.env.unwrapped.url}: start the simulator and choose Autonomous mode")
        print(f"policy {path} ({session.driver.label}); env {args.env}; {where}"
              f"{'; headless' if session.window is None else ''}"
              f"{f'; recording {args.record}' if session.writer else ''}", flush=True)
        return session.run()
    except TimeoutError as exc:  # no simulator connected
        _err(str(exc))
        return EXIT_ERROR
    finally:
        session.close()


class DriveSession:
    """One ``drive`` run: env, policy driver, overlays, renderer, window and video, and the loop.

    Args:
        args: the ``drive`` options (:func:`add_drive_arguments`).
        policy: the loaded policy; ``name`` labels it.
        headless: no window.
        force_draw: compose every frame even without a window or video (the FPS benchmark).

    Attributes:
        step_seconds: wall time of each loop step (act + overlays + drawing + env step), seconds.
        latency_seconds: observation-to-action time of each step (policy + overlays), seconds.
    """

    def __init__(self, args, policy, name: str, headless: bool, force_draw: bool = False):
        import torch

        from envs.carracing import ACTION_NAMES

        self.args = args
        policy_env = getattr(getattr(policy, "config", None), "env", "carracing")
        if policy_env != args.env:
            raise ValueError(f"{name} is a {policy_env} policy; drive it with --env {policy_env} "
                             f"(or choose a {args.env} policy)")
        self.driver = _make_driver(policy, name)
        self.env = self._make_env(args)
        self.env_fps = int(self.env.metadata.get("render_fps", ENV_FPS))
        obs_shape = self.env.observation_space.shape  # (H, W, C)
        names = tuple(getattr(getattr(policy, "config", None), "action_names", ACTION_NAMES))
        discrete = getattr(policy, "output_kind", "discrete") == "discrete"
        self.class_names = names if discrete else STEERING_CLASSES
        scale = args.scale or DEFAULT_SCALE[args.env]
        # One frame at a time: intra-op threads only add synchronisation (with 2 threads on a busy 2-core
        # machine a NAC step took 40 ms instead of 1.5 ms), so act single-threaded; restored at close().
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.window = self.writer = self.renderer = None
        overlay = not args.no_overlay
        draw = force_draw or not headless or args.record is not None
        if draw:
            self.renderer = Renderer((obs_shape[1], obs_shape[0]), scale=scale, action_names=names,
                                     policy_label=self.driver.label, show_probs=self.driver.has_probs,
                                     panel_width=420 if overlay else 0,
                                     help_text=HELP_TEXT if not headless else "", steering=not discrete,
                                     speed_unit="mph" if args.env == "udacity" else "")
        if not headless:
            try:
                self.window = _Window(self.renderer.size, f"drive - {self.driver.label}", args.fps_limit)
            except Exception as exc:  # pygame.error, or a broken video driver
                print(f"drive: note: cannot open a window ({exc}); running headless", file=sys.stderr)
                os.environ["SDL_VIDEODRIVER"] = "dummy"
                if args.record is None and not force_draw:
                    self.renderer = None  # nothing would show the drawing
        if args.record is not None:
            self.writer = _VideoWriter(Path(args.record), self.renderer.size, fps=self.env_fps)
        self.overlays = Overlays(policy, self.driver, self.renderer, saliency=overlay and not args.no_saliency,
                                 traces=overlay and not args.no_traces, dump=args.dump_traces is not None,
                                 opacity=args.cam_opacity, class_names=self.class_names)
        for what, why in self.overlays.reasons.items():
            print(f"drive: note: {what} overlay off: {why}", file=sys.stderr)
        self.paused = self.single_step = self.restart_requested = False
        if self.window is not None:
            pg = self.window.pygame
            self.window.keys.update({
                pg.K_p: self.toggle_pause, pg.K_SPACE: self.toggle_pause, pg.K_n: self.request_step,
                pg.K_PERIOD: self.request_step, pg.K_s: self.overlays.toggle_saliency,
                pg.K_t: self.overlays.toggle_traces, pg.K_h: self.overlays.next_head,
                pg.K_LEFTBRACKET: lambda: self.overlays.adjust_opacity(-0.1),
                pg.K_RIGHTBRACKET: lambda: self.overlays.adjust_opacity(+0.1),
                pg.K_r: self.request_restart})
        self.step_seconds: list[float] = []
        self.latency_seconds: list[float] = []

    @staticmethod
    def _make_env(args):
        """CarRacing (one episode per track seed) or the Udacity bridge (started at once, so its
        address is known; an episode lasts until the simulator disconnects or --max-steps)."""
        if args.env == "udacity":
            from gymnasium.wrappers import TimeLimit

            from envs.udacity.bridge import UdacityEnv

            env = UdacityEnv(host=args.host, port=args.port, target_speed=args.target_speed,
                             connect_timeout=args.connect_timeout)
            env.start()
            return TimeLimit(env, args.max_steps) if args.max_steps else env
        from envs.carracing import EPISODE_STEPS, make_carracing

        return make_carracing(max_episode_steps=args.max_steps or EPISODE_STEPS)

    # ------------------------------------------------------------------ keys
    def toggle_pause(self) -> None:
        self.paused = not self.paused

    def request_step(self) -> None:
        """Advance one step; pauses the run first if it was running."""
        if self.paused:
            self.single_step = True
        else:
            self.paused = True

    def request_restart(self) -> None:
        self.restart_requested = True

    @property
    def _quit(self) -> bool:
        return self.window is not None and self.window.quit_requested

    # ------------------------------------------------------------------ loop
    def play_episode(self, seed: int, episode: int) -> tuple[str, float, int]:
        """Drive one episode on track ``seed``; returns (how it ended, return, steps).

        Ends with "done" (terminated or truncated), "quit" (window closed, Escape, Q) or "restart" (R).
        """
        env, driver, renderer, window, ov = self.env, self.driver, self.renderer, self.window, self.overlays
        args = self.args
        obs, info = env.reset(seed=int(seed))
        driver.reset()
        ov.new_episode()
        ep_return, steps = 0.0, 0
        ticks: deque[float] = deque(maxlen=26)
        ticks.append(time.perf_counter())
        while True:
            t0 = time.perf_counter()
            speed = float(info["speed_mph"]) if "speed_mph" in info else float(getattr(env.unwrapped, "speed", 0.0))
            d = driver.act(obs, env, info)
            extras: dict = {}
            status = ov.explain(obs, d, extras)
            latency = time.perf_counter() - t0
            if renderer is not None:
                fps = (len(ticks) - 1) / (ticks[-1] - ticks[0]) if len(ticks) > 1 and ticks[-1] > ticks[0] else 0.0
                view = StepView(frame=obs, step=steps + 1, action=d.action if np.isscalar(d.action) else None,
                                probs=d.probs, speed=speed, episode_return=ep_return, fps=fps, seed=seed,
                                episode=episode, episodes=args.episodes, policy_state=d.state, extras=extras,
                                latency_ms=1000 * latency, status=status,
                                steering=None if np.isscalar(d.action) else float(np.asarray(d.action).reshape(-1)[0]),
                                throttle=info.get("throttle_command", info.get("throttle")))
                canvas = renderer.compose(view)
                if self.writer is not None:
                    self.writer.append(renderer.to_rgb())
                if window is not None:
                    window.present(canvas)
                    window.poll()
                    if self.paused:
                        self._wait_while_paused(view)
            obs, reward, terminated, truncated, info = env.step(d.action)
            steps += 1
            ov.record(extras, d, float(reward), episode, steps, float(info.get("time_s", steps / self.env_fps)))
            ep_return += float(reward)
            now = time.perf_counter()
            ticks.append(now)
            self.step_seconds.append(now - t0)
            self.latency_seconds.append(latency)
            if terminated or truncated:
                return "done", ep_return, steps
            if self._quit:
                return "quit", ep_return, steps
            if self.restart_requested:
                self.restart_requested = False
                return "restart", ep_return, steps

    def _wait_while_paused(self, view: StepView) -> None:
        window, renderer = self.window, self.renderer
        view.paused = True
        canvas = renderer.compose(view)
        while self.paused and not (self.single_step or self._quit or self.restart_requested):
            window.present(canvas)
            window.poll()
            time.sleep(1 / 30)
        self.single_step = False

    def run(self) -> int:
        """All episodes; prints each return and the mean. Returns the exit code."""
        args = self.args
        returns: list[float] = []
        ep, code = 0, EXIT_OK
        ep_return, steps = 0.0, 0
        try:
            while ep < args.episodes:
                seed = args.seed + ep
                t0 = time.perf_counter()
                how, ep_return, steps = self.play_episode(seed, ep + 1)
                dt = time.perf_counter() - t0
                note = {"quit": "  (stopped)", "restart": "  (restarted)"}.get(how, "")
                print(f"episode {ep + 1}/{args.episodes}  seed {seed}  return {ep_return:8.1f}  steps {steps:4d}  "
                      f"mean FPS {steps / max(dt, 1e-9):6.1f}{note}", flush=True)
                if how == "quit":
                    break
                if how == "restart":
                    continue
                returns.append(ep_return)
                ep += 1
        except KeyboardInterrupt:
            print(f"\ninterrupted: episode {ep + 1} stopped after {steps} steps", flush=True)
            code = EXIT_INTERRUPTED
        if returns:
            print(f"mean return over {len(returns)} episode{'s' if len(returns) != 1 else ''}: "
                  f"{float(np.mean(returns)):.1f} (std {float(np.std(returns)):.1f})", flush=True)
        else:
            print("no episode finished", flush=True)
        return code

    def close(self) -> None:
        """Finalise the video and the trace dump, release Grad-CAM's hooks, close the window and env."""
        import torch

        try:
            if self.writer is not None:
                self.writer.close()  # finalises the mp4, also after Ctrl-C
                print(f"wrote {self.writer.path} ({self.writer.frames} frames, "
                      f"{self.writer.frames / self.env_fps:.1f} s at {self.env_fps} FPS)")
            rec = self.overlays.recorder
            if rec is not None:
                if len(rec):
                    from agent.drive.traces import save_traces

                    names = tuple(getattr(self.driver.policy.config, "action_names", ()))
                    out = save_traces(self.args.dump_traces, rec, action_names=names, class_names=self.class_names,
                                      policy=self.driver.label, env=self.args.env)
                    print(f"wrote {out} (NAC traces of {len(rec)} steps)")
                else:
                    why = getattr(self.driver, "traces_reason", None) or "no step ran"
                    print(f"drive: note: no NAC traces to dump ({why})", file=sys.stderr)
        finally:
            self.overlays.close()
            if self.window is not None:
                self.window.close()
            self.env.close()
            torch.set_num_threads(self._threads)


__all__ = ["Decision", "DriveSession", "FrameFilter", "Overlays", "PanelDrawer", "Renderer", "StepView", "add_drive_arguments",
           "run_drive", "steering_class"]
