"""Does a driver recover from the failure states? Disturb it once and watch what it does next.

Before the expert labels recoveries in DAgger (:mod:`agent.actors.perturb`), check that it can
recover itself: on each track the driver (the expert, or any actor) drives, one disturbance
pushes the car off the road or brings it to a standstill at a fixed step, then the driver is on
its own again. Measured per episode:

- ``recovered``: after the disturbance, the car is back on the road (at least one wheel on a
  road tile) and moving (speed above :data:`MOVING_SPEED`) within ``limit`` steps;
- ``steps_to_recover``: how many steps that took (None if it did not);
- the episode return, beside the same driver's undisturbed return on the same track.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from agent.actors.perturb import DisturbanceConfig, PerturbedActor
from agent.actors.rollout import rollout
from agent.log import progress

#: speed (simulator units per second, CarRacing's dashboard "true speed") above which the car counts as moving
MOVING_SPEED = 5.0


@dataclass
class RecoveryResult:
    """One disturbed episode: track seed, disturbance kind, start step and length (steps), whether
    and how fast the driver got back (steps after the disturbance ended), returns disturbed and not."""

    seed: int
    kind: str
    start: int
    length: int
    recovered: bool
    steps_to_recover: int | None
    disturbed_return: float
    undisturbed_return: float


def run_disturbed(env, actor, seed: int, kind: str, start: int, length: int, side: int = 1,
                  limit: int = 250, max_steps: int | None = None) -> tuple[bool, int | None, float]:
    """Drive track ``seed`` with one disturbance; returns (recovered, steps_to_recover, episode return).

    Args:
        env: a CarRacing env (:func:`envs.carracing.make_carracing`, matching the actor's actions).
        actor: the driver (:mod:`agent.actors.rollout` actor).
        kind, start, length, side: the disturbance ("off-road" or "stop"), its first step, its
            length in steps, and its side (-1 left, +1 right; off-road only).
        limit: steps after the disturbance ends within which the car must be on the road and moving.
        max_steps: cap on the episode length (None: the env's 1000 steps).
    """
    wrapped = PerturbedActor(actor, DisturbanceConfig(per_episode=0.0), np.random.default_rng(0),
                             schedule=[(start, kind, length, side)])
    end = start + length
    ep = rollout(env, wrapped, seed, max_steps=max_steps, keep_frames=False)
    step = np.arange(1, ep.steps + 1)  # the step after which ep.off_road[i] and ep.speeds[i + 1] hold
    back = ~np.asarray(ep.off_road, dtype=bool) & (ep.speeds[1:] > MOVING_SPEED) & (step > end) & (step <= end + limit)
    hits = np.flatnonzero(back)
    steps = int(step[hits[0]] - end) if hits.size else None
    return steps is not None, steps, float(ep.rewards.sum())


def recovery_check(env, actor, seeds: list[int], kinds=("off-road", "stop"), start: int = 250,
                   lengths: dict | None = None, limit: int = 250, max_steps: int | None = None) -> list[RecoveryResult]:
    """For every track and disturbance kind, one disturbed and one undisturbed episode.

    Args:
        env, actor: as :func:`run_disturbed`.
        seeds: tracks (never the evaluation tracks for choices; reporting on them is fine).
        kinds: disturbances to test.
        start: the step the disturbance begins (the car is up to speed by then).
        lengths: steps per kind (default: off-road 40, stop 100: 2 s of braking and standing).
        limit: as :func:`run_disturbed`.

    Returns:
        one :class:`RecoveryResult` per (seed, kind).
    """
    lengths = {"off-road": 40, "stop": 100, **(lengths or {})}
    results = []
    for i, seed in enumerate(progress(list(seeds), desc="recovery check", unit="track")):
        base = float(rollout(env, actor, seed, max_steps=max_steps, keep_frames=False).rewards.sum())
        for kind in kinds:
            side = 1 if i % 2 == 0 else -1
            ok, steps, ret = run_disturbed(env, actor, seed, kind, start, lengths[kind], side, limit, max_steps)
            results.append(RecoveryResult(int(seed), kind, start, lengths[kind], ok, steps, ret, base))
    return results


def summarize(results: list[RecoveryResult]) -> dict:
    """Per kind: episodes, recovered count, median steps to recover, mean returns disturbed and undisturbed."""
    out = {}
    for kind in sorted({r.kind for r in results}):
        rs = [r for r in results if r.kind == kind]
        steps = [r.steps_to_recover for r in rs if r.recovered]
        out[kind] = {
            "episodes": len(rs), "recovered": sum(r.recovered for r in rs),
            "median_steps_to_recover": float(np.median(steps)) if steps else None,
            "mean_disturbed_return": float(np.mean([r.disturbed_return for r in rs])),
            "mean_undisturbed_return": float(np.mean([r.undisturbed_return for r in rs])),
        }
    return {"summary": out, "episodes": [asdict(r) for r in results]}


__all__ = ["MOVING_SPEED", "RecoveryResult", "recovery_check", "run_disturbed", "summarize"]
