"""Vectorised rollouts: N CarRacing envs stepped at once, the policy acting on the batch of their
observations (``--envs N`` of ``agent collect``, ``agent evaluate`` and ``agent train``'s DAgger).

The envs run in subprocesses (gymnasium's ``AsyncVectorEnv``, https://gymnasium.farama.org/api/vector/async_vector_env/)
with autoreset disabled (``AutoresetMode.DISABLED``, https://farama.org/Vector-Autoreset-Mode):
when an env's episode ends, the next episode of the seed list starts in that slot with an explicit
``reset(seed=[...], options={"reset_mask": mask})``, or the slot idles (it is still stepped, its
results are ignored) when no seed remains. Episode i of a run uses track ``seeds[i]``, exactly as
the one-env path (:func:`agent.actors.rollout.rollout`) does.

What the sequential path reads from the env object comes through ``info`` here
(:class:`envs.carracing.StateInfo`): the car's speed, whether all four wheels are off the road,
and for the expert its privileged state. Per-episode results are :class:`agent.actors.rollout.Episode`
objects with the same fields and definitions (return, steps, speeds, longest standstill, off-road
steps).

Batch actors (one action per env slot each step):

- :class:`BatchPolicyActor`: a :class:`agent.nn.policy.DrivingPolicy`, one batched streaming
  ``step`` for all slots; a slot whose episode restarts has its row of the streaming cache reset
  (``DrivingPolicy.reset_rows``). Sampled actions draw from one ``torch.Generator`` per episode,
  seeded with its track, which is what the one-env path's ``torch.manual_seed(track)`` gives.
- :class:`BatchExpertActor`: the PPO expert on the batch of privileged states
  (:meth:`agent.experts.policy.ExpertPolicy.act_batch`).
- :class:`BatchMixtureActor`: DAgger's executed policy per slot (:class:`agent.actors.rollout.MixtureActor`,
  optionally :class:`agent.actors.perturb.PerturbedActor`) on top of the batched student and expert.

Equality with the one-env path: the envs, seeds, step rules and metrics are the same, so an
actor that makes the same decisions gives the same episodes bit for bit. A batched forward is
not bitwise the forward of one row (float sums in another order: logits differ by ~1e-5 for
the CarRacing NAC policy), so an argmax that is a near-tie can come out the other way and the
episode then diverges; tests/test_vector_rollouts.py checks equality on short episodes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import gymnasium as gym
import numpy as np

from agent.actors.loading import is_continuous, make_carracing_for, reads_speedometer
from agent.actors.perturb import DEFAULT_KINDS, DisturbanceConfig, PerturbedActor
from agent.actors.rollout import Decision, Episode, MixtureActor, _stack_labels
from agent.data.recordings import RecordingWriter
from agent.experts.policy import ExpertPolicy
from agent.log import get_logger, progress as progress_bar
from envs.carracing import EPISODE_STEPS, make_carracing

#: How many envs are worth stepping at once on a machine: the CPU count (each env is a process).
MAX_ENVS = 64


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


@contextlib.contextmanager
def threads_beside_envs(n_envs: int):
    """Lower torch's intra-op threads (``torch.set_num_threads``) to leave a CPU to each of n_envs
    env subprocesses for the duration, at least 1 thread; restored afterwards.

    Why: the policy and the envs take turns (the envs step while the policy waits, then the policy
    acts on the batch), and an OpenMP parallel region needs all its threads on a CPU at once. With
    the env processes holding the CPUs, a policy call at torch's default threads waited for a
    scheduler slice: on the 2-core development CPU, two envs stepped at 112-121 env steps/s with
    the student at 2 threads and 150-165 at 1 thread (14.5 against 9.7 ms of CPU an env step;
    ``agent bench rollouts --policies nac.pt --envs 2``, torch 2.13.0+cpu), and the policy's step
    alone, beside other jobs, took 39 ms on average at 2 threads against 6 at 1 (p90 198 against
    7 ms). The batch of N frames gains little from more threads anyway. The decisions do not
    change: the student's streaming step and the expert gave bit-identical outputs at 1 and 2
    threads (checked at B = 2). Yields the thread count in force."""
    import torch

    before = torch.get_num_threads()
    want = max(1, min(before, cpu_cores() - int(n_envs)))
    if want != before:
        torch.set_num_threads(want)
    try:
        yield want
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


class BatchActor(Protocol):
    """Chooses one action per env slot of a vector env.

    ``reset_rows(rows, seeds)`` is called when the slots where ``rows`` (B,) bool is True start an
    episode on the tracks ``seeds`` (a (B,) list, None where no episode starts); ``act(obs, infos)``
    gets the (B, H, W, C) observations and the B per-slot ``info`` dicts and returns B actions
    (ints, or float32 arrays for continuous actions). Idle slots get an action too; it is ignored.
    """

    def reset_rows(self, rows: np.ndarray, seeds: list[int | None]) -> None:
        """Start new episodes in the slots where ``rows`` (B,) bool is True, on tracks ``seeds``."""
        ...

    def act(self, obs: np.ndarray, infos: list[dict]) -> list:
        """B actions for the (B, H, W, C) uint8 observations and the B ``info`` dicts."""
        ...


@dataclass
class CarRacingEnvs:
    """How to make the N CarRacing envs of a vectorised run (the same env as :func:`envs.carracing.make_carracing`).

    Attributes:
        n: envs stepped at once (>= 1).
        continuous: the continuous configuration ((steering, throttle) actions).
        render_pixels: render the 96x96 frames (off for the expert, which reads privileged state).
        privileged_info: each ``info`` carries the expert's ``privileged_state``.
        max_episode_steps: the env's time limit in steps (1000).
        speedometer: draw the car's speed into each frame (:class:`envs.carracing.Speedometer`).
        context: the ``multiprocessing`` start method of the subprocesses (None: the platform's default).

    Raises:
        ValueError: ``n`` outside 1..:data:`MAX_ENVS`.
    """

    n: int
    continuous: bool = False
    render_pixels: bool = True
    privileged_info: bool = False
    max_episode_steps: int | None = None
    context: str | None = None
    speedometer: bool = False

    def __post_init__(self):
        if not 1 <= int(self.n) <= MAX_ENVS:
            raise ValueError(f"--envs must be in 1..{MAX_ENVS}, got {self.n}")
        self.n = int(self.n)

    def _kwargs(self) -> dict:
        return dict(continuous=self.continuous, render_pixels=self.render_pixels,
                    max_episode_steps=self.max_episode_steps or EPISODE_STEPS, speedometer=self.speedometer)

    def make_vector(self, n: int | None = None) -> gym.vector.AsyncVectorEnv:
        """An ``AsyncVectorEnv`` of ``n`` (default :attr:`n`) envs, autoreset disabled, each env's
        ``info`` holding its state (:class:`envs.carracing.StateInfo`). Close it when done."""
        fn = functools.partial(make_carracing, state_info=True, privileged_info=self.privileged_info, **self._kwargs())
        return gym.vector.AsyncVectorEnv([fn] * int(n or self.n), context=self.context,
                                         autoreset_mode=gym.vector.AutoresetMode.DISABLED)

    def template(self) -> gym.Env:
        """One env of the same kind in this process, for its spaces and spec (a recording's
        metadata), made exactly as the one-env path makes it; never stepped here."""
        return make_carracing(**self._kwargs())


def envs_for(policy, n: int, **kwargs) -> CarRacingEnvs:
    """The :class:`CarRacingEnvs` a loaded policy drives (as :func:`agent.actors.loading.make_carracing_for`):
    the continuous configuration for a continuous policy; for the PPO expert no pixels and its
    privileged state in ``info``. ``kwargs`` override the fields.

    Raises:
        ValueError: a continuous policy whose actions are not CarRacing's (steering, throttle).
    """
    make_carracing_for(policy).close()  # validates the action space with the one-env path's message
    expert = isinstance(policy, ExpertPolicy)
    fields = dict(continuous=is_continuous(policy), render_pixels=not expert, privileged_info=expert,
                  speedometer=reads_speedometer(policy))
    fields.update(kwargs)
    return CarRacingEnvs(n, **fields)


def split_infos(infos: dict, n: int) -> list[dict]:
    """A vector env's batched ``info`` (each key an array, with a ``_key`` mask of the envs that
    gave it; gymnasium's ``VectorEnv._add_info``) as ``n`` per-env dicts."""
    out: list[dict] = [{} for _ in range(n)]
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        for i in range(n):
            if mask is not None and not mask[i]:
                continue
            out[i][key] = split_infos(value, n)[i] if isinstance(value, dict) else value[i]
    return out


class _Slot:
    """One slot's episode in progress (the lists :func:`agent.actors.rollout.rollout` keeps)."""

    def __init__(self, index: int, seed: int, obs, info: dict, keep_frames: bool):
        self.index, self.seed, self.steps = index, int(seed), 0
        self.frames = [np.array(obs, copy=True)] if keep_frames else None
        self.actions, self.labels, self.rewards, self.terms, self.truncs = [], [], [], [], []
        self.speeds = [_speed(info)]
        self.off_road: list[bool | None] = []
        self.wheels_off: list[int | None] = []
        self.tiles_missed: int | None = None
        self.wrong_way: list[bool | None] = []

    def episode(self, discrete: bool, labelled: bool) -> Episode:
        return Episode(
            seed=self.seed,
            observations=np.stack(self.frames) if self.frames is not None else None,
            actions=np.asarray(self.actions, dtype=np.int64 if discrete else np.float32),
            labels=_stack_labels(self.labels) if labelled else None,
            rewards=np.asarray(self.rewards, dtype=np.float32),
            terminations=np.asarray(self.terms, dtype=bool),
            truncations=np.asarray(self.truncs, dtype=bool),
            speeds=np.asarray(self.speeds, dtype=np.float32),
            off_road=None if any(x is None for x in self.off_road) else np.asarray(self.off_road, dtype=bool),
            wheels_off=None if any(x is None for x in self.wheels_off) else np.asarray(self.wheels_off, dtype=np.int8),
            tiles_missed=self.tiles_missed,
            wrong_way=None if any(x is None for x in self.wrong_way) else np.asarray(self.wrong_way, dtype=bool),
        )


def _speed(info: dict) -> float:
    return float(info.get("speed", np.nan))


def _off_road(info: dict) -> bool | None:
    return bool(info["off_road"]) if "off_road" in info else None


def _as_action(a, discrete: bool):
    return int(a) if discrete else np.asarray(a, dtype=np.float32).reshape(-1)


def vector_rollouts(venv: gym.vector.VectorEnv, actor: BatchActor, seeds: list[int], max_steps: int | None = None,
                    labeler: BatchActor | None = None, keep_frames: bool = True) -> Iterator[tuple[int, Episode]]:
    """Run one episode per seed on the envs of ``venv``, yielding ``(i, episode)`` as each finishes.

    Episode i runs on track ``seeds[i]`` (``reset(seed=seeds[i])`` of one sub-env); episodes start
    in seed order as slots free up. Each episode is what :func:`agent.actors.rollout.rollout` gives for
    the same decisions: same steps, rewards, terminations, truncations (``max_steps`` marks the
    last step truncated), speeds (from ``info["speed"]``) and off-road flags (``info["off_road"]``).

    Args:
        venv: a vector env with autoreset disabled whose ``info`` carries the car's state
            (:meth:`CarRacingEnvs.make_vector`); it is reset here and left open.
        actor: chooses the executed actions (:class:`BatchActor`).
        seeds: the tracks, one episode each.
        max_steps: stop an episode after this many steps (marked truncated); None = the env's limit.
        labeler: a second batch actor whose action in each visited state is stored in ``labels``
            (the expert, in DAgger); it is not reset (the expert keeps no state).
        keep_frames: store each episode's (N + 1, H, W, C) frames.

    Yields:
        (index into ``seeds``, :class:`agent.actors.rollout.Episode`), in the order episodes finish.

    Raises:
        ValueError: no seeds, or a vector env that autoresets.
    """
    from gymnasium.vector import AutoresetMode

    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("vector_rollouts needs at least one seed")
    mode = venv.metadata.get("autoreset_mode")
    if mode is not None and mode != AutoresetMode.DISABLED:
        raise ValueError(f"vector_rollouts needs a vector env with autoreset_mode=DISABLED, got {mode}")
    with threads_beside_envs(venv.num_envs):  # a CPU left to each env process while they run
        yield from _episodes(venv, actor, seeds, max_steps, labeler, keep_frames)


def _episodes(venv, actor, seeds, max_steps, labeler, keep_frames) -> Iterator[tuple[int, Episode]]:
    """The loop of :func:`vector_rollouts`, on its checked arguments."""
    n = venv.num_envs
    discrete = isinstance(venv.single_action_space, gym.spaces.Discrete)
    first = seeds[:n]
    obs, batch_info = venv.reset(seed=first + [None] * (n - len(first)))
    infos = split_infos(batch_info, n)
    slots: list[_Slot | None] = [_Slot(i, s, obs[i], infos[i], keep_frames) for i, s in enumerate(first)]
    slots += [None] * (n - len(first))
    next_index = len(first)
    actor.reset_rows(np.array([s is not None for s in slots]), [s.seed if s else None for s in slots])
    while any(s is not None for s in slots):
        labels = labeler.act(obs, infos) if labeler is not None else None
        actions = actor.act(obs, infos)
        batch = np.stack([_as_action(a, discrete) for a in actions]) if not discrete else \
            np.asarray([int(a) for a in actions], dtype=np.int64)
        obs, rewards, terminated, truncated, batch_info = venv.step(batch)
        infos = split_infos(batch_info, n)
        restart = np.zeros(n, dtype=bool)
        restart_seeds: list[int | None] = [None] * n
        restart_index = [0] * n
        for i, slot in enumerate(slots):
            if slot is None:
                continue
            slot.steps += 1
            trunc = bool(truncated[i]) or (max_steps is not None and slot.steps >= max_steps)
            if labels is not None:
                slot.labels.append(labels[i])
            slot.actions.append(_as_action(actions[i], discrete))
            slot.rewards.append(float(rewards[i]))
            slot.terms.append(bool(terminated[i]))
            slot.truncs.append(trunc)
            slot.speeds.append(_speed(infos[i]))
            slot.off_road.append(_off_road(infos[i]))
            slot.wheels_off.append(int(infos[i]["wheels_off_road"]) if "wheels_off_road" in infos[i] else None)
            slot.tiles_missed = int(infos[i]["tiles_missed"]) if "tiles_missed" in infos[i] else None
            slot.wrong_way.append(bool(infos[i]["wrong_way"]) if "wrong_way" in infos[i] else None)
            if slot.frames is not None:
                slot.frames.append(np.array(obs[i], copy=True))
            if terminated[i] or trunc:
                yield slot.index, slot.episode(discrete, labeler is not None)
                slots[i] = None
                if next_index < len(seeds):
                    restart[i], restart_seeds[i], restart_index[i] = True, seeds[next_index], next_index
                    next_index += 1
        if restart.any():
            obs, reset_info = venv.reset(seed=restart_seeds, options={"reset_mask": restart})
            reset_infos = split_infos(reset_info, n)
            for i in np.flatnonzero(restart):
                infos[i] = reset_infos[i]
                slots[i] = _Slot(restart_index[i], restart_seeds[i], obs[i], infos[i], keep_frames)
            actor.reset_rows(restart, restart_seeds)


def run_episodes(envs: CarRacingEnvs, actor: BatchActor, seeds: list[int], max_steps: int | None = None,
                 labeler: BatchActor | None = None, keep_frames: bool = True,
                 on_episode: Callable[[int, Episode], None] | None = None) -> list[Episode]:
    """All episodes of :func:`vector_rollouts` on a fresh vector env of ``min(envs.n, len(seeds))``
    envs (closed afterwards), returned in seed order; ``on_episode(i, episode)`` is called as each
    finishes."""
    venv = envs.make_vector(min(envs.n, len(seeds)))
    done: dict[int, Episode] = {}
    try:
        for i, ep in vector_rollouts(venv, actor, seeds, max_steps=max_steps, labeler=labeler,
                                     keep_frames=keep_frames):
            done[i] = ep
            if on_episode is not None:
                on_episode(i, ep)
    finally:
        close(venv)
    return [done[i] for i in range(len(seeds))]


def collect(envs: CarRacingEnvs, actor: BatchActor, episodes: int, seed: int, out, algorithm_name: str,
            overwrite: bool = False, max_steps: int | None = None, progress: bool = True,
            description: str | None = None):
    """:func:`agent.actors.record.collect` on ``envs.n`` envs at once: ``episodes`` episodes on
    tracks seed, seed+1, ... recorded as a Minari dataset at ``out``.

    Episodes are written in seed order, so the dataset is the one the one-env path writes for the
    same decisions; an episode that finishes before an earlier-seeded one waits in memory (at most
    ``envs.n`` - 1 of them). Ctrl-C writes every finished episode (those waiting too, each with its
    track seed) and drops the ones in progress.

    Returns:
        the :class:`agent.data.recordings.RecordingWriter` (``.episodes``, ``.steps``).

    Raises:
        RecordingError: ``out`` is not a dataset path, or is in the way.
    """
    log = get_logger(__name__)
    writer = RecordingWriter(out, envs.template(), algorithm_name, overwrite=overwrite, description=description)
    seeds = list(range(seed, seed + episodes))
    waiting: dict[int, Episode] = {}
    written = 0
    bar = progress_bar(total=episodes, desc=f"episodes ({envs.n} envs)", unit="ep", disable=not progress)
    venv = envs.make_vector(min(envs.n, episodes))
    try:
        for i, ep in vector_rollouts(venv, actor, seeds, max_steps=max_steps):
            waiting[i] = ep
            bar.update(1)
            bar.set_postfix(ret=f"{ep.episode_return:.0f}", steps=ep.steps)
            while written in waiting:
                writer.add(waiting.pop(written))
                written += 1
    except KeyboardInterrupt:
        writer.interrupted = True  # `agent collect` exits 130, the finished episodes kept
        for i in sorted(waiting):
            writer.add(waiting.pop(i))
        log.warning("interrupted: kept %d finished episode(s) in %s", writer.episodes, writer.out)
    finally:
        bar.close()
        close(venv)
    return writer


def close(venv: gym.vector.VectorEnv) -> None:
    """Close a vector env, terminating its subprocesses if they no longer answer (after Ctrl-C)."""
    try:
        venv.close()
    except Exception:  # noqa: BLE001 - a worker killed by Ctrl-C breaks the pipe; terminate instead
        venv.close(terminate=True)


# ----------------------------------------------------------------------------------------- actors
class BatchPolicyActor:
    """A :class:`agent.nn.policy.DrivingPolicy` acting on B env slots with one batched streaming
    step per control step (the batched form of :class:`agent.actors.rollout.PolicyActor`).

    Args:
        policy: the policy (put in eval mode).
        deterministic: argmax actions; otherwise each episode samples from the softmax with its
            own ``torch.Generator`` seeded with its track (the one-env path seeds torch's global
            generator with the track before each episode: the same draws).
    """

    def __init__(self, policy, deterministic: bool = True):
        import torch

        self.policy, self.deterministic, self.torch = policy, deterministic, torch
        self.kind = policy.output_kind
        self.state = None
        self.generators: dict[int, Any] = {}
        policy.eval()

    def reset_rows(self, rows, seeds) -> None:
        rows = np.asarray(rows, dtype=bool)
        self.state = self.policy.reset_rows(self.state, rows)
        if not self.deterministic:
            for i in np.flatnonzero(rows):
                self.generators[int(i)] = self.torch.Generator(device=self.policy.device).manual_seed(int(seeds[i]))

    def act(self, obs, infos) -> list:
        torch = self.torch
        x = np.array(obs, dtype=np.uint8)  # a writable copy, (B, H, W, C)
        t = None
        if infos and all("time_s" in info for info in infos):
            t = torch.tensor([float(info["time_s"]) for info in infos], dtype=torch.float64, device=self.policy.device)
        if self.state is not None and len(self.state.steps) != len(x):
            raise ValueError(f"the policy state holds {len(self.state.steps)} rows, the batch {len(x)}")
        out, self.state = self.policy.step(x, self.state, t=t)
        if self.kind != "discrete":
            return list(self.policy.act(out))  # (B, A) float32 rows, clipped to the action box
        if self.deterministic:
            return [int(a) for a in self.policy.act(out, True)]
        actions = []
        for i in range(len(x)):  # Categorical(logits).sample() of the one-env path, on this episode's generator
            probs = torch.distributions.Categorical(logits=out[i:i + 1]).probs
            g = self.generators.get(i)
            actions.append(int(torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, True, generator=g)[0, 0]))
        return actions


