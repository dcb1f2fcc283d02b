"""Closed-loop evaluation: episode returns of a policy on tracks seed, seed+1, ..., seed+N-1."""

from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass
class EvalResult:
    """Returns and lengths of evaluation episodes (the JSON written by ``agent evaluate``)."""

    env: str
    policy: str
    seeds: list[int]
    returns: list[float]
    steps: list[int]
    mean_return: float
    std_return: float
    seconds: float
    steps_per_second: float

    def to_json(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def _run_seeds(args, on_episode=None) -> list[tuple[int, float, int]]:
    """Worker: load the policy once, run each seed; returns (seed, return, steps) per episode."""
    policy_path, seeds, max_steps, threads = args
    import torch

    from agent.loading import load_policy, make_actor, make_carracing_for
    from agent.rollout import rollout

    if threads:
        torch.set_num_threads(threads)
    from agent.train.expert import ExpertPolicy

    policy = load_policy(policy_path)
    actor = make_actor(policy)
    # The expert reads privileged state only: skip the pixel rendering (same physics, same returns).
    # A policy or expert with continuous actions drives the continuous configuration (make_carracing_for).
    env = make_carracing_for(policy, render_pixels=not isinstance(policy, ExpertPolicy))
    out = []
    for s in seeds:
        ep = rollout(env, actor, s, max_steps=max_steps, keep_frames=False)
        out.append((s, ep.episode_return, ep.steps))
        if on_episode is not None:
            on_episode(out[-1])
    env.close()
    return out


def evaluate(policy_path: str | Path, episodes: int, seed: int, env: str = "carracing", max_steps: int | None = None,
             workers: int = 1, progress: bool = True) -> EvalResult:
    """Run ``episodes`` episodes on seeds seed .. seed+episodes-1, split over ``workers`` processes.

    Raises:
        ValueError: an unknown env or a bad episode count.
    """
    from agent.log import progress as bar_for

    from agent.loading import resolve_policy_path

    if env != "carracing":
        raise ValueError(f"closed-loop evaluation supports --env carracing, got {env!r}")
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    path = resolve_policy_path(policy_path)
    seeds = list(range(seed, seed + episodes))
    workers = max(1, min(workers, episodes))
    t0 = time.time()
    results: list[tuple[int, float, int]] = []
    bar = bar_for(total=episodes, desc="evaluate", unit="ep", disable=not progress)
    def tick(r):
        results.append(r)
        bar.update(1)
        bar.set_postfix(mean=f"{np.mean([x[1] for x in results]):.0f}")

    if workers == 1:
        _run_seeds((str(path), seeds, max_steps, 0), on_episode=tick)
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            for out in pool.map(_run_seeds, [(str(path), [s], max_steps, 1) for s in seeds]):
                tick(out[0])
    bar.close()
    results.sort()
    returns = [float(r[1]) for r in results]
    steps = [int(r[2]) for r in results]
    dt = time.time() - t0
    return EvalResult(env=env, policy=str(path), seeds=seeds, returns=returns, steps=steps,
                      mean_return=float(np.mean(returns)), std_return=float(np.std(returns)), seconds=dt,
                      steps_per_second=sum(steps) / max(dt, 1e-9))
