"""CarRacing stepped in a worker process, so that the runner draws frame t while the env computes
frame t + 1 (:class:`EnvWorker`, ``drive --env-worker``).

Why: on the 2-core development CPU, one ``drive`` step with every overlay on cost about 18 ms of
CPU, and about 9.5 ms of it was CarRacing's own ``step``, nearly all of it gymnasium's pygame
rendering of the 96x96 observation (it draws every road polygon onto a 1000x800 surface and
scales it down). The runner's own work after the action is chosen (composing the view with the
Grad-CAM map and the trace panel, showing it) does not need the next frame. With the env in a
second process, the loop is

    observation t -> act (policy + Grad-CAM) -> ``step_async(action)`` -> draw and show frame t
    -> ``step_wait()`` -> observation t + 1

and the env's step runs on the other core while frame t is drawn. The observation-to-action
latency is unchanged; the loop's period becomes act + max(drawing, env step) instead of
act + drawing + env step.

The worker is gymnasium's ``AsyncVectorEnv`` with one env (its public ``step_async`` /
``step_wait``; https://gymnasium.farama.org/api/vector/async_vector_env/), autoreset disabled, made
exactly as :mod:`agent.actors.vector` makes its envs: the same CarRacing as the in-process run, with the
car's speed and off-road flag in every ``info`` (:class:`envs.carracing.StateInfo`). The same
actions give the same episode, bit for bit, as the env stepped in this process (tested).
"""

from __future__ import annotations

import numpy as np

from agent.actors.vector import close, split_infos

#: ``--env-worker`` choices: "auto" uses the worker where it can help (see :func:`use_env_worker`).
ENV_WORKER_CHOICES = ("auto", "on", "off")


def use_env_worker(choice: str, env: str, expert: bool, draws: bool, cpus: int | None) -> tuple[bool, str]:
    """Whether ``drive`` steps the env in a worker process, and why (for the run's header).

    Args:
        choice: ``--env-worker``: "on", "off" or "auto".
        env: ``--env`` ("carracing" or "udacity").
        expert: the policy is the PPO expert (it reads the env object in this process).
        draws: the run composes frames (a window, ``--record``, or the benchmark); headless runs
            that draw nothing have nothing to overlap with the env's step.
        cpus: the CPU count (``os.cpu_count()``; None if unknown).

    Returns:
        (use it, the reason in a few words).

    Raises:
        ValueError: ``choice`` is not one of :data:`ENV_WORKER_CHOICES`, or "on" where it cannot be
            used (the Udacity bridge, the expert).
    """
    if choice not in ENV_WORKER_CHOICES:
        raise ValueError(f"--env-worker must be one of {', '.join(ENV_WORKER_CHOICES)}, got {choice!r}")
    if choice == "off":
        return False, "--env-worker off"
    blocker = ("the Udacity simulator is its own process" if env != "carracing" else
               "the expert reads the env's state in this process" if expert else None)
    if blocker:
        if choice == "on":
            raise ValueError(f"--env-worker on is not possible here: {blocker}; use auto or off")
        return False, blocker
    if choice == "on":
        return True, "--env-worker on"
    if not draws:
        return False, "nothing is drawn, so there is nothing to overlap with the env's step"
    if (cpus or 1) < 2:
        return False, "one CPU: a worker process would only take turns with this one"
    return True, "drawing frame t overlaps the env's step to t + 1"


class EnvWorker:
    """One CarRacing env in a worker process, stepped asynchronously, with one env's API.

    Observations are one env's, (H, W, C) uint8 (96x96x3); ``info`` carries ``speed`` (simulator
    units per second) and ``off_road`` (all four wheels off the road) after every reset and step.

    Args:
        envs: a one-env :class:`agent.actors.vector.CarRacingEnvs` (what to make; :func:`agent.actors.vector.envs_for`).

    Attributes:
        metadata: the env's metadata (``render_fps``: 50).
        observation_space, action_space: one env's spaces.

    Raises:
        ValueError: ``envs`` holds more than one env.
    """

    def __init__(self, envs):
        if envs.n != 1:
            raise ValueError(f"EnvWorker steps one env, got envs.n={envs.n}")
        self.venv = envs.make_vector(1)
        self.metadata = dict(self.venv.metadata)
        self.observation_space = self.venv.single_observation_space
        self.action_space = self.venv.single_action_space
        self.pending = False

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        """Start an episode on track ``seed`` (waits for a step in flight first). Returns (obs, info)."""
        if self.pending:
            self.step_wait()
        obs, info = self.venv.reset(seed=[None if seed is None else int(seed)])
        return obs[0], split_infos(info, 1)[0]

    def step_async(self, action) -> None:
        """Send ``action`` (an int, or a (2,) float array in the continuous configuration); the
        worker steps while this process goes on. Collect the result with :meth:`step_wait`.

        Raises:
            RuntimeError: a step is already in flight.
        """
        if self.pending:
            raise RuntimeError("EnvWorker.step_async: a step is already in flight; call step_wait first")
        batch = np.asarray([action], dtype=np.int64 if np.ndim(action) == 0 else np.float32)
        self.venv.step_async(batch)
        self.pending = True

    def step_wait(self) -> tuple[np.ndarray, float, bool, bool, dict]:
        """The result of the step in flight: (obs, reward, terminated, truncated, info).

        Raises:
            RuntimeError: no step is in flight.
        """
        if not self.pending:
            raise RuntimeError("EnvWorker.step_wait: no step in flight; call step_async first")
        self.pending = False
        obs, reward, terminated, truncated, info = self.venv.step_wait()
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), split_infos(info, 1)[0]

    def step(self, action) -> tuple[np.ndarray, float, bool, bool, dict]:
        """:meth:`step_async` then :meth:`step_wait` (a plain, synchronous step)."""
        self.step_async(action)
        return self.step_wait()

    def close(self) -> None:
        """Stop the worker (terminating it if it no longer answers)."""
        close(self.venv)


__all__ = ["ENV_WORKER_CHOICES", "EnvWorker", "use_env_worker"]
