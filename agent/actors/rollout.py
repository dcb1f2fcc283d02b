"""Acting: one actor interface and one episode loop, shared by collection, DAgger, evaluation,
``drive`` and the bridge benchmark.

An *actor* turns an observation into a :class:`Decision` (the action the env is given plus
what the overlays need to explain it). Three actors cover every case:

- :class:`PolicyActor`: a :class:`agent.nn.policy.DrivingPolicy` of any core and head, discrete
  (CarRacing's five actions) or continuous (Udacity's normalised steering), one streaming
  ``step`` per frame with the frame's time from ``info["time_s"]`` when the env gives one;
- :class:`ExpertActor`: the PPO expert, acting from the env's privileged state;
- :class:`MixtureActor`: DAgger's executed policy, the student's action or, with probability
  beta, the expert's (Ross et al. 2011); the student's window always advances.

An optional *labeler* (the expert, in DAgger) says what it would have done in each visited
state. Episodes on seed s always use track s (``env.reset(seed=s)``).

:mod:`agent.actors.vector` runs the same episodes on N envs at once (``--envs N``), with batch actors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import gymnasium as gym
import numpy as np

from envs.carracing import STANDSTILL_SPEED, car_speed

STEERING_CLASSES = ("straight", "left", "right")
STEERING_DEADBAND = 0.05  # |normalised steering| below this counts as straight

#: The car crawls while its speed is below this, in simulator units per second: off the road a
#: discrete student can circle on the grass at 2-4 units/s, steering one way, for hundreds of
#: steps (README, "The creep rule"), which :data:`STANDSTILL_SPEED` never counts. A crawl longer
#: than :data:`STALL_STEPS` counts in ``episodes_with_crawl``.
CRAWL_METRIC_SPEED = 5.0
#: The car is slow while its speed is below this, in simulator units per second (the teacher's
#: start rule turns brake into gas below the same speed, :data:`agent.experts.rules.CRAWL_SPEED`).
#: A student in the "brake trap" brakes each time the car reaches it and accelerates below it, a
#: saw-tooth between 3 and 10 units/s for hundreds of steps that neither a standstill nor a crawl
#: counts (README, "Where the last failures begin"); :attr:`Episode.slow_steps` does. An episode
#: with more than :data:`STALL_STEPS` slow steps counts in ``episodes_slow``.
SLOW_SPEED = 10.0
#: A standstill longer than this many consecutive steps (1 s at CarRacing's 50 FPS) counts as a
#: stall in the evaluation summary (``episodes_with_stall``).
STALL_STEPS = 50


def steering_class(steering: float) -> int:
    """0 straight, 1 left (steering < -0.05), 2 right (> 0.05); normalised steering, +1 = full right."""
    return 1 if steering < -STEERING_DEADBAND else 2 if steering > STEERING_DEADBAND else 0


@dataclass
class Decision:
    """One control step's decision and what the overlays need to explain it.

    Attributes:
        action: what the env is given: a discrete action index (int), or a float32 array for a
            continuous action space (normalised steering for Udacity).
        action_class: the class that colours the traces (the action index; for steering
            0 straight, 1 left, 2 right).
        probs: (A,) action probabilities, or None.
        output: the policy's raw output for this frame, (1, A) logits or (1, 1) steering; None
            for policies without one (the expert).
        state_before, state: the policy state given to and returned by ``step``.
        t: (1,) the timestamp given to the policy in seconds, or None.
        intermediates: the core's intermediates of this step (NAC cores), or None.
        saliency: when the actor acted through Grad-CAM's forward (:attr:`PolicyActor.saliency`),
            this step's :class:`agent.drive.saliency.PendingSaliency`: the map once
            ``SaliencyOverlay.finish`` has run its backward (after the action is sent); else None.
    """

    action: Any
    action_class: int = 0
    probs: np.ndarray | None = None
    output: Any = None
    state_before: Any = None
    state: Any = None
    t: Any = None
    intermediates: Any = None
    saliency: Any = None


class Actor(Protocol):
    """Chooses actions. ``reset`` is called at each episode start, ``act`` once per step.

    Attributes: ``label`` (for the HUD), ``has_probs`` (the decisions carry probabilities),
    ``traces_reason`` (why no NAC traces can be shown, or None).
    """

    label: str
    has_probs: bool
    traces_reason: str | None

    def reset(self) -> None:
        """Forget the previous episode (the policy's window, a perturbation's schedule)."""
        ...

    def act(self, obs: np.ndarray, env: gym.Env | None, info: dict | None = None) -> Decision:
        """The :class:`Decision` for observation ``obs`` (H, W, C) uint8; ``env`` and ``info`` are the
        live env and its last ``info`` dict for actors that read the car's state (the teacher's
        rules), None where there is none (a replay)."""
        ...


class PolicyActor:
    """A :class:`agent.nn.policy.DrivingPolicy` acting one frame at a time (batch of one).

    Args:
        policy: the policy (put in eval mode here).
        deterministic: argmax actions (else sampled from the softmax).
        label: shown in the HUD.

    Attributes:
        want_intermediates: set True to keep the core's intermediates in each decision (the
            trace panel); cores without them set :attr:`traces_reason` instead.
        saliency: a :class:`agent.drive.saliency.SaliencyOverlay` to act through, or None (the
            default). When set, each step is its ``begin``: one differentiable forward gives the
            action, and Grad-CAM's backward on it is left pending (``Decision.saliency``) instead
            of a no-grad step and a second forward (the runner sets it while the overlay is on).
    """

    def __init__(self, policy, deterministic: bool = True, label: str | None = None):
        import torch

        self.policy, self.deterministic, self.state, self.torch = policy, deterministic, None, torch
        self.kind = policy.output_kind
        self.has_probs = self.kind == "discrete"
        self.want_intermediates = False
        self.saliency = None
        core = policy.config.core
        self.traces_reason = None if policy.core.has_intermediates else \
            f"the {core} core has no NAC neurons to trace (traces need a nac-* core)"
        self.label = label or f"{core} policy (window {policy.config.window})"

    def reset(self) -> None:
        self.state = None

    def act(self, obs, env=None, info=None) -> Decision:
        torch = self.torch
        x = np.array(obs, dtype=np.uint8)[None]  # a writable copy, (1, H, W, C)
        t = None
        if info is not None and "time_s" in info:
            t = torch.tensor([float(info["time_s"])], dtype=torch.float64, device=self.policy.device)
        before = self.state
        if self.policy.training:
            self.policy.eval()
        want = self.want_intermediates and self.traces_reason is None
        sal = None
        if self.saliency is not None:
            out, self.state, sal = self.saliency.begin(x[0], before, t, return_intermediates=want)
        else:
            out, self.state = self.policy.step(x, before, return_intermediates=want, t=t)
        inter = self.state.last.get("intermediates") if want else None
        if self.kind == "discrete":
            probs = torch.softmax(out[0].float(), -1).cpu().numpy()
            a = int(self.policy.act(out, self.deterministic)[0])
            return Decision(a, a, probs, out, before, self.state, t, inter, sal)
        action = self.policy.act(out)[0]  # (A,) float32, clipped to the action box
        return Decision(action, steering_class(float(action[0])), None, out, before, self.state, t, inter, sal)


class ExpertActor:
    """The PPO expert, acting from a CarRacing env's privileged state (see :mod:`agent.experts.policy`).

    A discrete expert's ``act(env)`` gives an action index: the decision's action and class are
    that int. A continuous expert's gives a (2,) float32 array (steering, throttle), each in
    [-1, 1]: the decision's action is that array and its class :func:`steering_class` of the
    steering.
    """

    has_probs = False
    traces_reason = "the PPO expert has no NAC layer (it reads privileged state, not frames)"
    label = "expert (privileged state)"

    def __init__(self, expert):
        self.expert = expert

    def reset(self) -> None:
        pass

    def act(self, obs, env, info=None) -> Decision:
        a = self.expert.act(env)
        if np.ndim(a) == 0:  # a discrete action index (int or 0-d array)
            a = int(a)
            return Decision(a, a)
        a = np.asarray(a, dtype=np.float32).reshape(-1)
        return Decision(a, steering_class(float(a[0])))


class MixtureActor:
    """DAgger's executed policy: the student's decision, or with probability ``beta`` the expert's.

    The student acts on every step (its window advances either way); ``rng`` draws the choice.
    """

    def __init__(self, student: Actor, expert: Actor, beta: float, rng: np.random.Generator):
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.student, self.expert, self.beta, self.rng = student, expert, beta, rng
        self.label, self.has_probs, self.traces_reason = student.label, student.has_probs, student.traces_reason

    def reset(self) -> None:
        self.student.reset()
        self.expert.reset()

    def act(self, obs, env, info=None) -> Decision:
        d = self.student.act(obs, env, info)
        if self.beta > 0 and self.rng.random() < self.beta:
            return self.expert.act(obs, env, info)
        return d


def standstill(speeds, threshold: float = STANDSTILL_SPEED) -> np.ndarray:
    """Which speeds are a standstill: ``speeds < threshold``.

    Args:
        speeds: (N,) car speeds in simulator units per second (see :data:`STANDSTILL_SPEED`); NaN
            (speed unknown) never counts as a standstill.
        threshold: the standstill speed, same unit.

    Returns:
        (N,) bool.
    """
    v = np.asarray(speeds, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return v < float(threshold)


def longest_run(mask) -> int:
    """Length of the longest run of consecutive True entries of a (N,) bool array (0 if none).

    Raises:
        ValueError: ``mask`` is not one-dimensional.
    """
    m = np.asarray(mask, dtype=bool)
    if m.ndim != 1:
        raise ValueError(f"longest_run needs a 1-D mask, got shape {m.shape}")
    if not m.any():
        return 0
    edges = np.diff(np.concatenate([[0], m.astype(np.int8), [0]]))  # +1 where a run starts, -1 after it ends
    return int((np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).max())


def all_wheels_off_road(env: gym.Env) -> bool | None:
    """True when all four wheels are off the road (no wheel touches a road tile), the test of
    :class:`envs.carracing.OffTrackTermination`; None for an env without wheels (Udacity) or before
    the first reset."""
    off = wheels_off_road(env)
    return None if off is None else off == 4


def wheels_off_road(env: gym.Env) -> int | None:
    """How many of the car's four wheels touch no road tile (0-4,
    :attr:`envs.carracing.CarRacingEnv.wheels_off_road`); None for an env without wheels (Udacity)
    or before the first reset. 1-3 means the car is on the road's edge."""
    u = env.unwrapped
    if getattr(u, "car", None) is None or not hasattr(type(u), "wheels_off_road"):
        return None
    return u.wheels_off_road


