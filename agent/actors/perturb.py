"""Disturbances that push the car into the states a student fails in, so the expert labels the way back.

Behaviour cloning only sees the states an expert visits, and an expert rarely leaves the road or
stops. A student that does, drifts into states nobody labelled (Ross et al. 2011). DAgger's
student rollouts cover some of them; disturbances cover them on purpose, in the spirit of DART
(Laskey, Lee, Fox, Dragan and Goldberg 2017, "DART: Noise Injection for Robust Imitation
Learning"), whose noise is injected into the executed actions while the expert keeps labelling:

- ``"off-road"``: steer hard to one side for a while, so the car leaves the road; the labels
  that follow are the expert's way back onto it;
- ``"stop"``: brake until the car stands still and hold it there; the labels that follow are
  the expert starting again from a standstill;
- ``"ditch"``: the two in a row, off the road and then braked to a standstill there, so the
  labels that follow are the expert starting again from rest on the grass (a scene its own laps
  never hold; a student that stops off the road has seen no label there otherwise). Not in the
  default mix: ask for it with ``kinds`` (``agent train --dagger.disturb-kinds``).
- ``"speed"``: the wrapped actor still steers, but it never coasts or brakes: every "nothing" or
  "brake" it chooses is executed as full gas (continuous: its steering with full throttle), so
  the car reaches bends faster than its own driving would; the labels are the expert's bends
  taken at that speed, and its braking out of it. Aimed at the recipe's unseen-track failures,
  bends entered at a lap's top speed (docs/experiments/2026-11-28-recipe-seed-1.md). Not in
  the default mix either.

A :class:`PerturbedActor` wraps any actor (the DAgger mixture, or the expert alone for
:mod:`agent.eval.recovery`). Between disturbances the wrapped actor drives; the episode runs on
after each one (no early stop), so every state of the recovery is visited and labelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from agent.actors.rollout import Decision

KINDS = ("off-road", "stop", "ditch", "speed")
#: The kinds drawn when none are given (the mix the shipped policies were trained with).
DEFAULT_KINDS = ("off-road", "stop")


def disturbance_action(kind: str, side: int, action_space: gym.Space):
    """The action a simple disturbance executes on every step it lasts ("ditch" is "off-road" then
    "stop": see :func:`disturbance_phases`).

    Args:
        kind: "off-road" (steer hard to ``side``) or "stop" (brake).
        side: -1 left, +1 right (used by "off-road").
        action_space: the env's: CarRacing's Discrete(5) (1 turns right, 2 left: gymnasium issue #1369;
            4 brake) or the continuous
            configuration's Box(-1, 1, (2,)) = (steering, throttle).

    Raises:
        ValueError: an unknown kind (or "ditch"), or an action space that is neither of the two.
    """
    if kind not in ("off-road", "stop"):
        raise ValueError(f"{kind!r} has no single action; choose off-road or stop (ditch is the two in a row)")
    if isinstance(action_space, gym.spaces.Discrete) and action_space.n == 5:
        return 4 if kind == "stop" else (2 if side < 0 else 1)
    if isinstance(action_space, gym.spaces.Box) and action_space.shape == (2,):
        a = np.array([0.0, -1.0], np.float32) if kind == "stop" else np.array([float(np.sign(side)), 0.3], np.float32)
        return a
    raise ValueError(f"disturbances are defined for CarRacing's Discrete(5) or (steering, throttle) Box(2) actions, "
                     f"got {action_space}")


def disturbance_phases(kind: str, steps: tuple[int, ...], side: int, action_space: gym.Space) -> list:
    """A disturbance as (action, steps) phases executed in order.

    Args:
        kind: one of :data:`KINDS`.
        steps: the phases' lengths in steps (50 steps = 1 s): one for "off-road" and "stop",
            two (steering, then braking) for "ditch".
        side: -1 left, +1 right (the steering phase).
        action_space: as in :func:`disturbance_action`.

    Raises:
        ValueError: an unknown kind, the wrong number of lengths, a length < 1, or an unsupported
            action space.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown disturbance {kind!r}; choose from {', '.join(KINDS)}")
    parts = ("off-road", "stop") if kind == "ditch" else (kind,)
    if len(steps) != len(parts) or min(steps) < 1:
        raise ValueError(f"{kind} takes {len(parts)} phase length(s) >= 1, got {tuple(steps)}")
    if kind == "speed":
        speed_action(0, action_space)  # checks the action space
        return [(SPEED, int(steps[0]))]
    return [(disturbance_action(p, side, action_space), int(n)) for p, n in zip(parts, steps)]


#: The phase action of a "speed" disturbance: the executed action is made from the wrapped
#: actor's (:func:`speed_action`).
SPEED = "speed"


