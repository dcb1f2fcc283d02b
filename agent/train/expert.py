"""The PPO expert: stable-baselines3 PPO on CarRacing's privileged-state view.

A pixel PPO expert is out of reach on a 2-core CPU within an hour (DESIGN.md section 4), so the
expert learns from privileged state with the pixel rendering skipped ("learning by cheating",
Chen et al. 2019), then acts in the real, rendered env while recordings store the frames the
student sees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

from agent.log import get_logger, progress_enabled
from envs.carracing import ACTION_NAMES, OffTrackTermination, PrivilegedObservation, make_carracing
from envs.tracks import EXPERT_EVAL_SEED_BASE

_log = get_logger(__name__)

#: the discrete "gas" action (:data:`envs.carracing.ACTION_NAMES`)
GAS = ACTION_NAMES.index("gas")
#: the discrete "brake" action
BRAKE = ACTION_NAMES.index("brake")
#: below this speed (simulator units per second) the start rule turns the expert's brake into gas
#: (:meth:`ExpertPolicy.act`); the car cruises at 30-90 units/s and reaches 43 after 2 s of gas
CRAWL_SPEED = 10.0
#: the brake floor a DAgger teacher can be given instead of :data:`CRAWL_SPEED` (``agent train --brake-floor``):
#: the expert's brake labels at 10-15 units/s in its students' states (431 of the 2,575 brake labels of 19
#: clean DAgger rounds, half of them on the grass) teach a slow student to brake each time it reaches
#: 10 units/s (README, "The brake floor"); the expert's own laps and recoveries never brake below 20 on the road
BRAKE_FLOOR_SPEED = 20.0
#: the continuous expert's throttle under the start rule (full gas, as on the first steps of its laps)
START_THROTTLE = 1.0


def _below(actions, speeds, speed: float, rule: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(N,) int64 actions and (N,) bool "speed below ``speed``" (NaN: False) for a speed rule.

    Raises:
        ValueError: actions and speeds of different lengths, or a negative ``speed``.
    """
    actions = np.asarray(actions, dtype=np.int64).reshape(-1)
    speeds = np.asarray(speeds, dtype=np.float64).reshape(-1)
    if len(speeds) != len(actions):
        raise ValueError(f"{rule} needs one speed per action: {len(speeds)} speeds for {len(actions)} actions")
    if not speed >= 0:
        raise ValueError(f"{name} must be >= 0 units/s, got {speed}")
    with np.errstate(invalid="ignore"):
        return actions, speeds < speed


def _relabel(demos, rule, what: str):
    """``demos`` with ``rule(actions, speeds, frames)`` applied to each discrete episode's labels;
    (new demos, labels changed). Raises ValueError for continuous demonstrations, naming ``what``."""
    import dataclasses

    if demos.continuous:
        raise ValueError(f"{what} is for discrete recordings (the continuous configuration steers and accelerates "
                         "at once, and keeps its throttle)")
    actions = [rule(a, v, f) for a, v, f in zip(demos.actions, demos.frame_speeds(), demos.frames)]
    changed = int(sum(np.count_nonzero(a != b) for a, b in zip(actions, demos.actions)))
    return dataclasses.replace(demos, actions=actions), changed


def creep_rule(actions: np.ndarray, speeds, creep_speed: float) -> np.ndarray:
    """The teacher's creep rule on discrete labels: below ``creep_speed`` every label becomes gas.

    Discrete CarRacing has no gas while steering, so a slow car that is told to steer coasts.
    Off the road, the discrete margin expert labels "left" on 64 % of the frames its DAgger
    students visited between 1 and 2.5 units/s; a student that copies it circles slowly on the
    grass, steering one way at 2-4 units/s, for 350-450 steps (README, "The creep rule").
    The start rule (:meth:`ExpertPolicy.act`) only acts below 1 unit/s, so it never fires there.
    Below ``creep_speed`` the label is gas; above it the expert's steering is kept, so a slow
    car gets going, then turns.

    Args:
        actions: (N,) int64 discrete actions (0..4, :data:`envs.carracing.ACTION_NAMES`).
        speeds: (N,) car speeds in simulator units per second at those frames; NaN never triggers.
        creep_speed: units/s; 0 turns the rule off.

    Returns:
        (N,) int64: a new array.

    Raises:
        ValueError: ``actions`` and ``speeds`` of different lengths, or a negative ``creep_speed``.
    """
    actions, slow = _below(actions, speeds, creep_speed, "creep_rule", "creep_speed")
    return np.where(slow, GAS, actions)