def tiles_missed(env: gym.Env) -> int | None:
    """CarRacing's road tiles not visited yet (a tile counts once any wheel has touched it); None
    for an env without tiles (Udacity).

    gymnasium's CarRacing ends a lap only when every tile has been visited (the start tile is
    visited at the start, so its ``lap_complete_percent`` rule does not fire): a car that skips the
    tiles of one bend, e.g. by leaving the road with all four wheels, drives on until step 1000 and
    scores 1000 x (visited / tiles) - 100, below 900 however fast it was.
    """
    u = env.unwrapped
    if getattr(u, "track", None) is None or not hasattr(type(u), "tiles_missed"):
        return None
    return int(u.tiles_missed)


def wrong_way(env: gym.Env) -> bool | None:
    """True when the car drives against the lap's direction (:attr:`envs.carracing.CarRacingEnv.wrong_way`:
    at least 5 units/s, more than 120 degrees from the track's direction at the nearest track
    point); None for an env without a track (Udacity) or before the first reset."""
    u = env.unwrapped
    if getattr(u, "track", None) is None or getattr(u, "car", None) is None or not hasattr(type(u), "wrong_way"):
        return None
    return bool(u.wrong_way)


def slow_steps(speeds, threshold: float = SLOW_SPEED) -> int:
    """Steps slower than ``threshold`` after the first step at or above it (0 if none is).

    Args:
        speeds: (N,) the car's speed after each step, simulator units per second; NaN counts as
            neither slow nor fast.
        threshold: units/s; :data:`SLOW_SPEED` (10) by default. A higher one (e.g. 25) also counts
            a saw-tooth above the start rule's brake floor (README, "The brake floor").

    Raises:
        ValueError: a threshold that is not a positive finite number.
    """
    if not (np.isfinite(threshold) and threshold > 0):
        raise ValueError(f"the slow-speed threshold must be a positive number of units/s, got {threshold}")
    s = np.asarray(speeds, dtype=np.float64).reshape(-1)
    with np.errstate(invalid="ignore"):
        fast = s >= threshold
        if not fast.any():
            return 0
        return int(np.count_nonzero(s[int(np.argmax(fast)):] < threshold))


