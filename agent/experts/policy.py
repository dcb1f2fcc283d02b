"""The runtime teacher: a trained PPO expert that acts from CarRacing's privileged state.

A pixel PPO expert is out of reach on a 2-core CPU within an hour (docs/design.md section 4), so the
expert learns from privileged state with the pixel rendering skipped ("learning by cheating",
Chen et al. 2019; :mod:`agent.train.ppo` trains it), then acts in the real, rendered env while
recordings store the frames the student sees. :class:`ExpertPolicy` loads its stable-baselines3
zip without unpickling anything and labels any state with its rules
(:mod:`agent.experts.rules`).
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from agent.bounded import MAX_ZIP_MEMBERS, ZipMemberTooLarge, check_zip_sizes, read_zip_member
from agent.experts.rules import BRAKE, CRAWL_SPEED, GAS, START_THROTTLE, creep_rule
from agent.log import get_logger
from envs.carracing import PRIVILEGED_DIM, STANDSTILL_SPEED, WHEEL_GRASS, car_speed

_log = get_logger(__name__)

#: keys of a plain-JSON ``policy_kwargs`` the loader accepts (only net_arch and share_features_extractor shape the
#: network it rebuilds; the others affect training only)
_PLAIN_POLICY_KWARGS = {"net_arch", "share_features_extractor", "ortho_init", "log_std_init", "normalize_images",
                        "optimizer_kwargs"}


#: the largest ``policy.pth`` read, in bytes, as its zip header declares them and as inflated; the same bound holds
#: for the members of the ``torch.save`` zip it is itself (the shipped experts' hold 0.6 MB; an MLP of 16 M float32
#: parameters still fits)
MAX_WEIGHTS_BYTES = 64 * 2**20
#: the most records in ``policy.pth`` (``torch.save`` writes one per tensor and 4 more; the shipped ones hold 19)
MAX_WEIGHTS_RECORDS = 1024
#: the largest ``data`` (and other JSON/text) member read, in bytes: stable-baselines3's ``data`` JSON of the shipped
#: experts is 17 KB. A 4.8 MB zip whose ``data`` inflated to 3 GiB once cost 38 s and 6.6 GB of memory (issue 38)
MAX_JSON_BYTES = 4 * 2**20


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
            :meth:`load`; ``--teacher.start-rule`` turns it on in ``agent collect``, DAgger in ``agent
            train`` and ``agent evaluate``, and ``agent compare``'s protocol has it on.
        creep_speed: the creep rule's speed in units/s (:func:`creep_rule`; discrete experts;
            0, off, after :meth:`load`); ``--teacher.creep-speed`` sets it for DAgger.
        brake_floor: the start rule's brake floor in units/s: below it a brake becomes gas
            (:data:`CRAWL_SPEED` after :meth:`load`; ``--teacher.brake-floor`` raises it for DAgger).
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
            ZipMemberTooLarge (a ValueError): more than :data:`MAX_ZIP_MEMBERS` members, or ``data``
                above :data:`MAX_JSON_BYTES` or ``policy.pth`` above :data:`MAX_WEIGHTS_BYTES`
                inflated (checked from the headers before reading, then by a bounded read), or a
                ``policy.pth`` whose own records declare more than :data:`MAX_WEIGHTS_BYTES`.
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
                data_bytes = read_zip_member(zf, "data", path, MAX_JSON_BYTES)
                weights_bytes = read_zip_member(zf, "policy.pth", path, MAX_WEIGHTS_BYTES)
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
        if not check_zip_sizes(weights_bytes, f"{path} (its policy.pth)", MAX_WEIGHTS_BYTES, MAX_WEIGHTS_RECORDS):
            raise ValueError(f"{path}: its policy.pth is not a zip-format torch file (what torch.save writes); {hint}")
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

        - at a standstill (speed below :data:`envs.carracing.STANDSTILL_SPEED`, 1 unit/s) the label
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
            action = self.act_batch(state[None], [car_speed(env)], deterministic)[0]
        else:
            action = self.act_on_state(state, deterministic)
        return action if self.continuous else int(action)

    def act_batch(self, states: np.ndarray, speeds, deterministic: bool = True) -> np.ndarray:
        """The expert's actions for a batch of states, as :meth:`act` gives them one at a time.

        For envs stepped elsewhere (:mod:`agent.actors.vector`): the state comes from each env's
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
            on_grass = (states[:, WHEEL_GRASS] > 0.5).all(axis=1)
            actions = np.where(on_grass & (actions == BRAKE), GAS, actions)
        return actions

    def _apply_start_rule(self, actions: np.ndarray, speeds: np.ndarray) -> np.ndarray:
        """The start rule (see :meth:`act`) on (B,) int64 discrete actions or (B, 2) float32
        continuous ones (steering, throttle) at (B,) speeds in units/s; NaN speeds never trigger it."""
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


__all__ = ["ExpertPolicy", "MAX_JSON_BYTES", "MAX_WEIGHTS_BYTES", "MAX_WEIGHTS_RECORDS", "MAX_ZIP_MEMBERS",
           "ZipMemberTooLarge", "read_zip_member"]