def brake_floor_rule(actions: np.ndarray, speeds, floor: float) -> np.ndarray:
    """The start rule's brake floor on discrete labels: below ``floor`` a brake label becomes gas.

    The start rule (:meth:`ExpertPolicy.act`) does this below :data:`CRAWL_SPEED`; a DAgger teacher
    can be given a higher floor (:data:`BRAKE_FLOOR_SPEED`, ``agent train --brake-floor``), and
    recordings labelled under the old floor get the new one from their recorded speeds
    (:func:`relabel_brake_floor`). Other labels are kept.

    Args:
        actions: (N,) int64 discrete actions (0..4, :data:`envs.carracing.ACTION_NAMES`).
        speeds: (N,) car speeds in simulator units per second at those frames; NaN never triggers.
        floor: units/s; 0 turns the rule off.

    Returns:
        (N,) int64: a new array.

    Raises:
        ValueError: ``actions`` and ``speeds`` of different lengths, or a negative ``floor``.
    """
    actions, slow = _below(actions, speeds, floor, "brake_floor_rule", "the brake floor")
    return np.where(slow & (actions == BRAKE), GAS, actions)


def relabel_brake_floor(demos, floor: float):
    """Recorded discrete demonstrations with :func:`brake_floor_rule` applied to their labels.

    Like :func:`relabel_creep`, it needs only the label and the recorded speed
    (:attr:`agent.data.recordings.Demonstrations.speeds`); frames without a known speed keep
    their label.

    Args:
        demos: :class:`agent.data.recordings.Demonstrations` with discrete actions.
        floor: units/s (see :func:`brake_floor_rule`).

    Returns:
        (new Demonstrations, the number of labels changed).

    Raises:
        ValueError: continuous demonstrations, or a negative ``floor``.
    """
    return _relabel(demos, lambda a, v, _: brake_floor_rule(a, v, floor), "relabelling with a brake floor")


def relabel_grass(demos):
    """Recorded discrete demonstrations with the grass rule (:meth:`ExpertPolicy.use_grass_rule`)
    applied to their labels: a brake label on a frame where the car is on the grass becomes gas.

    Recordings keep no wheel flags, so the grass is read from the frame's pixels
    (:func:`envs.carracing.car_on_grass`), which misses about 4 % of the grass frames and marked
    no road frame as grass when it was measured.

    Args:
        demos: :class:`agent.data.recordings.Demonstrations` with discrete actions and CarRacing's
            (96, 96, 3) frames.

    Returns:
        (new Demonstrations, the number of labels changed).

    Raises:
        ValueError: continuous demonstrations, or frames that are not CarRacing's.
    """
    from envs.carracing import car_on_grass

    def rule(actions, speeds, frames):
        new = np.asarray(actions, dtype=np.int64).copy()
        brake = np.flatnonzero(new == BRAKE)
        if brake.size:  # the pixel test only where it can change a label
            new[brake[car_on_grass(frames[brake])]] = GAS
        return new

    return _relabel(demos, rule, "the grass rule")


def relabel_creep(demos, creep_speed: float):
    """Recorded discrete demonstrations with :func:`creep_rule` applied to their labels.

    The rule needs only the label and the car's speed, which recordings keep
    (:attr:`agent.data.recordings.Demonstrations.speeds`), so recordings made before it (expert
    laps and DAgger rounds) get the labels the teacher would give now. Frames without a known
    speed keep their label.

    Args:
        demos: :class:`agent.data.recordings.Demonstrations` with discrete actions.
        creep_speed: units/s (see :func:`creep_rule`).

    Returns:
        (new Demonstrations, the number of labels changed).

    Raises:
        ValueError: continuous demonstrations (the continuous configuration can steer and
            accelerate at once; the rule is for the discrete one), or a negative ``creep_speed``.
    """
    return _relabel(demos, lambda a, v, _: creep_rule(a, v, creep_speed), "the creep rule")


class ActionRepeat(gym.Wrapper):
    """Repeat each action ``repeat`` times and sum the rewards (frame-skip)."""

    def __init__(self, env: gym.Env, repeat: int):
        super().__init__(env)
        if repeat < 1:
            raise ValueError(f"action repeat must be >= 1, got {repeat}")
        self.repeat = repeat

    def step(self, action):
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