class StallMeter:
    """The "no stalls" figures of one episode, updated step by step (``drive`` shows them live).

    The same definitions as :class:`Episode`: a step is at standstill when the speed after it is
    below :data:`STANDSTILL_SPEED`; a step is off the road when all four wheels are after it.

    Attributes:
        steps: steps measured since :meth:`reset`.
        standstill_run: consecutive standstill steps up to the last one (0 if it moved).
        longest_standstill: the longest run of standstill steps so far; None while no speed was known.
        crawl_run, longest_crawl: the same for steps below :data:`CRAWL_METRIC_SPEED` (5 units/s).
        slow_steps: steps below :data:`SLOW_SPEED` (10 units/s) since the car first reached it
            (:attr:`Episode.slow_steps`); None while no speed was known.
        off_road_steps: steps with all four wheels off the road; None for an env without wheels.
        tiles_missed: road tiles not visited after the last step (:func:`tiles_missed`); None for
            an env without tiles or before the first step.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Start a new episode."""
        self.steps = self.standstill_run = self.crawl_run = 0
        self.longest_standstill: int | None = None
        self.longest_crawl: int | None = None
        self.slow_steps: int | None = None
        self._reached_slow_speed = False
        self.off_road_steps: int | None = None
        self.tiles_missed: int | None = None

    def update(self, speed: float, off_road: bool | None, tiles_missed: int | None = None) -> None:
        """Add one step: the speed after it (simulator units/s, NaN if unknown), whether all four
        wheels are off the road (None if unknown) and the road tiles not visited yet (None if unknown)."""
        self.steps += 1
        self.tiles_missed = None if tiles_missed is None else int(tiles_missed)
        if math.isfinite(speed):
            self.standstill_run = self.standstill_run + 1 if bool(standstill([speed])[0]) else 0
            self.longest_standstill = max(self.longest_standstill or 0, self.standstill_run)
            self.crawl_run = self.crawl_run + 1 if speed < CRAWL_METRIC_SPEED else 0
            self.longest_crawl = max(self.longest_crawl or 0, self.crawl_run)
            self._reached_slow_speed = self._reached_slow_speed or speed >= SLOW_SPEED
            self.slow_steps = (self.slow_steps or 0) + int(self._reached_slow_speed and speed < SLOW_SPEED)
        if off_road is not None:
            self.off_road_steps = (self.off_road_steps or 0) + int(bool(off_road))

    def measure(self, env: gym.Env) -> None:
        """:meth:`update` with the env's state after a step (:func:`car_speed`, :func:`all_wheels_off_road`,
        :func:`tiles_missed`)."""
        self.update(car_speed(env), all_wheels_off_road(env), tiles_missed(env))


