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

from envs.carracing import EVAL_SEED_BASE, OffTrackTermination, PrivilegedObservation, make_carracing


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


def make_expert_train_env(action_repeat: int = 1, offtrack_patience: int = 50) -> gym.Env:
    """The env the expert trains on: privileged state, no pixels, early stop when lost."""
    env = make_carracing(privileged=True)
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


class ExpertPolicy:
    """A trained PPO expert that acts from a :class:`envs.carracing.CarRacingEnv`'s privileged state.

    ``act(env)`` reads the privileged observation of the env's current state, so it can label any
    state the student visits (DAgger relabelling) as well as drive.
    """

    def __init__(self, model):
        self.model = model

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> "ExpertPolicy":
        """Load a stable-baselines3 PPO zip.

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not a PPO expert for the privileged CarRacing view.
        """
        from stable_baselines3 import PPO

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"expert file {path} does not exist (train one with `agent expert train`)")
        try:
            model = PPO.load(path, device=device)
        except Exception as exc:  # SB3 raises many kinds for a corrupt zip
            raise ValueError(f"{path} is not a readable stable-baselines3 PPO file: {exc}") from exc
        from envs.carracing import PRIVILEGED_DIM

        if model.observation_space.shape != (PRIVILEGED_DIM,):
            raise ValueError(
                f"{path} expects observations of shape {model.observation_space.shape}, but the privileged "
                f"CarRacing view has ({PRIVILEGED_DIM},): was it trained by `agent expert train`?"
            )
        return cls(model)

    def act_on_state(self, state: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """Actions for privileged states of shape (N, PRIVILEGED_DIM) or (PRIVILEGED_DIM,)."""
        action, _ = self.model.predict(state, deterministic=deterministic)
        return action

    def act(self, env: gym.Env, deterministic: bool = True) -> int:
        """The expert's discrete action for the env's current state."""
        return int(self.act_on_state(env.unwrapped.privileged_observation(), deterministic))

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        """stable-baselines3 interface, on privileged observations."""
        return self.model.predict(obs, state=state, episode_start=episode_start, deterministic=deterministic)


def train_expert(cfg: ExpertConfig, out: str | Path, tensorboard_dir: str | Path | None = "runs/expert",
                 eval_episodes: int = 10, eval_every: int = 100_000, progress_bar: bool = True) -> Path:
    """Train the PPO expert; keep the checkpoint with the best mean return on held-out tracks.

    Evaluation during training runs the real episode rules (no early stop, no action repeat
    beyond the expert's own) on tracks seeded from ``EVAL_SEED_BASE // 2``, disjoint from both
    training and the final evaluation tracks. Returns the path written.
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    venv = make_vec_env(lambda: make_expert_train_env(cfg.action_repeat), n_envs=cfg.n_envs, seed=cfg.seed,
                        vec_env_cls=DummyVecEnv)

    def make_eval():
        env = make_carracing(privileged=True)
        return ActionRepeat(env, cfg.action_repeat) if cfg.action_repeat > 1 else env

    eval_env = make_vec_env(make_eval, n_envs=1, seed=EVAL_SEED_BASE // 2)
    model = PPO(
        "MlpPolicy", venv, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
        learning_rate=cfg.learning_rate, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda, ent_coef=cfg.ent_coef,
        clip_range=cfg.clip_range, policy_kwargs=dict(net_arch=list(cfg.net_arch)), seed=cfg.seed,
        tensorboard_log=str(tensorboard_dir) if tensorboard_dir else None, device=device, verbose=0,
    )
    best_dir = out.parent / (out.stem + "_best")
    callback = EvalCallback(eval_env, n_eval_episodes=eval_episodes, eval_freq=max(eval_every // cfg.n_envs, 1),
                            best_model_save_path=str(best_dir), deterministic=True, verbose=1)
    t0 = time.time()
    model.learn(total_timesteps=cfg.timesteps, callback=callback, progress_bar=progress_bar,
                tb_log_name=out.stem)
    print(f"trained {cfg.timesteps} steps in {time.time() - t0:.0f} s")
    best = best_dir / "best_model.zip"
    if best.is_file():
        best.replace(out)
        best_dir.rmdir()
        print(f"best checkpoint (mean eval return {callback.best_mean_reward:.1f}) -> {out}")
    else:
        model.save(out)
    return out