class DisturbedStart(gym.Wrapper):
    """Start a share of the training episodes in a failure state: off the road, or standing still.

    An expert trained only from the start line, and stopped 50 steps after it leaves the road,
    never learns the way back (``agent expert check-recovery`` measures this). With probability
    ``p`` a reset is followed by hidden steps: a simple centre-line follower (steering towards the
    third waypoint ahead, gas up to ``cruise`` speed) drives a random 20-600 steps along the track,
    then one disturbance of :mod:`agent.train.perturb` (off-road: 15-60 steps of hard steering;
    stop: 60-150 steps of braking). The episode the learner sees starts there; the hidden steps'
    rewards are not given to it, and they count towards the 1000-step limit.

    Args:
        env: the privileged CarRacing env (:func:`envs.carracing.make_carracing` with ``privileged=True``).
        p: share of episodes with a disturbed start.
        seed: seeds the draws.
        cruise: the follower's target speed, simulator units per second.
    """

    def __init__(self, env: gym.Env, p: float = 0.5, seed: int = 0, cruise: float = 40.0):
        super().__init__(env)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        self.p, self.cruise, self.rng = p, cruise, np.random.default_rng(seed)

    def _follow(self, obs: np.ndarray):
        """The centre-line follower's action for a privileged observation."""
        from envs.carracing import N_WAYPOINTS

        wp = obs[-2 * N_WAYPOINTS:].reshape(N_WAYPOINTS, 2)[2]  # (x right, y forward) / 50
        steer = float(np.clip(np.arctan2(wp[0], max(wp[1], 1e-3)) * 2.0, -1.0, 1.0))
        slow = self.env.unwrapped.speed < self.cruise
        if isinstance(self.action_space, gym.spaces.Discrete):
            # discrete action 1 turns right and 2 left (gymnasium issue #1369; envs.carracing.ACTION_NAMES)
            return 1 if steer > 0.3 else 2 if steer < -0.3 else (3 if slow else 0)
        return np.array([steer, 0.5 if slow else 0.0], np.float32)

    def reset(self, **kwargs):
        from agent.train.perturb import disturbance_action

        obs, info = self.env.reset(**kwargs)
        if self.rng.random() >= self.p:
            return obs, info
        kind = "off-road" if self.rng.random() < 0.6 else "stop"
        length = int(self.rng.integers(15, 61) if kind == "off-road" else self.rng.integers(60, 151))
        action = disturbance_action(kind, int(self.rng.choice([-1, 1])), self.action_space)
        plan = [None] * int(self.rng.integers(20, 601)) + [action] * length
        for a in plan:
            obs, _, terminated, truncated, info = self.env.step(self._follow(obs) if a is None else a)
            if terminated or truncated:
                return self.env.reset(**kwargs)
        info = dict(info, disturbed_start=kind)
        return obs, info


class WheelOffPenalty(gym.Wrapper):
    """Reward shaping for a teacher that keeps a margin: ``-penalty`` per step for each wheel off the
    road (a wheel that touches no road tile).

    Why: the PPO expert learns to hug the road's edge in bends, with one or two wheels on the grass
    (its centre up to about 7.5 units from the centre line, where the road's half-width is 6.67).
    That costs it nothing, because a tile counts as visited once any wheel touches it. A student
    that imitates this line with an error of 1-2 units leaves the road with all four wheels,
    skips the tiles of the bend, and never completes the lap: gymnasium's CarRacing ends a lap
    only when every tile has been visited, so one skipped bend caps the return below 900. This
    wrapper makes a wheel on the grass cost the teacher, so the line it demonstrates keeps the
    wheels on the road, with room for the student's error. The shaped reward is used for PPO
    training only; the evaluation callback and ``agent evaluate`` score the env's own reward.

    Args:
        env: an :class:`envs.carracing.CarRacingEnv`, any wrappers (its ``wheels_off_road`` is read).
        penalty: reward subtracted per wheel off the road per step (four wheels: up to 4 x penalty).

    Raises:
        ValueError: a negative penalty.
    """

    def __init__(self, env: gym.Env, penalty: float):
        super().__init__(env)
        if penalty < 0:
            raise ValueError(f"the wheel-off penalty must be >= 0, got {penalty}")
        self.penalty = float(penalty)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        off = self.env.unwrapped.wheels_off_road
        info = dict(info, wheels_off_road=off)
        return obs, float(reward) - self.penalty * off, terminated, truncated, info


def make_expert_train_env(action_repeat: int = 1, offtrack_patience: int = 50, continuous: bool = False,
                          disturbed_starts: float = 0.0, seed: int = 0, wheel_off_penalty: float = 0.0) -> gym.Env:
    """The env the expert trains on: privileged state, no pixels, early stop when lost, and
    optionally a share of episodes starting in a failure state (:class:`DisturbedStart`) and a
    penalty per wheel on the grass (:class:`WheelOffPenalty`)."""
    env = make_carracing(privileged=True, continuous=continuous)
    if disturbed_starts > 0:
        env = DisturbedStart(env, disturbed_starts, seed=seed)
    if wheel_off_penalty > 0:
        env = WheelOffPenalty(env, wheel_off_penalty)
    env = OffTrackTermination(env, patience=offtrack_patience)
    if action_repeat > 1:
        env = ActionRepeat(env, action_repeat)
    return env