@dataclass
class Episode:
    """One finished (or cut short) episode. N = steps taken.

    Attributes:
        seed: the track seed.
        observations: (N + 1, H, W, C) uint8 frames (the student's view), or None if not kept.
        actions: (N,) int64 discrete actions, or (N, A) float32 continuous actions, as executed.
        labels: the labeler's action for each visited state: (N,) int64 for a discrete labeler,
            (N, A) float32 for one that returns arrays (a continuous expert); None without a labeler.
        rewards: (N,) float32.
        terminations, truncations: (N,) bool.
        speeds: (N + 1,) float32, car speed in simulator units per second at the reset and after
            each step (:func:`car_speed`); NaN where the env has none.
        off_road: (N,) bool, all four wheels off the road after each step
            (:func:`all_wheels_off_road`); None for an env without wheels.
        wheels_off: (N,) int8, wheels off the road after each step (:func:`wheels_off_road`,
            0-4); None for an env without wheels.
        tiles_missed: road tiles never visited by the episode's end (:func:`tiles_missed`); None
            for an env without tiles.
        wrong_way: (N,) bool, the car driving against the lap's direction after each step
            (:func:`wrong_way`); None for an env without a track.
    """

    seed: int
    observations: np.ndarray | None
    actions: np.ndarray
    labels: np.ndarray | None
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    speeds: np.ndarray
    off_road: np.ndarray | None = None
    wheels_off: np.ndarray | None = None
    tiles_missed: int | None = None
    wrong_way: np.ndarray | None = None

    @property
    def steps(self) -> int:
        """Number of steps the episode lasted."""
        return len(self.actions)

    @property
    def episode_return(self) -> float:
        """The undiscounted sum of the env's rewards (the CarRacing score)."""
        return float(self.rewards.sum())

    @property
    def longest_standstill(self) -> int | None:
        """The longest run of consecutive steps after which the car's speed was below
        :data:`STANDSTILL_SPEED` (steps; 0 if it never stood still); None if the env reports no speed."""
        return self._longest_below(STANDSTILL_SPEED)

    @property
    def longest_crawl(self) -> int | None:
        """The longest run of consecutive steps after which the car's speed was below
        :data:`CRAWL_METRIC_SPEED` (5 units/s; standstills included; steps); None if the env reports no speed."""
        return self._longest_below(CRAWL_METRIC_SPEED)

    @property
    def slow_steps(self) -> int | None:
        """Steps after which the car was slower than :data:`SLOW_SPEED` (10 units/s), counted from
        the first step at which it had reached that speed (the start of the lap is not counted;
        0 if it never did); None if the env reports no speed."""
        return self._from_speeds(slow_steps)

    def slow_steps_below(self, threshold: float) -> int | None:
        """:attr:`slow_steps` with another threshold (units/s): the steps after which the car was
        slower than it, from the first step at which it had reached it; None if no speed is known.

        Raises:
            ValueError: a threshold that is not a positive finite number.
        """
        return self._from_speeds(lambda after: slow_steps(after, threshold))

    def _longest_below(self, speed: float) -> int | None:
        """The longest run of steps after which the speed was below ``speed`` units/s (0 for an
        empty episode); None if no speed is known."""
        return self._from_speeds(lambda after: longest_run(standstill(after, speed)))

    def _from_speeds(self, measure) -> int | None:
        """``measure`` of the (N,) speeds after each step; 0 for an empty episode, None if no speed is known."""
        after = np.asarray(self.speeds, dtype=np.float64)[1:]
        if not len(after) or not np.isfinite(after).any():
            return None if len(after) else 0
        return measure(after)

    @property
    def off_road_steps(self) -> int | None:
        """Steps after which all four wheels were off the road; None for an env without wheels."""
        return None if self.off_road is None else int(np.count_nonzero(self.off_road))

    @property
    def edge_steps(self) -> int | None:
        """Steps after which one to three wheels were off the road: the car on the road's edge
        (all four off counts in :attr:`off_road_steps` instead); None for an env without wheels."""
        if self.wheels_off is None:
            return None
        w = np.asarray(self.wheels_off)
        return int(np.count_nonzero((w > 0) & (w < 4)))

    @property
    def wrong_way_steps(self) -> int | None:
        """Steps after which the car drove against the lap's direction (:func:`wrong_way`); None for
        an env without a track."""
        return None if self.wrong_way is None else int(np.count_nonzero(self.wrong_way))

    def __post_init__(self):
        n = len(self.actions)
        for name in ("rewards", "terminations", "truncations"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"episode {name} has {len(getattr(self, name))} entries, actions have {n}")
        if self.observations is not None and len(self.observations) != n + 1:
            raise ValueError(f"an episode of {n} steps needs {n + 1} observations, got {len(self.observations)}")
        if len(self.speeds) != n + 1:
            raise ValueError(f"an episode of {n} steps needs {n + 1} speeds, got {len(self.speeds)}")
        if self.off_road is not None and len(self.off_road) != n:
            raise ValueError(f"episode off_road has {len(self.off_road)} entries, actions have {n}")
        if self.wheels_off is not None and len(self.wheels_off) != n:
            raise ValueError(f"episode wheels_off has {len(self.wheels_off)} entries, actions have {n}")
        if self.wrong_way is not None and len(self.wrong_way) != n:
            raise ValueError(f"episode wrong_way has {len(self.wrong_way)} entries, actions have {n}")


