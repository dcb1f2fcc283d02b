"""The pygame window of a ``drive`` run (:class:`Window`) and whether one can be opened at all
(:func:`display_unavailable_reason`).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

_NO_WINDOW_DRIVERS = ("dummy", "offscreen")
#: SDL's hint (an environment variable, read when the window surface is created) that picks how the
#: window's pixels reach the screen. On X11 :class:`Window` sets it to "0" unless it is set already:
#: SDL then sends the surface with the X server's shared-memory images (XShm) instead of uploading it
#: as an OpenGL texture each frame. Under Xvfb (Mesa's llvmpipe, OpenGL on the CPU) the texture path
#: cost about 10 ms and 4.5 ms of CPU per ``display.flip`` of a 996x776 window; XShm about 0.3 ms.
#: Set ``SDL_FRAMEBUFFER_ACCELERATION=1`` (or ``opengl``) to get SDL's own choice back.
FRAMEBUFFER_HINT = "SDL_FRAMEBUFFER_ACCELERATION"
HELP_TEXT = "P pause  N step  S saliency  T traces  H head  [ ] opacity  R restart  Q quit"


def display_unavailable_reason() -> str | None:
    """Why no window can be opened, or None if one probably can."""
    driver = os.environ.get("SDL_VIDEODRIVER", "").lower()
    if driver in _NO_WINDOW_DRIVERS:
        return f"SDL_VIDEODRIVER={driver}"
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return "no display (DISPLAY and WAYLAND_DISPLAY are unset)"
    return None


class FramePacer:
    """Holds a loop to ``fps`` frames per second on average: :meth:`wait` sleeps until the next
    frame's deadline, deadlines ``1 / fps`` seconds apart.

    A frame that took longer than its period is made up by shortening the following waits, so
    the mean rate stays ``fps`` as long as the loop's mean period is shorter than ``1 / fps``.
    pygame's ``Clock.tick(fps)`` pads each frame to the period from the previous tick and never
    makes up a late one, so its mean rate falls below ``fps`` whenever frame times vary: the
    ``drive`` loop, 17.6 ms p50 and 24.5 ms p99 with every overlay on, showed 43.5 FPS under
    ``tick(50)`` while it could run at 51-55 unlimited. The deadlines do not run ahead of the
    clock by more than ``max_behind_frames`` periods: after a long stall (a pause, a window being
    dragged) the loop does not race to catch up, it starts again from the current time.

    Args:
        fps: frames per second (> 0).
        max_behind_frames: how many periods a late loop may make up.
        clock, sleep: the time source in seconds and the sleep function (``time.perf_counter``
            and ``time.sleep``; tests pass a fake clock).

    Raises:
        ValueError: ``fps`` <= 0 or ``max_behind_frames`` < 0.
    """

    def __init__(self, fps: float, max_behind_frames: float = 2.0, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep):
        if not fps > 0:
            raise ValueError(f"FramePacer needs fps > 0, got {fps}")
        if max_behind_frames < 0:
            raise ValueError(f"max_behind_frames must be >= 0, got {max_behind_frames}")
        self.period, self.max_behind = 1.0 / float(fps), float(max_behind_frames) / float(fps)
        self.clock, self.sleep = clock, sleep
        self.deadline: float | None = None

    def reset(self) -> None:
        """Forget the schedule: the next :meth:`wait` starts a new one from the current time."""
        self.deadline = None

    def start(self) -> None:
        """Start the schedule now: the first frame is due one period from now, so a slow first frame
        (the first Grad-CAM and drawing, about 35 ms longer) is made up like any late one."""
        self.deadline = self.clock()

    def wait(self) -> None:
        """Sleep until the next frame is due (at once if it is due already)."""
        now = self.clock()
        if self.deadline is None:
            self.deadline = now
        self.deadline += self.period
        if self.deadline > now:
            self.sleep(self.deadline - now)
        elif now - self.deadline > self.max_behind:
            self.deadline = now - self.max_behind


class Window:
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
            if driver == "x11":
                os.environ.setdefault(FRAMEBUFFER_HINT, "0")  # read by SDL when the window surface is made
            self.framebuffer_acceleration = os.environ.get(FRAMEBUFFER_HINT)
            self.screen = pygame.display.set_mode(size)
        except pygame.error:
            pygame.display.quit()
            raise
        pygame.display.set_caption(caption)
        self.fps_limit = fps_limit
        self.pacer = FramePacer(fps_limit) if fps_limit > 0 else None
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
        if self.pacer is not None:
            self.pacer.wait()

    def close(self) -> None:
        self.pygame.display.quit()


__all__ = ["HELP_TEXT", "FramePacer", "Window", "display_unavailable_reason"]
