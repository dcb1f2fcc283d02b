"""Replaying episodes: an episode's frames recomputed from its track's seed and its executed actions.

CarRacing is deterministic given the two: ``reset(seed=s)`` draws track s from the seeded
generator, and each ``step`` advances a fixed-step Box2D world (50 Hz) by the given action, then
renders the frame in software (gymnasium's ``CarRacing``; the same build of Box2D and pygame on
the same architecture gives the same bytes). So a DAgger round's frames, hundreds of MB, are
fully described by a few bytes a step: the executed action (the student's, the expert's under
Ross et al.'s mixing, or a disturbance's, :mod:`agent.actors.perturb`, all of which act through
actions). :mod:`agent.train.checkpoint` keeps them beside each round, so a run folder copied
without its frames (``dagger-round-*.npy``) still resumes: the frames are replayed and checked
against a digest taken when they were first recorded.

The replay runs on the same vector envs as the rollouts (:func:`agent.actors.vector.run_episodes`),
with :class:`ReplayActor` choosing each row's next recorded action.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict

import numpy as np

from agent.actors.vector import CarRacingEnvs, run_episodes
from agent.log import progress


class ReplayError(RuntimeError):
    """A replay that does not reproduce the recorded episode (another length, other frames).

    The message is one line: which track, what differed.
    """


def frame_digest(frames: np.ndarray) -> str:
    """A 128-bit BLAKE2b digest of an episode's frames, as 32 hex characters.

    Args:
        frames: (N, H, W, C) uint8 (any array: its shape and dtype are hashed with its bytes).
    """
    a = np.ascontiguousarray(frames)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{a.shape}{a.dtype.str}".encode())
    h.update(a.data)
    return h.hexdigest()


class ReplayActor:
    """A batch actor (:class:`agent.actors.vector.BatchActor`) that plays recorded actions back.

    A row whose episode has used up its recorded actions gets "nothing" (or zeros) from then on:
    the vector loop keeps stepping a row whose episode ended until a new one starts there, and an
    episode that runs longer than recorded is caught by :func:`replay_frames` from its length.

    Args:
        actions: ``{seed: (N,) executed actions}`` (discrete CarRacing: ints 0-4; continuous:
            (N, 2) floats), one episode per seed.
    """

    def __init__(self, actions: dict[int, np.ndarray]):
        self.actions = {int(s): np.asarray(a) for s, a in actions.items()}
        self._rows: dict[int, list] = {}

    def reset_rows(self, rows, seeds) -> None:
        for i in np.flatnonzero(rows):
            if seeds[i] is not None:
                self._rows[int(i)] = [int(seeds[i]), 0]

    def act(self, obs, infos) -> list:
        out = []
        for i in range(len(obs)):
            row = self._rows.get(i)
            if row is None:  # a slot with no episode left: its action is never read
                out.append(0)
                continue
            seed, t = row
            recorded = self.actions[seed]
            row[1] = t + 1
            if t >= len(recorded):  # the row's episode ended (its slot idles) or runs longer than recorded
                out.append(0 if recorded.ndim == 1 else np.zeros(recorded.shape[1:], np.float32))
                continue
            a = recorded[t]
            out.append(int(a) if recorded.ndim == 1 else np.asarray(a, np.float32))
        return out



def replay_frames(envs: CarRacingEnvs, seeds: list[int], actions: list[np.ndarray], max_steps: int | None = None,
                  digests: list[str] | None = None) -> list[np.ndarray]:
    """Each episode's frames, replayed from its seed and executed actions.

    Args:
        envs: the envs the episodes were recorded on (their frames' configuration: continuous,
            speedometer, time limit; ``n`` sets how many replay at once).
        seeds: one track seed per episode (distinct).
        actions: per episode, its (N_e,) or (N_e, A) executed actions.
        max_steps: the step limit the episodes were recorded with (None: the env's).
        digests: per episode, :func:`frame_digest` of its recorded (N_e, H, W, C) frames (the
            frames before each action), checked against the replay; None: not checked.

    Returns:
        Per episode, in the order of ``seeds``, its (N_e, H, W, C) uint8 frames: the observation
        before each executed action (the last observation, after the final action, dropped).

    Raises:
        ValueError: seeds that repeat, or lists of different lengths.
        ReplayError: an episode that ends at another step than recorded, or frames whose digest differs.
    """
    seeds = [int(s) for s in seeds]
    if len(set(seeds)) != len(seeds):
        raise ValueError("replay_frames needs distinct seeds (one recorded episode each)")
    if len(actions) != len(seeds) or (digests is not None and len(digests) != len(seeds)):
        raise ValueError(f"{len(seeds)} seeds, {len(actions)} action lists"
                         + ("" if digests is None else f", {len(digests)} digests") + ": one each per episode")
    actor = ReplayActor(dict(zip(seeds, actions)))
    bar = progress(total=len(seeds), desc=f"replaying ({envs.n} envs)", unit="ep", leave=False)
    try:
        episodes = run_episodes(envs, actor, seeds, max_steps=max_steps, on_episode=lambda i, ep: bar.update(1))
    finally:
        bar.close()
    out = []
    for i, (seed, ep) in enumerate(zip(seeds, episodes)):
        if ep.steps != len(actions[i]):
            raise ReplayError(f"track {seed}: the replay ended after {ep.steps} steps, the recording after "
                              f"{len(actions[i])} (another gymnasium, Box2D or pygame build?)")
        frames = ep.observations[:-1]
        if digests is not None and frame_digest(frames) != digests[i]:
            raise ReplayError(f"track {seed}: the replayed frames differ from the recorded ones (another gymnasium, "
                              "Box2D or pygame build, or another env configuration?)")
        out.append(frames)
    return out


def envs_fields(envs: CarRacingEnvs) -> dict:
    """The :class:`agent.actors.vector.CarRacingEnvs` fields that shape the frames, and ``n`` (a
    replay on as many envs gives each env the same history of episodes as the recording), to store
    with a recording and rebuild the envs with ``CarRacingEnvs(**fields)``."""
    d = asdict(envs)
    return {k: d[k] for k in ("n", "continuous", "render_pixels", "max_episode_steps", "speedometer")}


__all__ = ["ReplayActor", "ReplayError", "envs_fields", "frame_digest", "replay_frames"]
