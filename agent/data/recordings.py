"""Demonstration recordings as Minari datasets: write episode by episode, read back for training.

A recording folder ``recordings/NAME`` is a Minari dataset (``NAME/data/main_data.hdf5`` and
``metadata.json``), created with ``minari.create_dataset_from_buffers`` (no JAX needed) and
extended with ``update_dataset_from_buffer`` after every finished episode, so Ctrl-C or a crash
keeps every finished episode. Frames are stored losslessly (no JPEG), so the student trains on
exactly the pixels it will see.

Per step the dataset stores the 96x96x3 frame the student sees, the action executed (the
expert's, or the person's with ``--keyboard``), the reward, termination and truncation; the
episode's track seed is Minari's per-episode ``seed``; ``infos["speed"]`` holds the car speed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.rollout import Actor, Episode, rollout


class RecordingError(ValueError):
    """A recording folder that is missing, malformed, or in the way."""


def _dataset_id(name: str) -> str:
    base = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "recording"
    return f"{base}-v0"


class RecordingWriter:
    """Writes episodes to a Minari dataset at ``out`` one at a time.

    Args:
        out: the dataset folder to create.
        env: the env the episodes come from (its spec is stored).
        algorithm_name: who acted ("ppo-expert", "keyboard", ...).
        overwrite: replace an existing folder at ``out``.

    Raises:
        RecordingError: ``out`` exists and ``overwrite`` is False, or its parent is not a folder.
    """

    def __init__(self, out: str | Path, env, algorithm_name: str, overwrite: bool = False,
                 description: str | None = None):
        self.out = Path(out).absolute()  # Minari mangles relative dataset paths
        if self.out.exists() and not overwrite:
            raise RecordingError(f"{self.out} already exists; choose another --out or pass --overwrite")
        if self.out.parent.exists() and not self.out.parent.is_dir():
            raise RecordingError(f"{self.out.parent} is not a folder")
        self.env, self.algorithm_name, self.description = env, algorithm_name, description
        self.overwrite = overwrite
        self.dataset = None
        self.episodes = 0
        self.steps = 0

    @staticmethod
    def _buffer(ep: Episode):
        from minari.data_collector import EpisodeBuffer

        if ep.observations is None:
            raise RecordingError("an episode without frames cannot be recorded")
        return EpisodeBuffer(
            id=None, seed=ep.seed, observations=ep.observations, actions=ep.actions, rewards=ep.rewards,
            terminations=ep.terminations, truncations=ep.truncations, infos={"speed": ep.speeds},
        )

    def add(self, ep: Episode) -> None:
        """Append one finished episode (written to disk before this returns)."""
        import minari

        if self.dataset is None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.out.parent))
            old = os.environ.get("MINARI_DATASETS_PATH")
            os.environ["MINARI_DATASETS_PATH"] = str(staging)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # Minari's reminders about optional metadata
                    minari.create_dataset_from_buffers(
                        _dataset_id(self.out.name), [self._buffer(ep)], env=self.env, eval_env=self.env,
                        algorithm_name=self.algorithm_name, author="nac-drive", author_email="n/a",
                        code_permalink="n/a",
                        description=self.description or f"CarRacing demonstrations by {self.algorithm_name}",
                        jpeg_encoding=False, data_format="hdf5",
                    )
                if self.out.exists() and self.overwrite:
                    shutil.rmtree(self.out)
                (staging / _dataset_id(self.out.name)).replace(self.out)
            finally:
                if old is None:
                    os.environ.pop("MINARI_DATASETS_PATH", None)
                else:
                    os.environ["MINARI_DATASETS_PATH"] = old
                shutil.rmtree(staging, ignore_errors=True)
            self.dataset = minari.MinariDataset(self.out / "data")
        else:
            self.dataset.update_dataset_from_buffer([self._buffer(ep)])
        self.episodes += 1
        self.steps += ep.steps


@dataclass
class Demonstrations:
    """Episodes read back from a recording, ready for behaviour cloning.

    Attributes:
        frames: list of (N_e, H, W, C) uint8 arrays (the last frame of each episode dropped, so
            frames[e][i] is the observation on which actions[e][i] was taken).
        actions: list of (N_e,) int64 arrays.
        seeds: the track seed of each episode.
        returns: the episode return of each episode.
    """

    frames: list[np.ndarray]
    actions: list[np.ndarray]
    seeds: list[int]
    returns: list[float]

    def __post_init__(self):
        if not (len(self.frames) == len(self.actions) == len(self.seeds) == len(self.returns)):
            raise ValueError("frames, actions, seeds and returns need one entry per episode")
        for i, (f, a) in enumerate(zip(self.frames, self.actions)):
            if f.ndim != 4 or f.dtype != np.uint8 or len(f) != len(a):
                raise ValueError(f"episode {i}: frames {f.shape} {f.dtype} do not match {len(a)} actions")

    @property
    def n_frames(self) -> int:
        return sum(len(a) for a in self.actions)

    def subset(self, episodes: list[int]) -> "Demonstrations":
        """The given episodes (by index), in that order."""
        return Demonstrations([self.frames[i] for i in episodes], [self.actions[i] for i in episodes],
                              [self.seeds[i] for i in episodes], [self.returns[i] for i in episodes])

    def extend(self, other: "Demonstrations") -> "Demonstrations":
        return Demonstrations(self.frames + other.frames, self.actions + other.actions,
                              self.seeds + other.seeds, self.returns + other.returns)


def load_demonstrations(path: str | Path, n_actions: int | None = 5) -> Demonstrations:
    """Read every episode of a recording into memory.

    Raises:
        RecordingError: the folder is missing, is not a Minari dataset, holds no episodes, or
            holds actions outside [0, n_actions). Nothing is returned half-read.
    """
    from minari import MinariDataset

    path = Path(path)
    data = path / "data" if (path / "data").is_dir() else path
    if not path.exists():
        raise RecordingError(f"recording {path} does not exist (make one with `agent collect`)")
    if not (data / "metadata.json").is_file():
        raise RecordingError(f"{path} is not a Minari dataset (no data/metadata.json)")
    try:
        ds = MinariDataset(data)
        metas = list(ds.storage.get_episode_metadata(ds.episode_indices))
        frames, actions, seeds, returns = [], [], [], []
        for ep, meta in zip(ds.iterate_episodes(), metas):
            obs = np.asarray(ep.observations)
            act = np.asarray(ep.actions).astype(np.int64).reshape(-1)
            frames.append(obs[: len(act)])
            actions.append(act)
            seeds.append(int(meta.get("seed", -1)) if meta.get("seed") is not None else -1)
            returns.append(float(np.sum(ep.rewards)))
    except RecordingError:
        raise
    except Exception as exc:
        raise RecordingError(f"could not read recording {path}: {type(exc).__name__}: {exc}") from exc
    if not actions:
        raise RecordingError(f"recording {path} holds no episodes")
    if n_actions is not None:
        for i, a in enumerate(actions):
            if a.size and (a.min() < 0 or a.max() >= n_actions):
                raise RecordingError(f"{path}: episode {i} has actions outside 0..{n_actions - 1}")
    return Demonstrations(frames, actions, seeds, returns)


def collect(env, actor: Actor, episodes: int, seed: int, out: str | Path, algorithm_name: str,
            overwrite: bool = False, max_steps: int | None = None, progress: bool = True) -> RecordingWriter:
    """Record ``episodes`` episodes on tracks seed, seed+1, ... with ``actor`` acting.

    Ctrl-C stops after saving every finished episode; the episode in progress is dropped.
    Returns the writer (``.episodes`` and ``.steps`` say what was saved).
    """
    from tqdm.auto import tqdm

    writer = RecordingWriter(out, env, algorithm_name, overwrite=overwrite)
    bar = tqdm(total=episodes, desc="episodes", unit="ep", disable=not progress)
    try:
        for e in range(episodes):
            ep = rollout(env, actor, seed + e, max_steps=max_steps)
            writer.add(ep)
            bar.update(1)
            bar.set_postfix(ret=f"{ep.episode_return:.0f}", steps=ep.steps)
    except KeyboardInterrupt:
        bar.close()
        print(f"\ninterrupted: kept {writer.episodes} finished episode(s) in {writer.out}")
        return writer
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

    def reset(self) -> None:
        pass

    def act(self, obs, env) -> int:
        pg = self.pygame
        for event in pg.event.get():
            if event.type == pg.QUIT or (event.type == pg.KEYDOWN and event.key == pg.K_ESCAPE):
                raise KeyboardInterrupt
        surf = pg.surfarray.make_surface(np.ascontiguousarray(obs.transpose(1, 0, 2)))
        self.screen.blit(pg.transform.scale(surf, self.screen.get_size()), (0, 0))
        pg.display.flip()
        self.clock.tick(self.fps)
        keys = pg.key.get_pressed()
        if keys[pg.K_LEFT]:
            return 1
        if keys[pg.K_RIGHT]:
            return 2
        if keys[pg.K_UP]:
            return 3
        if keys[pg.K_DOWN]:
            return 4
        return 0
