"""Env steps per second of vectorised rollouts (``agent bench rollouts``): a benchmark, not a test.

For each policy and each N in ``--envs`` the same episodes (``--episodes`` tracks from ``--track-seed``,
``--max-steps`` steps each) run once: N = 1 through the one-env path (:func:`agent.actors.rollout.rollout`,
as ``agent evaluate --workers 1`` and ``agent collect`` run today), N > 1 through
:func:`agent.actors.vector.vector_rollouts` on an ``AsyncVectorEnv`` of N subprocesses, the policy acting on
the batch. Two policies:

- the PPO expert (``carracing-expert-discrete-margin.zip``, the teacher of ``nac.pt``: what ``agent collect``
  and DAgger's labels cost), with the pixel rendering skipped as ``agent evaluate`` does for the
  expert, its privileged state coming through ``info``;
- the student (``policies/nac.pt``) on rendered 96x96 frames, as ``agent evaluate`` runs it.

Printed per row: env steps, the seconds of the rollouts (env start-up excluded and shown apart:
for N > 1 the subprocesses' start), env steps/s, the ratio against N = 1, the CPU time per env
step of this process and its env subprocesses together (start-up included; ``resource.getrusage``
of the process and of its finished children), and whether every episode's return equals the
N = 1 row's (the vector path is meant to give the same episodes). Wall-clock figures depend on
the machine and on what else runs on it (the load average is printed); CPU per step much less so.
"""

from __future__ import annotations

import os
import time

from agent.actors.loading import load_policy, make_actor, make_carracing_for
from agent.actors.rollout import rollout
from agent.actors.vector import batch_actor_for, close, envs_for, vector_rollouts
from agent.experts.policy import ExpertPolicy
from envs.tracks import EVAL_SEED_BASE

#: the columns of a row
ROW_KEYS = ("policy", "kind", "envs", "episodes", "steps", "startup_s", "seconds", "steps_per_s", "ratio",
            "cpu_ms_per_step", "same_returns", "returns")


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its finished (waited-for) children."""
    import resource

    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


def _run(policy, n: int, seeds: list[int], max_steps: int) -> tuple[float, float, float, list]:
    """(start-up seconds, rollout seconds, CPU seconds, episodes) of one configuration."""
    expert = isinstance(policy, ExpertPolicy)
    c0, t0 = _cpu_seconds(), time.perf_counter()
    if n == 1:
        env = make_carracing_for(policy, render_pixels=not expert)
        actor = make_actor(policy)
        t1 = time.perf_counter()
        episodes = [rollout(env, actor, s, max_steps=max_steps, keep_frames=False) for s in seeds]
        t2 = time.perf_counter()
        env.close()
        return t1 - t0, t2 - t1, _cpu_seconds() - c0, episodes
    venv = envs_for(policy, n).make_vector(min(n, len(seeds)))
    t1 = time.perf_counter()
    try:
        done = dict(vector_rollouts(venv, batch_actor_for(policy), seeds, max_steps=max_steps, keep_frames=False))
        t2 = time.perf_counter()
    finally:
        close(venv)  # joins the subprocesses: their CPU time now counts in RUSAGE_CHILDREN
    return t1 - t0, t2 - t1, _cpu_seconds() - c0, [done[i] for i in range(len(seeds))]


def bench_rollouts(policies=("carracing-expert-discrete-margin.zip", "nac.pt"), envs=(1, 2, 4), episodes: int = 4,
                   max_steps: int = 250, seed: int | None = None) -> list[dict]:
    """Time the same episodes with 1, 2, 4, ... envs at once, for each policy.

    Args:
        policies: policy files or shipped names (the expert .zip runs without pixels).
        envs: the N to time; the ratio column is against the first one (1 by default).
        episodes: tracks per configuration (seed .. seed + episodes - 1).
        max_steps: steps per episode (an episode may end earlier).
        seed: the first track (default: the first evaluation track).

    Returns:
        one dict per (policy, N) with :data:`ROW_KEYS` (seconds in s, steps/s in env steps per second).

    Raises:
        ValueError: an N below 1, or no episodes.
    """
    if episodes < 1 or any(int(n) < 1 for n in envs):
        raise ValueError(f"episodes and every N of envs must be >= 1, got {episodes} and {list(envs)}")
    seed = EVAL_SEED_BASE if seed is None else seed
    seeds = list(range(seed, seed + episodes))
    rows = []
    for name in policies:
        policy = load_policy(name)
        kind = "expert, no pixels" if isinstance(policy, ExpertPolicy) else "student, pixels"
        base = None
        for n in envs:
            startup, seconds, cpu, eps = _run(policy, int(n), seeds, max_steps)
            steps = sum(ep.steps for ep in eps)
            returns = [float(ep.episode_return) for ep in eps]
            row = dict(policy=str(name), kind=kind, envs=int(n), episodes=len(eps), steps=steps, startup_s=startup,
                       seconds=seconds, steps_per_s=steps / max(seconds, 1e-9), cpu_ms_per_step=1e3 * cpu / steps,
                       returns=returns)
            base = base or row
            row["ratio"] = row["steps_per_s"] / base["steps_per_s"]
            row["same_returns"] = returns == base["returns"]
            rows.append(row)
    return rows


def print_rollouts_table(rows: list[dict], file=None) -> None:
    """Print the rows as a Markdown table (the README's), then the conditions."""
    import torch

    def out(line=""):
        print(line, file=file)

    out("| policy | envs N | episodes x steps | start-up s | rollouts s | env steps/s | vs N=1 | CPU ms / step "
        "| same returns as N=1 |")
    out("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        out(f"| {r['policy']} ({r['kind']}) | {r['envs']} | {r['episodes']} x {r['steps'] // max(r['episodes'], 1)} "
            f"| {r['startup_s']:.2f} | {r['seconds']:.2f} | {r['steps_per_s']:.0f} | {r['ratio']:.2f}x | "
            f"{r['cpu_ms_per_step']:.2f} | "
            f"{'yes' if r['same_returns'] else 'NO'} |")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    out(f"\n{os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load average {load} (1, 5, 15 min). "
        "N = 1 is the one-env path; N > 1 runs N env subprocesses and batches the policy.")


__all__ = ["ROW_KEYS", "bench_rollouts", "print_rollouts_table"]
