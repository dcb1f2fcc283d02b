"""Running episodes: one loop shared by recording, DAgger and evaluation.

An *actor* chooses the action executed in the env; an optional *labeler* (the expert, in
DAgger) says what it would have done in each visited state. Episodes on seed s always use
track s (``env.reset(seed=s)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import gymnasium as gym
import numpy as np


class Actor(Protocol):
    """Chooses actions. ``reset`` is called at each episode start, ``act`` once per step."""

    def reset(self) -> None: ...

    def act(self, obs: np.ndarray, env: gym.Env) -> int: ...


class ExpertActor:
    """The PPO expert, acting from the env's privileged state (see :mod:`agent.train.expert`)."""

    def __init__(self, expert):
        self.expert = expert

    def reset(self) -> None:
        pass

    def act(self, obs, env) -> int:
        return self.expert.act(env)


class PolicyActor:
    """Any policy with ``predict(obs, state, episode_start, deterministic) -> (action, state)``."""

    def __init__(self, policy, deterministic: bool = True):
        self.policy, self.deterministic, self.state = policy, deterministic, None

    def reset(self) -> None:
        self.state = None

    def act(self, obs, env) -> int:
        action, self.state = self.policy.predict(obs, self.state, deterministic=self.deterministic)
        return int(action)


@dataclass
class Episode:
    """One finished (or cut short) episode. N = steps taken.

    Attributes:
        seed: the track seed.
        observations: (N + 1, H, W, C) uint8 frames (the student's view), or None if not kept.
        actions: (N,) int64, the actions executed.
        labels: (N,) int64, the labeler's action for each visited state, or None.
        rewards: (N,) float32.
        terminations, truncations: (N,) bool.
        speeds: (N + 1,) float32, car speed (simulator units per second) where the env has one.
    """

    seed: int
    observations: np.ndarray | None
    actions: np.ndarray
    labels: np.ndarray | None
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    speeds: np.ndarray

    @property
    def steps(self) -> int:
        return len(self.actions)

    @property
    def episode_return(self) -> float:
        return float(self.rewards.sum())

    def __post_init__(self):
        n = len(self.actions)
        for name in ("rewards", "terminations", "truncations"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"episode {name} has {len(getattr(self, name))} entries, actions have {n}")
        if self.observations is not None and len(self.observations) != n + 1:
            raise ValueError(f"an episode of {n} steps needs {n + 1} observations, got {len(self.observations)}")


def _speed(env: gym.Env) -> float:
    return float(getattr(env.unwrapped, "speed", 0.0))


def rollout(env: gym.Env, actor: Actor, seed: int, max_steps: int | None = None,
            labeler: Callable[[gym.Env], int] | None = None, keep_frames: bool = True,
            on_step: Callable[[int, np.ndarray, int, float, dict], None] | None = None) -> Episode:
    """Run one episode on track ``seed``.

    Args:
        env: the env (for CarRacing, from :func:`envs.make_carracing`).
        actor: chooses the executed actions.
        seed: track seed.
        max_steps: stop after this many steps (marked truncated); None = the env's own limit.
        labeler: called with the env before each step; its action is stored in ``labels``.
        keep_frames: store the observations (off for evaluation, to save memory).
        on_step: called after each step with (step, obs, action, reward, info).

    Returns:
        the :class:`Episode`. A KeyboardInterrupt propagates; the partial episode is dropped.
    """
    obs, info = env.reset(seed=int(seed))
    actor.reset()
    frames = [obs] if keep_frames else None
    actions, labels, rewards, terms, truncs, speeds = [], [], [], [], [], [_speed(env)]
    step = 0
    while True:
        if labeler is not None:
            labels.append(int(labeler(env)))
        action = int(actor.act(obs, env))
        obs, reward, terminated, truncated, info = env.step(action)
        step += 1
        if max_steps is not None and step >= max_steps:
            truncated = True
        actions.append(action)
        rewards.append(reward)
        terms.append(terminated)
        truncs.append(truncated)
        speeds.append(_speed(env))
        if keep_frames:
            frames.append(obs)
        if on_step is not None:
            on_step(step, obs, action, float(reward), info)
        if terminated or truncated:
            break
    return Episode(
        seed=int(seed),
        observations=np.stack(frames) if keep_frames else None,
        actions=np.asarray(actions, dtype=np.int64),
        labels=np.asarray(labels, dtype=np.int64) if labeler is not None else None,
        rewards=np.asarray(rewards, dtype=np.float32),
        terminations=np.asarray(terms, dtype=bool),
        truncations=np.asarray(truncs, dtype=bool),
        speeds=np.asarray(speeds, dtype=np.float32),
    )
