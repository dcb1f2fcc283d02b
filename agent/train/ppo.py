"""Training the PPO expert: stable-baselines3 PPO on CarRacing's privileged-state view.

A pixel PPO expert is out of reach on a 2-core CPU within an hour (docs/design.md section 4), so the
expert learns from privileged state with the pixel rendering skipped ("learning by cheating",
Chen et al. 2019), then acts in the real, rendered env (:class:`agent.experts.policy.ExpertPolicy`)
while recordings store the frames the student sees. This module holds the training env's wrappers
(:class:`ActionRepeat`, :class:`DisturbedStart`, :class:`WheelOffPenalty`,
:func:`make_expert_train_env`), the run's hyper-parameters (:class:`ExpertConfig`) and
:func:`train_expert`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

from agent.actors.perturb import disturbance_action
from agent.experts.policy import ExpertPolicy
from agent.log import get_logger, progress_enabled
from envs.carracing import N_WAYPOINTS, OffTrackTermination, make_carracing
from envs.tracks import EXPERT_EVAL_SEED_BASE

_log = get_logger(__name__)


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
    then one disturbance of :mod:`agent.actors.perturb` (off-road: 15-60 steps of hard steering;
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
        wp = obs[-2 * N_WAYPOINTS:].reshape(N_WAYPOINTS, 2)[2]  # (x right, y forward) / 50
        steer = float(np.clip(np.arctan2(wp[0], max(wp[1], 1e-3)) * 2.0, -1.0, 1.0))
        slow = self.env.unwrapped.speed < self.cruise
        if isinstance(self.action_space, gym.spaces.Discrete):
            # discrete action 1 turns right and 2 left (gymnasium issue #1369; envs.carracing.ACTION_NAMES)
            return 1 if steer > 0.3 else 2 if steer < -0.3 else (3 if slow else 0)
        return np.array([steer, 0.5 if slow else 0.0], np.float32)

    def reset(self, **kwargs):
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


__all__ = ["ActionRepeat", "DisturbedStart", "ExpertConfig", "WheelOffPenalty", "make_expert_train_env", "train_expert"]