def speed_action(action, action_space: gym.Space):
    """The action a "speed" disturbance executes in place of the wrapped actor's ``action``.

    Args:
        action: the wrapped actor's action: a Discrete(5) index (0 nothing, 1 right, 2 left,
            3 gas, 4 brake) or a (steering, throttle) array.
        action_space: CarRacing's Discrete(5) or the continuous configuration's Box(-1, 1, (2,)).

    Returns:
        Discrete: 3 (gas) in place of 0 (nothing) or 4 (brake), a steering or gas action as it is.
        Box: (the same steering, 1.0) as float32.

    Raises:
        ValueError: any other action space.
    """
    if isinstance(action_space, gym.spaces.Discrete) and action_space.n == 5:
        return 3 if int(action) in (0, 4) else int(action)
    if isinstance(action_space, gym.spaces.Box) and action_space.shape == (2,):
        return np.array([float(np.asarray(action, np.float32).reshape(-1)[0]), 1.0], np.float32)
    raise ValueError(f"disturbances are defined for CarRacing's Discrete(5) or (steering, throttle) Box(2) actions, "
                     f"got {action_space}")


@dataclass
class DisturbanceConfig:
    """When and how long the car is disturbed.

    Attributes:
        per_episode: mean number of disturbances per 1000 steps (Poisson starts; 0 disables).
        kinds: the disturbances drawn from, uniformly.
        off_road_steps: (min, max) steps of hard steering, 50 steps = 1 s.
        stop_steps: (min, max) steps of braking (the car stands still within about 1 s at
            CarRacing's speeds, so the rest of the time it stands). A "ditch" draws one length
            from each range.
        speed_steps: (min, max) steps of a "speed" disturbance (never coasting nor braking).
        warmup: no disturbance before this step (the car first gets up to speed).
    """

    per_episode: float = 2.0
    kinds: tuple[str, ...] = DEFAULT_KINDS
    off_road_steps: tuple[int, int] = (15, 40)
    stop_steps: tuple[int, int] = (60, 120)
    speed_steps: tuple[int, int] = (50, 150)
    warmup: int = 50

    def __post_init__(self):
        if self.per_episode < 0:
            raise ValueError(f"per_episode must be >= 0, got {self.per_episode}")
        unknown = set(self.kinds) - set(KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {self.kinds}")
        for name in ("off_road_steps", "stop_steps", "speed_steps"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (min, max) with 1 <= min <= max, got {(lo, hi)}")


class PerturbedActor:
    """Executes ``actor``'s decisions, except during disturbances (:class:`DisturbanceConfig`).

    The wrapped actor is asked on every step, so a student's window advances either way.
    ``active`` says whether the last decision was a disturbance; ``events`` lists the
    disturbances of the current episode as (start step, kind, length).

    Args:
        actor: the actor that drives between disturbances.
        cfg: the schedule.
        rng: draws the schedule.
        schedule: fixed disturbances [(start step, kind, length, side)] instead of random ones
            (used by :mod:`agent.eval.recovery`); a "ditch" takes (steering steps, braking steps)
            as its length.
    """

    def __init__(self, actor, cfg: DisturbanceConfig, rng: np.random.Generator,
                 schedule: list[tuple[int, str, int, int]] | None = None):
        self.actor, self.cfg, self.rng, self.fixed = actor, cfg, rng, schedule
        self.label, self.has_probs, self.traces_reason = actor.label, actor.has_probs, actor.traces_reason
        self.reset()

    def reset(self) -> None:
        self.actor.reset()
        self.step, self.left, self.current, self.active = 0, 0, None, False
        self.phases: list = []
        self.events: list[tuple[int, str, int]] = []
        self.pending = sorted(self.fixed or [])

    def _start(self, kind: str, steps: tuple[int, ...], side: int, env) -> None:
        self.phases = disturbance_phases(kind, steps, side, env.action_space)
        self.current, self.left = self.phases.pop(0)
        self.events.append((self.step, kind, int(sum(steps))))

    def _draw(self, kind: str) -> tuple[int, ...]:
        ranges = {"off-road": [self.cfg.off_road_steps], "stop": [self.cfg.stop_steps],
                  "ditch": [self.cfg.off_road_steps, self.cfg.stop_steps], "speed": [self.cfg.speed_steps]}[kind]
        return tuple(int(self.rng.integers(lo, hi + 1)) for lo, hi in ranges)

    def act(self, obs, env, info=None) -> Decision:
        d = self.actor.act(obs, env, info)
        if self.left == 0 and self.phases:  # a "ditch" goes on with its next phase
            self.current, self.left = self.phases.pop(0)
        elif self.left == 0:
            if self.fixed is not None:
                if self.pending and self.pending[0][0] <= self.step:
                    start, kind, length, side = self.pending.pop(0)
                    self._start(kind, tuple(length) if isinstance(length, (tuple, list)) else (length,), side, env)
            elif self.step >= self.cfg.warmup and self.cfg.per_episode > 0 and \
                    self.rng.random() < self.cfg.per_episode / 1000.0:
                kind = str(self.rng.choice(self.cfg.kinds))
                self._start(kind, self._draw(kind), int(self.rng.choice([-1, 1])), env)
        self.step += 1
        self.active = self.left > 0
        if self.active:
            self.left -= 1
            a = speed_action(d.action, env.action_space) if isinstance(self.current, str) else self.current
            cls = int(a) if np.ndim(a) == 0 else 0
            return Decision(a, cls, d.probs, d.output, d.state_before, d.state, d.t, d.intermediates)
        return d


__all__ = ["DEFAULT_KINDS", "DisturbanceConfig", "KINDS", "PerturbedActor", "SPEED", "disturbance_action",
           "disturbance_phases", "speed_action"]