@dataclass
class ExpertConfig:
    """Hyper-parameters of the expert's PPO run (stable-baselines3 names)."""

    timesteps: int = 3_000_000
    seed: int = 0
    n_envs: int = 8
    action_repeat: int = 1
    n_steps: int = 512
    batch_size: int = 512
    n_epochs: int = 10
    learning_rate: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    ent_coef: float = 0.003
    clip_range: float = 0.2
    net_arch: tuple[int, ...] = (256, 256)
    device: str = "auto"
    #: the continuous configuration ((steering, throttle) actions, a Gaussian policy) instead of 5 actions
    continuous: bool = False
    #: initial log standard deviation of the Gaussian policy (continuous only)
    log_std_init: float = -1.0
    #: share of training episodes that start off the road or at a standstill (:class:`DisturbedStart`)
    disturbed_starts: float = 0.0
    #: steps with all wheels off the road before a training episode is cut (evaluation never cuts)
    offtrack_patience: int = 50
    #: start from this expert's weights (fine-tuning; a .zip read by :meth:`ExpertPolicy.load`)
    init: str | None = None
    #: training reward shaping: subtracted per wheel off the road per step (:class:`WheelOffPenalty`)
    wheel_off_penalty: float = 0.0
    #: which checkpoint is written: "best" (by the held-out return, the env's own reward) or "last"
    #: (the end of training, e.g. when shaping trades a little return for a margin the best-return
    #: checkpoint may not have yet)
    keep: str = "best"


#: keys of a plain-JSON ``policy_kwargs`` the loader accepts (only net_arch and share_features_extractor shape the
#: network it rebuilds; the others affect training only)
_PLAIN_POLICY_KWARGS = {"net_arch", "share_features_extractor", "ortho_init", "log_std_init", "normalize_images",
                        "optimizer_kwargs"}


def _is_serialized(entry) -> bool:
    """Whether a stable-baselines3 ``data`` JSON entry is a cloudpickle blob (never decoded here)."""
    return isinstance(entry, dict) and ":serialized:" in entry


def _net_arch_from_json(value, path: Path):
    """Validate a plain-JSON ``net_arch``: a list of ints, or ``{"pi": [...], "vf": [...]}``."""
    def ints(x):
        return isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in x)

    if ints(value):
        return list(value)
    if isinstance(value, dict) and set(value) <= {"pi", "vf"} and all(ints(v) for v in value.values()):
        return {k: list(v) for k, v in value.items()}
    raise ValueError(f"{path}: policy_kwargs.net_arch {value!r} is not a list of layer sizes or {{pi: [...], vf: [...]}}")


def _state_dict_mismatch(expected: dict, found: dict, limit: int = 3) -> str:
    """A one-line summary of how a loaded state dict differs from the network's (missing, unexpected, shapes)."""
    parts = []
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    shapes = [f"{k} {tuple(getattr(found[k], 'shape', ()))} in the file vs {tuple(expected[k].shape)}"
              for k in expected if k in found and tuple(getattr(found[k], "shape", ())) != tuple(expected[k].shape)]
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)):
        if items:
            more = f" and {len(items) - limit} more" if len(items) > limit else ""
            parts.append(f"{label}: {', '.join(items[:limit])}{more}")
    return "; ".join(parts) or "the tensors are not loadable"