class BatchExpertActor:
    """The PPO expert on B env slots, from the privileged state each env reports in ``info``
    (``privileged_state`` and ``speed``; :class:`envs.carracing.StateInfo` with ``privileged=True``).

    It keeps no state; its last answer is reused when asked again about the same ``infos`` list
    (the labeler and the DAgger mixture ask on the same step).

    Raises (from ``act``):
        KeyError: an env without ``info["privileged_state"]`` (make it with ``privileged_info=True``).
    """

    def __init__(self, expert):
        self.expert = expert
        self._last: tuple[list, list] | None = None

    def reset_rows(self, rows, seeds) -> None:
        pass

    def act(self, obs, infos) -> list:
        if self._last is not None and self._last[0] is infos:  # the object itself is kept: ids get reused
            return self._last[1]
        missing = [i for i, info in enumerate(infos) if "privileged_state" not in info]
        if missing:
            raise KeyError(f"env slot(s) {missing} report no info['privileged_state']: the expert needs envs made "
                           "with privileged_info=True (agent.actors.vector.CarRacingEnvs)")
        a = self.expert.act_batch(np.stack([info["privileged_state"] for info in infos]),
                                  [_speed(info) for info in infos])
        actions = [int(x) for x in a] if a.ndim == 1 else list(a)
        self._last = (infos, actions)
        return actions