def rollout(env: gym.Env, actor: Actor, seed: int, max_steps: int | None = None,
            labeler: Callable[[gym.Env], Any] | None = None, keep_frames: bool = True,
            on_step: Callable[[int, np.ndarray, Any, float, dict], None] | None = None) -> Episode:
    """Run one episode on track ``seed``.

    Args:
        env: the env (for CarRacing, from :func:`envs.make_carracing`).
        actor: chooses the executed actions (:class:`Actor`).
        seed: track seed.
        max_steps: stop after this many steps (marked truncated); None = the env's own limit.
        labeler: called with the env before each step; its action is stored in ``labels``: an
            action index (int64 labels) or an (A,) array (a continuous expert: (N, A) float32 labels).
        keep_frames: store the observations (off for evaluation, to save memory).
        on_step: called after each step with (step, obs, action, reward, info).

    Returns:
        the :class:`Episode`. A KeyboardInterrupt propagates; the partial episode is dropped.
    """
    obs, info = env.reset(seed=int(seed))
    actor.reset()
    frames = [obs] if keep_frames else None
    actions, labels, rewards, terms, truncs, speeds = [], [], [], [], [], [car_speed(env)]
    off_road: list[bool | None] = []
    wheels: list[int | None] = []
    wrong: list[bool | None] = []
    step = 0
    while True:
        if labeler is not None:
            labels.append(labeler(env))
        action = actor.act(obs, env, info).action
        obs, reward, terminated, truncated, info = env.step(action)
        step += 1
        if max_steps is not None and step >= max_steps:
            truncated = True
        actions.append(action)
        rewards.append(reward)
        terms.append(terminated)
        truncs.append(truncated)
        speeds.append(car_speed(env))
        off = wheels_off_road(env)
        off_road.append(None if off is None else off == 4)
        wheels.append(off)
        wrong.append(wrong_way(env))
        if keep_frames:
            frames.append(obs)
        if on_step is not None:
            on_step(step, obs, action, float(reward), info)
        if terminated or truncated:
            break
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    return Episode(
        seed=int(seed),
        observations=np.stack(frames) if keep_frames else None,
        actions=np.asarray(actions, dtype=np.int64 if discrete else np.float32),
        labels=_stack_labels(labels) if labeler is not None else None,
        rewards=np.asarray(rewards, dtype=np.float32),
        terminations=np.asarray(terms, dtype=bool),
        truncations=np.asarray(truncs, dtype=bool),
        speeds=np.asarray(speeds, dtype=np.float32),
        off_road=None if any(x is None for x in off_road) else np.asarray(off_road, dtype=bool),
        wheels_off=None if any(x is None for x in wheels) else np.asarray(wheels, dtype=np.int8),
        tiles_missed=tiles_missed(env),
        wrong_way=None if any(x is None for x in wrong) else np.asarray(wrong, dtype=bool),
    )


def _stack_labels(labels: list) -> np.ndarray:
    """(N,) int64 for action indices, (N, A) float32 for (A,) arrays (a continuous labeler)."""
    if labels and np.ndim(labels[0]) > 0:
        return np.stack([np.asarray(a, dtype=np.float32).reshape(-1) for a in labels])
    return np.asarray([int(a) for a in labels], dtype=np.int64)


__all__ = ["Actor", "Decision", "Episode", "ExpertActor", "MixtureActor", "PolicyActor", "SLOW_SPEED", "STALL_STEPS",
           "STANDSTILL_SPEED", "STEERING_CLASSES", "StallMeter", "all_wheels_off_road", "car_speed", "longest_run",
           "rollout", "slow_steps", "standstill", "steering_class", "tiles_missed", "wheels_off_road", "wrong_way"]
