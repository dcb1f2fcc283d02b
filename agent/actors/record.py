"""Recording demonstrations: an actor drives one env, episode after episode, into a Minari dataset.

:func:`collect` rolls out (:func:`agent.actors.rollout.rollout`) and writes each finished episode
with :class:`agent.data.recordings.RecordingWriter`; :class:`KeyboardActor` lets a person drive
(``agent collect --keyboard``). :func:`agent.actors.vector.collect` does the same on several envs
at once.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import numpy as np

from agent.actors.rollout import Actor, Decision, rollout
from agent.data.recordings import RecordingWriter
from agent.log import get_logger, progress as progress_bar

_log = get_logger(__name__)


class StopRequest:
    """Ctrl-C (SIGINT) and SIGTERM as a request to stop that cannot be lost.

    While active (``with StopRequest() as stop:``, main thread only; elsewhere it does nothing),
    either signal records the request and raises KeyboardInterrupt. Python cannot raise that
    exception out of a finaliser or a weakref callback (it prints "Exception ignored in ..." and
    goes on), so :meth:`check`, called after every step and episode, raises it again from plain
    code: a Ctrl-C stops the loop within a step whatever it interrupted. The handlers in place
    before are restored at the end.
    """

    def __init__(self):
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def _handle(self, signum, frame):
        self.signum = signum
        raise KeyboardInterrupt

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        self._old = {}

    def check(self, *args) -> None:
        """Raise KeyboardInterrupt if a stop was requested (any arguments are ignored: a rollout's ``on_step``)."""
        if self.signum is not None:
            raise KeyboardInterrupt


def collect(env, actor: Actor, episodes: int, seed: int, out: str | Path, algorithm_name: str,
            overwrite: bool = False, max_steps: int | None = None, progress: bool = True,
            description: str | None = None) -> RecordingWriter:
    """Record ``episodes`` episodes on tracks seed, seed+1, ... with ``actor`` acting.

    ``out`` is a dataset folder ``ROOT/<namespace>/<name>-v<N>`` (see :func:`dataset_layout`).
    The actions stored are what ``env`` takes (its action space is the dataset's): discrete
    indices, or (steering, throttle) float32 pairs for the continuous configuration.
    ``description`` is the dataset's Minari description (default: who drove).
    Ctrl-C or SIGTERM stops after saving every finished episode (``.interrupted`` is then set;
    Escape in :class:`KeyboardActor`'s window stops the same way without it); the episode in
    progress is dropped. An
    episode being written when the signal comes is finished first
    (:class:`agent.data.recordings.RecordingWriter`), and the request is never lost
    (:class:`StopRequest`). The progress bar (stderr) draws only on a terminal or with
    ``NAC_PROGRESS=1`` (:func:`agent.log.progress`).
    Returns the writer (``.episodes`` and ``.steps`` say what was saved, ``.dataset_id`` its id).

    Raises:
        RecordingError: ``out`` is not a dataset path, or is in the way (see :class:`RecordingWriter`).
        OSError: a write failed (a full disk: errno ENOSPC); one message naming the file and the
            finished episodes kept, which stay readable. Nothing is written after it.
    """
    writer = RecordingWriter(out, env, algorithm_name, overwrite=overwrite, description=description)
    bar = progress_bar(total=episodes, desc="episodes", unit="ep", disable=not progress)
    with StopRequest() as stop:
        try:
            for e in range(episodes):
                stop.check()
                ep = rollout(env, actor, seed + e, max_steps=max_steps, on_step=stop.check)
                writer.add(ep)
                bar.update(1)
                bar.set_postfix(ret=f"{ep.episode_return:.0f}", steps=ep.steps)
                _log.debug("episode %d (track %d): return %.1f, %d steps", e, seed + e, ep.episode_return, ep.steps)
            stop.check()
        except KeyboardInterrupt:  # a signal, or the person's Escape (KeyboardActor: a chosen stop)
            writer.interrupted = stop.signum is not None
            _log.warning("interrupted: kept %d finished episode(s) in %s", writer.episodes, writer.out)
        finally:
            bar.close()
    return writer


class KeyboardActor:
    """A person drives with the arrow keys in a pygame window (up gas, down brake, left, right).

    The window shows the frame the student sees, scaled up. Escape or closing the window raises
    KeyboardInterrupt, which :func:`collect` treats as "stop and keep finished episodes".

    Raises:
        RuntimeError: when no display is available.
    """

    def __init__(self, scale: int = 6, fps: int = 50):
        import pygame

        try:
            pygame.display.init()
            self.screen = pygame.display.set_mode((96 * scale, 96 * scale))
        except pygame.error as exc:
            raise RuntimeError(f"--keyboard needs a display ({exc}); set DISPLAY or run on a desktop") from exc
        pygame.display.set_caption("agent collect --keyboard: arrows drive, Esc stops")
        self.pygame, self.scale, self.clock, self.fps = pygame, scale, pygame.time.Clock(), fps

    label = "keyboard"
    has_probs = False
    traces_reason = "a person drives (no policy to trace)"

    def reset(self) -> None:
        pass

    def act(self, obs, env=None, info=None):
        """The person's action as an :class:`agent.actors.rollout.Decision` (0 nothing, 1 left, 2 right, 3 gas, 4 brake)."""
        a = self._keys(obs)
        return Decision(a, a)

    def _keys(self, obs) -> int:
        pg = self.pygame
        for event in pg.event.get():
            if event.type == pg.QUIT or (event.type == pg.KEYDOWN and event.key == pg.K_ESCAPE):
                raise KeyboardInterrupt
        surf = pg.surfarray.make_surface(np.ascontiguousarray(obs.transpose(1, 0, 2)))
        self.screen.blit(pg.transform.scale(surf, self.screen.get_size()), (0, 0))
        pg.display.flip()
        self.clock.tick(self.fps)
        keys = pg.key.get_pressed()
        if keys[pg.K_LEFT]:  # action 2 turns left, 1 right (envs.carracing.ACTION_NAMES)
            return 2
        if keys[pg.K_RIGHT]:
            return 1
        if keys[pg.K_UP]:
            return 3
        if keys[pg.K_DOWN]:
            return 4
        return 0


__all__ = ["KeyboardActor", "StopRequest", "collect"]