class _Given:
    """An actor whose decision was made elsewhere (a batched forward); :class:`BatchMixtureActor`
    sets :attr:`decision` before each step."""

    label, has_probs, traces_reason = "batched", False, None

    def __init__(self):
        self.decision: Decision | None = None

    def reset(self) -> None:
        pass

    def act(self, obs, env=None, info=None) -> Decision:
        return self.decision


class BatchMixtureActor:
    """DAgger's executed policy on B env slots: per slot, the student's action or with probability
    ``beta`` the expert's (:class:`agent.actors.rollout.MixtureActor`), and with ``disturb`` > 0 the
    disturbances of :class:`agent.actors.perturb.PerturbedActor`; student and expert each act on
    the whole batch once per step.

    Each episode draws from its own generator, ``numpy.random.default_rng([base_seed, track])``,
    so the draws do not depend on how many envs run or on which episode ends first (the one-env
    path draws all episodes of a round from one generator, so with beta > 0 or disturbances its
    episodes differ from these).

    Args:
        student: a :class:`BatchPolicyActor`.
        expert: a :class:`BatchExpertActor`.
        beta: probability of executing the expert's action, in [0, 1].
        base_seed: seeds the per-episode generators.
        action_space: one env's action space (the disturbances' actions).
        disturb: mean disturbances per 1000 steps (0: none).
        disturb_kinds: the kinds drawn (default :data:`agent.actors.perturb.DEFAULT_KINDS`).

    Raises:
        ValueError: beta outside [0, 1] (:class:`agent.actors.rollout.MixtureActor`).
    """

    def __init__(self, student: BatchPolicyActor, expert: BatchExpertActor, beta: float, base_seed: int,
                 action_space: gym.Space, disturb: float = 0.0, disturb_kinds: tuple[str, ...] | None = None):
        MixtureActor(_Given(), _Given(), beta, np.random.default_rng(0))  # validates beta
        self.student, self.expert, self.beta, self.base_seed = student, expert, beta, int(base_seed)

        self.disturb, self.env = disturb, types.SimpleNamespace(action_space=action_space)
        self.disturb_kinds = tuple(disturb_kinds or DEFAULT_KINDS)
        self.slots: dict[int, tuple] = {}

    def reset_rows(self, rows, seeds) -> None:
        self.student.reset_rows(rows, seeds)
        for i in np.flatnonzero(np.asarray(rows, dtype=bool)):
            rng = np.random.default_rng([self.base_seed, int(seeds[i])])
            s, e = _Given(), _Given()
            actor = MixtureActor(s, e, self.beta, rng)
            if self.disturb > 0:
                actor = PerturbedActor(actor, DisturbanceConfig(per_episode=self.disturb, kinds=self.disturb_kinds), rng)
            self.slots[int(i)] = (s, e, actor)

    def act(self, obs, infos) -> list:
        student = self.student.act(obs, infos)
        expert = self.expert.act(obs, infos)
        out = []
        for i in range(len(student)):
            if i not in self.slots:
                out.append(student[i])
                continue
            s, e, actor = self.slots[i]
            s.decision, e.decision = Decision(student[i]), Decision(expert[i])
            out.append(actor.act(obs[i], self.env, infos[i]).action)
        return out


def batch_actor_for(policy, deterministic: bool = True) -> BatchActor:
    """The batch actor of a loaded policy: :class:`BatchExpertActor` for the PPO expert, else
    :class:`BatchPolicyActor` (the batched :func:`agent.actors.loading.make_actor`)."""
    return BatchExpertActor(policy) if isinstance(policy, ExpertPolicy) else BatchPolicyActor(policy, deterministic)


__all__ = ["BatchActor", "BatchExpertActor", "BatchMixtureActor", "BatchPolicyActor", "CarRacingEnvs", "MAX_ENVS",
           "batch_actor_for", "close", "envs_for", "run_episodes", "split_infos", "vector_rollouts"]
