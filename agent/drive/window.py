"""The pygame window of a ``drive`` run (:class:`Window`) and whether one can be opened at all
(:func:`display_unavailable_reason`).
"""

from __future__ import annotations

import os
import sys
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


__all__ = ["HELP_TEXT", "Window", "display_unavailable_reason"]