class ExpertPolicy:
    """A trained PPO expert that acts from a :class:`envs.carracing.CarRacingEnv`'s privileged state.

    ``act(env)`` reads the privileged observation of the env's current state, so it can label any
    state the student visits (DAgger relabelling) as well as drive.

    Attributes:
        policy: the stable-baselines3 ``ActorCriticPolicy`` (an MLP on (PRIVILEGED_DIM,) float32
            states, 5 discrete actions), in eval mode. ``model`` is the same object.
        start_rule: the start rule (see :meth:`act`; discrete and continuous experts). Off after
            :meth:`load`; ``--start-rule`` turns it on in ``agent collect``, DAgger in ``agent
            train`` and ``agent evaluate``, and ``agent compare``'s protocol has it on.
        creep_speed: the creep rule's speed in units/s (:func:`creep_rule`; discrete experts;
            0, off, after :meth:`load`); ``agent train --creep-speed`` sets it for DAgger.
        brake_floor: the start rule's brake floor in units/s: below it a brake becomes gas
            (:data:`CRAWL_SPEED` after :meth:`load`; ``agent train --brake-floor`` raises it for DAgger).
        grass_rule: with all four wheels on the grass, a brake becomes gas (:meth:`use_grass_rule`;
            discrete experts; off after :meth:`load`).
    """

    def __init__(self, policy, start_rule: bool = False):
        from gymnasium import spaces

        self.policy = policy
        #: whether the expert drives the continuous configuration ((steering, throttle) actions)
        self.continuous = isinstance(policy.action_space, spaces.Box)
        self.start_rule = False
        self.creep_speed = 0.0
        self.brake_floor = CRAWL_SPEED
        self.grass_rule = False
        self.use_start_rule(start_rule)

    def use_start_rule(self, on: bool = True) -> "ExpertPolicy":
        """Turn the start rule (see :meth:`act`) on or off; returns the expert."""
        self.start_rule = bool(on)
        return self

    def use_creep_rule(self, creep_speed: float) -> "ExpertPolicy":
        """Set the creep rule's speed (units/s, :func:`creep_rule`; 0 turns it off); returns the expert.

        Raises:
            ValueError: a negative speed, or a continuous expert with a speed above 0.
        """
        if not creep_speed >= 0:
            raise ValueError(f"creep_speed must be >= 0 units/s, got {creep_speed}")
        if creep_speed and self.continuous:
            raise ValueError("the creep rule is for discrete experts (the continuous one steers and accelerates "
                             "at once)")
        self.creep_speed = float(creep_speed)
        return self

    def use_brake_floor(self, floor: float) -> "ExpertPolicy":
        """Set the start rule's brake floor (units/s; see :meth:`act`, :func:`brake_floor_rule`); returns the expert.

        It acts only with the start rule on (:meth:`use_start_rule`).

        Raises:
            ValueError: a negative or non-finite floor.
        """
        if not (floor >= 0 and np.isfinite(floor)):
            raise ValueError(f"the brake floor must be a speed >= 0 units/s, got {floor}")
        self.brake_floor = float(floor)
        return self

    def use_grass_rule(self, on: bool = True) -> "ExpertPolicy":
        """Turn the grass rule on or off; returns the expert.

        With all four wheels on the grass (the flags :data:`envs.carracing.WHEEL_GRASS` of the
        privileged state), a brake label becomes gas. The expert's network brakes slow cars on the
        grass in states its own laps never reach, and those labels, just above the start rule's
        brake floor, teach its students to brake at that speed on the road too: the brake trap
        (README, "The brake floor"). With the rule on, the expert's own recovery check
        (tracks 600,000-019) was unchanged.

        Raises:
            ValueError: a continuous expert (the rule is for the discrete one).
        """
        if on and self.continuous:
            raise ValueError("the grass rule is for discrete experts (the continuous one brakes with a negative "
                             "throttle, which the start rule's brake floor governs)")
        self.grass_rule = bool(on)
        return self

    @property
    def model(self):
        """The network (kept under its old name: it was a PPO model before loading became pickle-free)."""
        return self.policy

    @staticmethod
    def spaces(continuous: bool = False):
        """The spaces the expert is defined on: (Box(-5, 5, (PRIVILEGED_DIM,), float32), Discrete(5)),
        or with ``continuous`` the action space Box(-1, 1, (2,)) of :class:`envs.carracing.ThrottleAction`.

        The same Box as :class:`envs.carracing.PrivilegedObservation`, the view ``agent expert train`` trains on.
        """
        from gymnasium import spaces

        from envs.carracing import PRIVILEGED_DIM

        action = spaces.Box(-1.0, 1.0, (2,), np.float32) if continuous else spaces.Discrete(5)
        return spaces.Box(-5.0, 5.0, (PRIVILEGED_DIM,), np.float32), action

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> "ExpertPolicy":
        """Load a stable-baselines3 PPO zip without unpickling anything from it.

        stable-baselines3's own ``PPO.load`` unpickles (cloudpickle) the ``":serialized:"`` entries
        of the zip's ``data`` JSON, so a crafted file runs code on load. This loader instead reads
        ``data`` with ``json.loads`` only (serialized entries are never decoded), reads the weights
        ``policy.pth`` with ``torch.load(..., weights_only=True)``, and rebuilds the network with
        ``stable_baselines3.common.policies.ActorCriticPolicy`` on :meth:`spaces`. The architecture
        comes from plain-JSON ``policy_kwargs`` (``net_arch``; the activation is SB3's default Tanh,
        which ``agent expert train`` uses); when ``policy_kwargs`` is itself serialized, SB3's
        defaults are assumed and ``load_state_dict(strict=True)`` decides. Optimizer state and
        ``pytorch_variables.pth`` are not read.

        Args:
            path: the ``.zip`` written by ``agent expert train`` (SB3's ``model.save``).
            device: torch device for the network ("cpu", "cuda", "auto").

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not a zip, lacks ``data`` or ``policy.pth``, has unreadable
                entries, or is not a PPO expert for the privileged CarRacing view (other shapes,
                other architecture).
        """
        import io
        import json
        import zipfile

        import torch
        from stable_baselines3.common.policies import ActorCriticPolicy
        from stable_baselines3.common.utils import get_device

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"expert file {path} does not exist (train one with `agent expert train`)")
        hint = "was it trained by `agent expert train`?"
        try:
            with zipfile.ZipFile(path) as zf:
                names = set(zf.namelist())
                for needed in ("data", "policy.pth"):
                    if needed not in names:
                        raise ValueError(f"{path} has no {needed!r} entry, so it is not a stable-baselines3 PPO "
                                         f"file ({hint})")
                data_bytes, weights_bytes = zf.read("data"), zf.read("policy.pth")
        except (zipfile.BadZipFile, OSError, EOFError, RuntimeError) as exc:  # RuntimeError: encrypted entries
            raise ValueError(f"{path} is not a readable zip file ({exc}); {hint}") from exc
        try:
            data = json.loads(data_bytes)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: its 'data' entry is not JSON ({exc}); {hint}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path}: its 'data' entry is not a JSON object; {hint}")

        stored_act = data.get("action_space")
        continuous = isinstance(stored_act, dict) and "Box" in str(stored_act.get(":type:", ""))
        observation_space, action_space = cls.spaces(continuous)
        stored_obs = data.get("observation_space")
        if isinstance(stored_obs, dict):  # SB3 writes the plain attributes beside the blob; read only those
            shape = stored_obs.get("_shape", stored_obs.get("shape"))
            if isinstance(shape, list) and tuple(shape) != observation_space.shape:
                raise ValueError(f"{path} expects observations of shape {tuple(shape)}, but the privileged CarRacing "
                                 f"view has {observation_space.shape}: {hint}")
        if continuous:
            shape = stored_act.get("_shape")
            if isinstance(shape, list) and tuple(shape) != action_space.shape:
                raise ValueError(f"{path} has continuous actions of shape {tuple(shape)}, but the continuous "
                                 f"configuration drives with (steering, throttle), shape {action_space.shape}: {hint}")
        elif isinstance(stored_act, dict) and "n" in stored_act and str(stored_act["n"]) != str(action_space.n):
            raise ValueError(f"{path} has {stored_act['n']} actions, but the expert drives with "
                             f"{action_space.n} discrete actions: {hint}")

        kwargs = {}
        policy_kwargs = data.get("policy_kwargs", {})
        if _is_serialized(policy_kwargs):
            _log.warning("%s: policy_kwargs is a pickled entry, which is not read; assuming stable-baselines3's "
                         "default architecture (Tanh MLP)", path)
        elif isinstance(policy_kwargs, dict):
            unknown = set(policy_kwargs) - _PLAIN_POLICY_KWARGS
            if unknown:
                raise ValueError(f"{path}: policy_kwargs {sorted(unknown)} are not supported by the expert loader "
                                 f"(it rebuilds SB3's MlpPolicy with net_arch only): {hint}")
            if "net_arch" in policy_kwargs:
                kwargs["net_arch"] = _net_arch_from_json(policy_kwargs["net_arch"], path)
            if isinstance(policy_kwargs.get("share_features_extractor"), bool):
                kwargs["share_features_extractor"] = policy_kwargs["share_features_extractor"]
        elif policy_kwargs is not None:
            raise ValueError(f"{path}: policy_kwargs is {type(policy_kwargs).__name__}, expected a JSON object: {hint}")

        dev = get_device(device)
        try:
            state_dict = torch.load(io.BytesIO(weights_bytes), map_location=dev, weights_only=True)
        except Exception as exc:  # torch raises UnpicklingError, RuntimeError, ... for bad or unsafe content
            raise ValueError(f"{path}: its policy.pth is not a plain tensor state dict "
                             f"({type(exc).__name__}: {exc}); {hint}") from exc
        if not isinstance(state_dict, dict):
            raise ValueError(f"{path}: its policy.pth holds a {type(state_dict).__name__}, not a state dict; {hint}")
        policy = ActorCriticPolicy(observation_space, action_space, lr_schedule=lambda _: 0.0, **kwargs)
        try:
            policy.load_state_dict(state_dict, strict=True)
        except (RuntimeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: its weights do not fit a PPO MlpPolicy on the privileged CarRacing view "
                             f"(net_arch {kwargs.get('net_arch', 'default')}): "
                             f"{_state_dict_mismatch(policy.state_dict(), state_dict)}; {hint}") from exc
        policy = policy.to(dev)
        policy.set_training_mode(False)
        _log.debug("loaded expert %s (net_arch %s) on %s", path, kwargs.get("net_arch", "default"), dev)
        return cls(policy)

    def act_on_state(self, state: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """Actions for privileged states: (N, PRIVILEGED_DIM) -> (N,) int64, (PRIVILEGED_DIM,) -> () int64;
        continuous experts give (N, 2) / (2,) float32 (steering, throttle), clipped to [-1, 1]."""
        action, _ = self.policy.predict(state, deterministic=deterministic)
        return action.astype(np.float32) if self.continuous else action

    def act(self, env: gym.Env, deterministic: bool = True):
        """The expert's action for the env's current state: a discrete action (int, 0..4), or for a
        continuous expert a (2,) float32 array (steering, throttle).

        With :attr:`start_rule`, two rules override the network:

        - at a standstill (speed below :data:`agent.rollout.STANDSTILL_SPEED`, 1 unit/s) the label
          is gas: a discrete action other than gas becomes gas (steering or braking never moves a
          standing car, and gas is the only discrete action that does: no gas while steering); a
          continuous throttle becomes :data:`START_THROTTLE` (full gas, what the expert itself
          uses on the first steps of every lap), its steering kept;
        - below the brake floor (:attr:`brake_floor`, :data:`CRAWL_SPEED` = 10 units/s unless
          :meth:`use_brake_floor` changed it) brake becomes gas: the discrete brake action
          becomes gas, a negative continuous throttle becomes :data:`START_THROTTLE`.

        With :attr:`creep_speed` above 0 (discrete), :func:`creep_rule` then makes every action
        below that speed gas. With :attr:`grass_rule` (discrete), a brake with all four wheels on
        the grass becomes gas.

        Without them the expert has a fixed point in states its own laps rarely reach: it brakes a
        slow car to a halt, then brakes or steers at rest until the time limit. The discrete
        expert's argmax does it on training track 16 (426 steps at rest) and often in the states
        a student reaches (README, "The expert's stalls"); on validation tracks 700,000-700,049 the
        rules leave its return unchanged (895.4) and take its stalls from 2 to 0. The continuous
        expert does it too: at rest for 552 and 762 steps on training tracks 39 and 92, braking,
        and in the DAgger rounds of ``nac-continuous.pt`` it gave a throttle <= 0 on 47-59 % of
        the frames where the student's car stood still (README, "The continuous start rule").
        """
        state = env.unwrapped.privileged_observation()
        if self.start_rule or self.creep_speed or self.grass_rule:  # one path for the rules: act_batch's, batch of 1
            from agent.rollout import car_speed

            action = self.act_batch(state[None], [car_speed(env)], deterministic)[0]
        else:
            action = self.act_on_state(state, deterministic)
        return action if self.continuous else int(action)

    def act_batch(self, states: np.ndarray, speeds, deterministic: bool = True) -> np.ndarray:
        """The expert's actions for a batch of states, as :meth:`act` gives them one at a time.

        For envs stepped elsewhere (:mod:`agent.vector`): the state comes from each env's
        ``info`` (:class:`envs.carracing.StateInfo`), not from the env object.

        Args:
            states: (B, PRIVILEGED_DIM) float32 privileged states (``info["privileged_state"]``).
            speeds: (B,) car speeds in simulator units per second (``info["speed"]``), used by the
                start rule (:attr:`start_rule`) and the creep rule (:attr:`creep_speed`); the grass
                rule (:attr:`grass_rule`) reads the wheel flags from ``states``.
            deterministic: the network's most probable action.

        Returns:
            (B,) int64 discrete actions, or (B, 2) float32 (steering, throttle) for a continuous expert.

        Raises:
            ValueError: ``states`` is not (B, PRIVILEGED_DIM) or ``speeds`` not (B,).
        """
        from envs.carracing import PRIVILEGED_DIM

        states = np.asarray(states, dtype=np.float32)
        speeds = np.asarray(speeds, dtype=np.float64).reshape(-1)
        if states.ndim != 2 or states.shape[1] != PRIVILEGED_DIM or len(speeds) != len(states):
            raise ValueError(f"act_batch needs (B, {PRIVILEGED_DIM}) states and (B,) speeds, got {states.shape} "
                             f"and {speeds.shape}")
        actions = self.act_on_state(states, deterministic)
        if self.continuous:
            actions = np.asarray(actions, dtype=np.float32).reshape(len(states), -1)
        else:
            actions = np.asarray(actions, dtype=np.int64).reshape(-1)
        if self.start_rule:
            actions = self._apply_start_rule(actions, speeds)
        if self.creep_speed and not self.continuous:
            actions = creep_rule(actions, speeds, self.creep_speed)
        if self.grass_rule and not self.continuous:
            from envs.carracing import WHEEL_GRASS

            on_grass = (states[:, WHEEL_GRASS] > 0.5).all(axis=1)
            actions = np.where(on_grass & (actions == BRAKE), GAS, actions)
        return actions

    def _apply_start_rule(self, actions: np.ndarray, speeds: np.ndarray) -> np.ndarray:
        """The start rule (see :meth:`act`) on (B,) int64 discrete actions or (B, 2) float32
        continuous ones (steering, throttle) at (B,) speeds in units/s; NaN speeds never trigger it."""
        from agent.rollout import STANDSTILL_SPEED

        with np.errstate(invalid="ignore"):
            still = speeds < STANDSTILL_SPEED
            if self.continuous:
                rule = still | ((actions[:, -1] < 0) & (speeds < self.brake_floor))
                actions = actions.copy()
                actions[rule, -1] = np.maximum(actions[rule, -1], START_THROTTLE)
                return actions
            rule = (actions != GAS) & (still | ((actions == BRAKE) & (speeds < self.brake_floor)))
        return np.where(rule, GAS, actions)

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        """stable-baselines3 interface, on privileged observations: returns (actions, None)."""
        return self.policy.predict(obs, state=state, episode_start=episode_start, deterministic=deterministic)


def train_expert(cfg: ExpertConfig, out: str | Path, tensorboard_dir: str | Path | None = "runs/expert",
                 eval_episodes: int = 10, eval_every: int = 100_000, progress_bar: bool = True) -> Path:
    """Train the PPO expert; keep the checkpoint with the best mean return on held-out tracks.

    Evaluation during training runs the real episode rules (no early stop, no action repeat
    beyond the expert's own) on tracks seeded from ``envs.tracks.EXPERT_EVAL_SEED_BASE``, disjoint from both
    training and the final evaluation tracks. Returns the path written.
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    out = Path(out)
    if cfg.keep not in ("best", "last"):
        raise ValueError(f"keep must be 'best' or 'last', got {cfg.keep!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    counter = iter(range(10**6))
    venv = make_vec_env(lambda: make_expert_train_env(cfg.action_repeat, cfg.offtrack_patience, cfg.continuous,
                                                      cfg.disturbed_starts, seed=cfg.seed * 1000 + next(counter),
                                                      wheel_off_penalty=cfg.wheel_off_penalty),
                        n_envs=cfg.n_envs, seed=cfg.seed,
                        vec_env_cls=DummyVecEnv)

    def make_eval():
        env = make_carracing(privileged=True, continuous=cfg.continuous)
        return ActionRepeat(env, cfg.action_repeat) if cfg.action_repeat > 1 else env

    eval_env = make_vec_env(make_eval, n_envs=1, seed=EXPERT_EVAL_SEED_BASE)
    policy_kwargs = dict(net_arch=list(cfg.net_arch))
    if cfg.continuous:
        policy_kwargs["log_std_init"] = cfg.log_std_init
    model = PPO(
        "MlpPolicy", venv, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
        learning_rate=cfg.learning_rate, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda, ent_coef=cfg.ent_coef,
        clip_range=cfg.clip_range, policy_kwargs=policy_kwargs, seed=cfg.seed,
        tensorboard_log=str(tensorboard_dir) if tensorboard_dir else None, device=device, verbose=0,
    )
    if cfg.init:
        init = ExpertPolicy.load(cfg.init, device=device)
        if init.continuous != cfg.continuous:
            raise ValueError(f"{cfg.init} is a {'continuous' if init.continuous else 'discrete'} expert; "
                             f"pass --continuous only with a continuous one")
        try:
            model.policy.load_state_dict(init.policy.state_dict())
        except RuntimeError as exc:
            raise ValueError(f"{cfg.init} does not fit the network of this run (net_arch {cfg.net_arch}): {exc}") from exc
        _log.info("starting from the weights of %s", cfg.init)
    best_dir = out.parent / (out.stem + "_best")
    callback = EvalCallback(eval_env, n_eval_episodes=eval_episodes, eval_freq=max(eval_every // cfg.n_envs, 1),
                            best_model_save_path=str(best_dir), deterministic=True, verbose=1)
    t0 = time.time()
    model.learn(total_timesteps=cfg.timesteps, callback=callback, progress_bar=progress_bar and progress_enabled(),
                tb_log_name=out.stem)
    _log.info("trained %d steps in %.0f s", cfg.timesteps, time.time() - t0)
    best = best_dir / "best_model.zip"
    if cfg.keep == "last":
        model.save(out)
        print(f"last checkpoint ({cfg.timesteps} steps; best mean eval return {callback.best_mean_reward:.1f} kept in "
              f"{best_dir}) -> {out}")
    elif best.is_file():
        best.replace(out)
        best_dir.rmdir()
        print(f"best checkpoint (mean eval return {callback.best_mean_reward:.1f}) -> {out}")
    else:
        model.save(out)
        if best_dir.is_dir() and not any(best_dir.iterdir()):
            best_dir.rmdir()
    return out
