"""Closed-loop evaluation: episode returns of a policy on tracks seed, seed+1, ..., seed+N-1, and
the "no stalls" figures of each episode (the longest standstill, the steps off the road; see
:class:`agent.actors.rollout.Episode`)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agent.actors.loading import load_policy, make_actor, make_carracing_for, resolve_policy_path
from agent.actors.rollout import CRAWL_METRIC_SPEED, SLOW_SPEED, STALL_STEPS, rollout
from agent.actors.vector import batch_actor_for, envs_for, run_episodes
from agent.eval.card import identity
from agent.experts.policy import ExpertPolicy
from agent.experts.rules import TeacherRules
from agent.log import progress as bar_for
from envs.carracing import STANDSTILL_SPEED


@dataclass
class EvalResult:
    """Returns, lengths and stall figures of evaluation episodes (the JSON written by ``agent evaluate``).

    Per episode (lists in seed order): ``returns``; ``steps``; ``longest_standstill_steps``, the
    longest run of consecutive steps with the car slower than
    :data:`agent.actors.rollout.STANDSTILL_SPEED` (1.0 simulator units per second); ``off_road_steps``, the
    steps with all four wheels off the road. Aggregates: ``max_longest_standstill_steps``,
    ``episodes_with_stall`` (episodes whose longest standstill exceeds ``stall_steps`` = 50 steps,
    1 s) and ``mean_off_road_steps``. Per episode also ``tiles_missed``, the road tiles never
    visited (a lap ends only once every tile is visited, so one skipped bend caps the return below
    900: :func:`agent.actors.rollout.tiles_missed`), and ``edge_steps``, the steps with one to three wheels
    off the road (on the road's edge); their aggregates ``laps_finished`` (episodes that visited
    every tile) and ``mean_edge_steps``. ``standstill_speed`` and ``stall_steps`` record the thresholds;
    ``longest_crawl_steps``, the longest run of steps slower than
    :data:`agent.actors.rollout.CRAWL_METRIC_SPEED` (5 units/s: a car circling slowly on the grass, which
    the standstill figure misses), with its aggregate ``episodes_with_crawl`` (longer than
    ``stall_steps``) and threshold ``crawl_speed``; ``slow_steps``, the steps slower than
    ``slow_speed`` after the car first reached it (:data:`agent.actors.rollout.SLOW_SPEED`, 10 units/s,
    unless ``--slow-speed`` says otherwise: the saw-tooth of a student braking at the start rule's
    floor, which neither figure above counts), with its aggregate ``episodes_slow`` (more than
    ``stall_steps``) and threshold ``slow_speed``; ``wrong_way_steps``, the steps driven against the
    lap's direction (:func:`agent.actors.rollout.wrong_way`: back on the road facing backwards, over
    tiles already visited), with its aggregate ``episodes_wrong_way`` (more than ``stall_steps``);
    ``deterministic`` (argmax or sampled actions) and the expert's rules (``start_rule``,
    ``creep_speed``, ``brake_floor``, ``grass_rule``: :class:`agent.experts.rules.TeacherRules`; off for
    a student) how the policy acted, ``device`` where its network ran; ``envs`` how many envs were
    stepped at once (``--envs``);
    ``file_sha256`` and ``weights_sha256`` name the exact file and weights evaluated
    (:func:`agent.eval.card.identity`; ``policy`` is only the path, which many versions share).
    """

    env: str
    policy: str
    seeds: list[int]
    returns: list[float]
    steps: list[int]
    mean_return: float
    std_return: float
    seconds: float
    steps_per_second: float
    longest_standstill_steps: list[int] = field(default_factory=list)
    off_road_steps: list[int] = field(default_factory=list)
    max_longest_standstill_steps: int = 0
    episodes_with_stall: int = 0
    mean_off_road_steps: float = 0.0
    tiles_missed: list[int] = field(default_factory=list)
    edge_steps: list[int] = field(default_factory=list)
    laps_finished: int = 0
    mean_edge_steps: float = 0.0
    longest_crawl_steps: list[int] = field(default_factory=list)
    episodes_with_crawl: int = 0
    slow_steps: list[int] = field(default_factory=list)
    episodes_slow: int = 0
    wrong_way_steps: list[int] = field(default_factory=list)
    episodes_wrong_way: int = 0
    slow_speed: float = SLOW_SPEED
    standstill_speed: float = STANDSTILL_SPEED
    crawl_speed: float = CRAWL_METRIC_SPEED
    stall_steps: int = STALL_STEPS
    deterministic: bool = True
    start_rule: bool = False
    creep_speed: float = 0.0
    brake_floor: float | None = None
    grass_rule: bool = False
    device: str = "cpu"
    envs: int = 1
    file_sha256: str = ""
    weights_sha256: str = ""

    def to_json(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    def summary_lines(self) -> list[str]:
        """The printed summary: the mean return line, then one line per episode and the stall aggregates."""
        lines = [f"{self.policy}: mean return {self.mean_return:.1f} ± {self.std_return:.1f} over {len(self.returns)} "
                 f"tracks (seeds {self.seeds[0]}..{self.seeds[-1]}), {self.steps_per_second:.0f} env steps/s"]
        for i, s in enumerate(self.seeds):
            lines.append(f"  seed {s}  return {self.returns[i]:8.1f}  steps {self.steps[i]:4d}  longest standstill "
                         f"{self.longest_standstill_steps[i]:4d} steps  off-road {self.off_road_steps[i]:4d} steps"
                         + (f"  on the edge {self.edge_steps[i]:4d} steps  tiles missed {self.tiles_missed[i]:3d}"
                            if self.tiles_missed else ""))
        lines.append(f"stalls: longest standstill {self.max_longest_standstill_steps} steps (speed < "
                     f"{self.standstill_speed:g} units/s); {self.episodes_with_stall}/{len(self.seeds)} episodes "
                     f"stood still > {self.stall_steps} steps; mean off-road {self.mean_off_road_steps:.1f} steps")
        if self.longest_crawl_steps:
            lines.append(f"crawls: longest {max(self.longest_crawl_steps)} steps below {self.crawl_speed:g} units/s; "
                         f"{self.episodes_with_crawl}/{len(self.seeds)} episodes crawled > {self.stall_steps} steps")
        if self.slow_steps:
            lines.append(f"slow: most {max(self.slow_steps)} steps below {self.slow_speed:g} units/s after first reaching "
                         f"it; {self.episodes_slow}/{len(self.seeds)} episodes slow > {self.stall_steps} steps")
        if self.wrong_way_steps:
            lines.append(f"wrong way: most {max(self.wrong_way_steps)} steps against the lap's direction; "
                         f"{self.episodes_wrong_way}/{len(self.seeds)} episodes > {self.stall_steps} steps")
        if self.tiles_missed:
            lines.append(f"laps: {self.laps_finished}/{len(self.seeds)} finished (every tile visited); "
                         f"{sum(m > 0 for m in self.tiles_missed)} episodes missed tiles (a lap ends only once every tile is "
                         f"visited); mean {self.mean_edge_steps:.1f} steps on the road's edge (1-3 wheels off)")
        return lines


def _run_seeds(args, on_episode=None) -> list[tuple]:
    """Worker: load the policy once, run each seed; returns :func:`_row` per episode."""
    policy_path, seeds, max_steps, threads, deterministic, rules, slow_speed, device = args
    import torch

    if threads:
        torch.set_num_threads(threads)

    policy = _load_for_eval(policy_path, rules, device)
    actor = make_actor(policy, deterministic=deterministic)
    # The expert reads privileged state only: skip the pixel rendering (same physics, same returns).
    # A policy or expert with continuous actions drives the continuous configuration (make_carracing_for).
    env = make_carracing_for(policy, render_pixels=not isinstance(policy, ExpertPolicy))
    out = []
    for s in seeds:
        if not deterministic:  # sampled actions: the draws are seeded by the track, so a run repeats
            torch.manual_seed(int(s))
        ep = rollout(env, actor, s, max_steps=max_steps, keep_frames=False)
        out.append(_row(ep, slow_speed))
        if on_episode is not None:
            on_episode(out[-1])
    env.close()
    return out


def _load_for_eval(policy_path, rules: TeacherRules | None, device: str = "cpu"):
    """The policy of a file on ``device``, with the expert's rules when asked for (strictly: a
    continuous expert refuses the creep and grass rules)."""
    policy = load_policy(policy_path, device=device)
    if rules is not None and rules != TeacherRules():
        if not isinstance(policy, ExpertPolicy):
            raise ValueError(f"the teacher's rules (start_rule, creep_speed, brake_floor, grass_rule) are the PPO "
                             f"expert's; {policy_path} is not one")
        rules.apply(policy, strict=True)
    return policy


def _run_seeds_vector(policy_path, seeds: list[int], max_steps: int | None, envs: int, deterministic: bool,
                      rules: TeacherRules | None, slow_speed: float = SLOW_SPEED, on_episode=None,
                      device: str = "cpu") -> list[tuple]:
    """:func:`_run_seeds` on ``envs`` envs stepped at once (:mod:`agent.actors.vector`), the policy acting
    on the batch of their observations; the same tuples, in seed order."""
    policy = _load_for_eval(policy_path, rules, device)
    actor = batch_actor_for(policy, deterministic=deterministic)  # sampled: one generator per track
    done = run_episodes(envs_for(policy, envs), actor, seeds, max_steps=max_steps, keep_frames=False,
                        on_episode=None if on_episode is None else (lambda i, ep: on_episode(_row(ep, slow_speed))))
    return [_row(ep, slow_speed) for ep in done]


def _row(ep, slow_speed: float = SLOW_SPEED) -> tuple:
    """(seed, return, steps, longest standstill, off-road steps, tiles missed, edge steps, longest crawl,
    slow steps below ``slow_speed`` units/s, wrong-way steps) of an episode."""
    return (ep.seed, ep.episode_return, ep.steps, ep.longest_standstill, ep.off_road_steps, ep.tiles_missed,
            ep.edge_steps, ep.longest_crawl, ep.slow_steps_below(slow_speed), ep.wrong_way_steps)


def evaluate(policy_path: str | Path, episodes: int, seed: int, env: str = "carracing", max_steps: int | None = None,
             workers: int = 1, progress: bool = True, deterministic: bool = True,
             start_rule: bool = False, envs: int = 1, slow_speed: float = SLOW_SPEED,
             rules: TeacherRules | None = None, device: str = "cpu") -> EvalResult:
    """Run ``episodes`` episodes on seeds seed .. seed+episodes-1, split over ``workers`` processes
    or stepped ``envs`` at a time.

    Args:
        policy_path: a policy file (a bare name is looked up in ``policies/``).
        episodes: episodes, one track each.
        seed: the first track seed.
        env: "carracing" (the only closed-loop simulator).
        max_steps: cap on episode length in steps; None = the env's 1000.
        workers: processes (each loads the policy once).
        progress: show a progress bar.
        deterministic: the most probable action (argmax); False samples it from the policy's
            softmax, with torch's generator seeded by each track's seed (the expert stays argmax).
        start_rule: an expert ``.zip`` drives with its start rule
            (:attr:`agent.experts.policy.ExpertPolicy.start_rule`), as it does as a teacher; the
            same as ``rules=TeacherRules(start_rule=True)``.
        envs: step this many envs at once in subprocesses (:mod:`agent.actors.vector`), the policy
            acting on the batch of their observations, in this one process; 1 = one env, episodes
            one after another (split over ``workers``). Each episode keeps its track and its
            metrics' definitions; a deterministic policy gives the same episodes as with one env
            up to argmax near-ties that the batched forward's float rounding can flip.
        slow_speed: the slow-steps threshold, units/s (:func:`agent.actors.rollout.slow_steps`; 10 by
            default; 25 also counts a saw-tooth above the brake floor of 20).
        rules: an expert ``.zip`` drives with these teacher's rules
            (:class:`agent.experts.rules.TeacherRules`, set strictly), as it labels as a teacher;
            None: ``start_rule`` alone decides.
        device: the torch device of the policy's network in every worker ("cpu", "cuda", "cuda:N").

    Returns:
        the :class:`EvalResult` (per-episode lists in seed order).

    Raises:
        ValueError: an unknown env or a bad episode count; the start rule (or other rules) for a
            file that is not an expert, or a rule the expert refuses (RuleError); ``envs`` > 1 together with ``workers`` > 1, or ``envs`` < 1;
            a ``slow_speed`` that is not a positive number.
    """
    if env != "carracing":
        raise ValueError(f"closed-loop evaluation supports --env carracing, got {env!r}")
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    if envs < 1:
        raise ValueError(f"--envs must be >= 1, got {envs}")
    if not (np.isfinite(slow_speed) and slow_speed > 0):
        raise ValueError(f"--slow-speed must be a positive number of units/s, got {slow_speed}")
    if envs > 1 and workers > 1:
        raise ValueError(f"--envs {envs} steps the envs from one process; use it with --workers 1 (got --workers "
                         f"{workers})")
    if rules is None:
        rules = TeacherRules(start_rule=start_rule)
    path = resolve_policy_path(policy_path)
    ident = identity(path)  # before driving: the digests of exactly the file that drives
    seeds = list(range(seed, seed + episodes))
    workers = max(1, min(workers, episodes))
    t0 = time.time()
    results: list[tuple] = []
    bar = bar_for(total=episodes, desc="evaluate", unit="ep", disable=not progress)
    def tick(r):
        results.append(r)
        bar.update(1)
        bar.set_postfix(mean=f"{np.mean([x[1] for x in results]):.0f}")

    if envs > 1:
        _run_seeds_vector(str(path), seeds, max_steps, envs, deterministic, rules, slow_speed, on_episode=tick,
                          device=device)
    elif workers == 1:
        _run_seeds((str(path), seeds, max_steps, 0, deterministic, rules, slow_speed, device), on_episode=tick)
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            jobs = [(str(path), [s], max_steps, 1, deterministic, rules, slow_speed, device) for s in seeds]
            for out in pool.map(_run_seeds, jobs):
                tick(out[0])
    bar.close()
    results.sort()
    returns = [float(r[1]) for r in results]
    steps = [int(r[2]) for r in results]
    standstills = [int(r[3]) for r in results]  # CarRacing always reports speed and wheels
    off_road = [int(r[4]) for r in results]
    missed = [int(r[5]) for r in results]
    edge = [int(r[6]) for r in results]
    crawls = [int(r[7]) for r in results]
    slow = [int(r[8]) for r in results]
    wrong = [int(r[9]) for r in results]
    dt = time.time() - t0
    return EvalResult(env=env, policy=str(path), seeds=seeds, returns=returns, steps=steps,
                      mean_return=float(np.mean(returns)), std_return=float(np.std(returns)), seconds=dt,
                      steps_per_second=sum(steps) / max(dt, 1e-9), longest_standstill_steps=standstills,
                      off_road_steps=off_road, max_longest_standstill_steps=max(standstills),
                      episodes_with_stall=sum(s > STALL_STEPS for s in standstills),
                      mean_off_road_steps=float(np.mean(off_road)), tiles_missed=missed, edge_steps=edge,
                      laps_finished=sum(m == 0 for m in missed), mean_edge_steps=float(np.mean(edge)),
                      longest_crawl_steps=crawls, episodes_with_crawl=sum(c > STALL_STEPS for c in crawls),
                      slow_steps=slow, episodes_slow=sum(s > STALL_STEPS for s in slow), slow_speed=slow_speed,
                      wrong_way_steps=wrong, episodes_wrong_way=sum(w > STALL_STEPS for w in wrong),
                      deterministic=deterministic,
                      start_rule=rules.start_rule, creep_speed=rules.creep_speed, brake_floor=rules.brake_floor,
                      grass_rule=rules.grass_rule, device=device, envs=envs, file_sha256=ident["file_sha256"],
                      weights_sha256=ident["weights_sha256"])
