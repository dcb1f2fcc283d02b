"""DAgger on top of behaviour cloning (Ross, Gordon and Bagnell 2011, "A Reduction of Imitation
Learning and Structured Prediction to No-Regret Online Learning").

Each round r = 1..R the student drives ``dagger_episodes`` training tracks, the expert labels
every state the student visits (cheap here: it reads the privileged state of the same env), the
labelled episodes join the training data, and :func:`agent.train.bc.fit` trains the student
further on the aggregate.

- **Mixing schedule.** On each step the expert's action is executed instead of the student's
  with probability beta_r = ``dagger_beta`` * ``dagger_beta_decay`` ** (r - 1)
  (:class:`agent.actors.rollout.MixtureActor`): Ross et al.'s beta_i = p^(i-1), where round 0, the
  expert's own demonstrations, had beta = 1. ``--dagger-beta 0.5 --dagger-beta-decay 0.5`` gives
  0.5, 0.25, 0.125, ...
- **Failure states.** Episodes are never cut when the car leaves the road or stops: the student
  drives on, and the expert labels the way back. With ``dagger_disturb`` > 0, disturbances
  (:mod:`agent.actors.perturb`, in the spirit of DART, Laskey et al. 2017) push the car off the
  road or to a standstill that many times per 1000 steps on average, so those states are
  labelled even when the student itself would not reach them.
- **Edge weights.** With ``dagger_edge_weight`` W != 1, the relabelled frames where the car is
  on the road's edge (one to three wheels off), or gets a wheel off the road within
  ``dagger_edge_horizon`` steps, weigh W in the loss instead of 1 (:func:`edge_weights`). A
  teacher that keeps a margin demonstrates few edge states, and the student's failures are
  there: a bend's tiles skipped with four wheels on the grass, so the lap never ends (README,
  "Skipped tiles"). Measured: no gain (README, "Edge weights, tried"). The weights go into the
  run folder's round files with the frames (the Minari datasets of ``dagger_out`` hold frames and
  labels only).
- **Wrong-way weights.** With ``dagger_wrong_way_weight`` W != 1, the relabelled frames taken while
  the car drove against the lap's direction (:attr:`envs.carracing.CarRacingEnv.wrong_way`) weigh W
  (:func:`wrong_way_weights`). There the teacher, which reads the lap's direction from its
  privileged state, brakes and turns the car round; the student's frames do not show which way the
  lap goes, so those labels are ones it cannot explain (the "imitation gap" of a privileged teacher:
  Weihs et al. 2021, "Bridging the Imitation Gap by Adaptive Insubordination", NeurIPS). Measured with
  ``nac.pt`` driving the speed candidate's DAgger rollouts: 88 % of all brake labels come from such
  frames (docs/experiments/2026-12-07-wrong-way-labels.md).
- **Memory.** With a checkpointer (``agent train``), each round's relabelled frames are written
  to the run folder and trained on memory-mapped from there, as the recordings are
  (:mod:`agent.data.frame_cache`), so memory does not grow with the rounds.
- **Data.** With ``dagger_out``, each round's relabelled episodes are also written as a Minari
  dataset ``<dagger_out>-r<round>-v0`` whose actions are the expert's labels (what the student
  is trained on), so ``agent train --data`` can use them again.

Tracks of round r: ``dagger_seed + (r - 1) * dagger_episodes + i`` (500,000 onwards by default:
never the evaluation tracks). TensorBoard: ``eval/dagger_return``, ``charts/dagger_beta``.

**Vectorised rollouts.** Given an :class:`agent.actors.vector.CarRacingEnvs` instead of one env
(``agent train --envs N``), each round's episodes run on N envs at once, the student and the
expert acting on the batch (:func:`agent.actors.vector.run_episodes`); the episodes come back in seed
order. With beta = 0 and no disturbances they are those of the one-env path; otherwise each
episode draws from its own generator (:class:`agent.actors.vector.BatchMixtureActor`), so they do not
depend on N but differ from the one-env path's single stream.
"""

from __future__ import annotations

import time

import numpy as np

from agent.actors.perturb import DEFAULT_KINDS, DisturbanceConfig, PerturbedActor
from agent.actors.replay import envs_fields
from agent.actors.rollout import ExpertActor, MixtureActor, PolicyActor, rollout
from agent.actors.vector import BatchExpertActor, BatchMixtureActor, BatchPolicyActor, CarRacingEnvs, run_episodes
from agent.data.recordings import Demonstrations, RecordingWriter
from agent.log import get_logger, progress
from agent.train.bc import fit
from agent.train.checkpoint import RoundReplay, load_round

log = get_logger(__name__)


def beta_schedule(beta: float, decay: float, rounds: int) -> list[float]:
    """beta_r = beta * decay ** (r - 1) for rounds r = 1..``rounds`` (each in [0, 1])."""
    return [float(beta * decay ** r) for r in range(rounds)]


def edge_weights(wheels_off: np.ndarray | None, n: int, weight: float, horizon: int) -> np.ndarray | None:
    """Per-frame loss weights of one relabelled episode: ``weight`` near the road's edge, 1 elsewhere.

    Frame i (the observation on which action i was taken) is near the edge when a wheel was off
    the road before action i (after step i - 1) or is after any of the next ``horizon`` steps
    (i .. i + horizon - 1): the states on the edge and those that lead there, where the expert's
    label is the correction. Frames taken with all four wheels off the road weigh 1: there the
    expert is not a reliable teacher (it finds the road again after a long excursion on about half
    the tracks, ``agent expert check-recovery``), and weighing those frames too was measured to
    make the student worse (README, "Edge weights, tried").

    Args:
        wheels_off: (n,) wheels off the road after each step, 0-4 (:attr:`agent.actors.rollout.Episode.wheels_off`),
            or None (an env without wheels).
        n: the episode's frames (steps). weight: >= 0. horizon: steps ahead, >= 0.

    Returns:
        (n,) float32 weights, or None when ``weight`` is 1 or the env reports no wheels.

    Raises:
        ValueError: ``wheels_off`` not of n entries, a negative weight or horizon.
    """
    if weight < 0 or horizon < 0:
        raise ValueError(f"edge weight and horizon must be >= 0, got {weight} and {horizon}")
    if weight == 1.0 or wheels_off is None:
        return None
    wheels = np.asarray(wheels_off)
    off = wheels > 0
    if off.shape != (n,):
        raise ValueError(f"wheels_off has shape {off.shape}, the episode {n} steps")
    near = np.zeros(n, bool)
    near[1:] |= off[:-1]  # on the edge before the action
    c = np.concatenate([[0], np.cumsum(off)])  # off within steps i .. i + horizon - 1
    i = np.arange(n)
    near |= c[np.minimum(i + horizon, n)] - c[i] > 0
    near[1:] &= wheels[:-1] < 4  # not frames taken with the car off the road altogether
    return np.where(near, np.float32(weight), np.float32(1.0)).astype(np.float32)


def wrong_way_weights(wrong_way: np.ndarray | None, n: int, weight: float) -> np.ndarray | None:
    """Per-frame loss weights of one relabelled episode: ``weight`` on the frames taken while the car
    drove against the lap's direction, 1 elsewhere.

    Frame i (the observation on which action i was taken) is such a frame when the car drove the
    wrong way after step i - 1 (``wrong_way[i - 1]``); frame 0, the reset's, never is. There the
    teacher's labels turn the car round, from the lap's direction, which its privileged state holds
    and the student's frames do not (see the module's docstring).

    Args:
        wrong_way: (n,) bool, the car driving the wrong way after each step
            (:attr:`agent.actors.rollout.Episode.wrong_way`), or None (an env without a track).
        n: the episode's frames (steps). weight: >= 0 (0 leaves those frames out of the loss).

    Returns:
        (n,) float32 weights, or None when ``weight`` is 1 or the env reports no direction.

    Raises:
        ValueError: ``wrong_way`` not of n entries, a negative or non-finite weight.
    """
    if not (np.isfinite(weight) and weight >= 0):
        raise ValueError(f"wrong-way weight must be finite and >= 0, got {weight}")
    if weight == 1.0 or wrong_way is None:
        return None
    wrong = np.asarray(wrong_way, dtype=bool)
    if wrong.shape != (n,):
        raise ValueError(f"wrong_way has shape {wrong.shape}, the episode {n} steps")
    before = np.zeros(n, bool)
    before[1:] = wrong[:-1]  # the state on which action i was taken
    return np.where(before, np.float32(weight), np.float32(1.0)).astype(np.float32)


def episode_weights(ep, edge_weight: float = 1.0, edge_horizon: int = 10,
                    wrong_way_weight: float = 1.0) -> np.ndarray | None:
    """One relabelled episode's per-frame loss weights: :func:`edge_weights` times :func:`wrong_way_weights`.

    Args:
        ep: an :class:`agent.actors.rollout.Episode` (its ``wheels_off`` and ``wrong_way``).
        edge_weight, edge_horizon, wrong_way_weight: as in :func:`dagger_round`.

    Returns:
        (ep.steps,) float32 weights, or None when both factors are all ones (or not reported).

    Raises:
        ValueError: a weight or horizon out of range, or per-step figures of the wrong length.
    """
    edge = edge_weights(ep.wheels_off, ep.steps, edge_weight, edge_horizon)
    wrong = wrong_way_weights(ep.wrong_way, ep.steps, wrong_way_weight)
    if edge is None or wrong is None:
        return wrong if edge is None else edge
    return (edge * wrong).astype(np.float32)


def dagger_round(policy, expert, env, seeds: list[int], beta: float, max_steps: int | None,
                 rng: np.random.Generator, disturb: float = 0.0, disturb_kinds: tuple[str, ...] | None = None,
                 edge_weight: float = 1.0, edge_horizon: int = 10, wrong_way_weight: float = 1.0):
    """The student drives on ``seeds`` (the expert's action executed with probability ``beta``,
    ``disturb`` disturbances per 1000 steps, drawn from ``disturb_kinds``, default
    :data:`agent.actors.perturb.DEFAULT_KINDS`); the expert labels every visited state.

    Args:
        env: one CarRacing env (episodes one after another), or an
            :class:`agent.actors.vector.CarRacingEnvs` (N envs at once; it must carry the privileged
            state in ``info``: ``privileged_info=True``).
        edge_weight, edge_horizon: per-frame loss weights (:func:`edge_weights`); 1 gives none.
        wrong_way_weight: the loss weight of frames driven the wrong way (:func:`wrong_way_weights`),
            multiplied with the edge weights; 1 gives none.

    Returns:
        (Demonstrations of the labelled episodes, their episode returns, the Episodes themselves),
        in seed order.
    """
    kinds = tuple(disturb_kinds or DEFAULT_KINDS)
    if isinstance(env, CarRacingEnvs):
        episodes = _vector_round(policy, expert, env, seeds, beta, max_steps, rng, disturb, kinds)
    else:
        actor = MixtureActor(PolicyActor(policy), ExpertActor(expert), beta, rng)
        if disturb > 0:
            actor = PerturbedActor(actor, DisturbanceConfig(per_episode=disturb, kinds=kinds), rng)
        episodes = [rollout(env, actor, s, max_steps=max_steps, labeler=expert.act)
                    for s in progress(seeds, desc="DAgger rollouts", unit="ep", leave=False)]
    frames, labels, returns, weights = [], [], [], []
    for ep in episodes:
        frames.append(ep.observations[:-1])
        labels.append(ep.labels)
        returns.append(ep.episode_return)
        weights.append(episode_weights(ep, edge_weight, edge_horizon, wrong_way_weight))
    if all(w is None for w in weights):
        weights = None
    else:
        weights = [np.ones(len(a), np.float32) if w is None else w for w, a in zip(weights, labels)]
    return Demonstrations(frames, labels, list(seeds), returns, weights=weights), returns, episodes


def _vector_round(policy, expert, envs, seeds: list[int], beta: float, max_steps: int | None,
                  rng: np.random.Generator, disturb: float, kinds: tuple[str, ...]) -> list:
    """:func:`dagger_round`'s episodes on ``envs`` (an :class:`agent.actors.vector.CarRacingEnvs`), in seed order."""
    if not envs.privileged_info:
        raise ValueError("DAgger's expert labels from privileged state: make the CarRacingEnvs with privileged_info=True")
    teacher = BatchExpertActor(expert)
    base_seed = int(rng.integers(2**63))  # one draw per round from the run's generator
    template = envs.template()
    action_space = template.action_space
    template.close()
    actor = BatchMixtureActor(BatchPolicyActor(policy), teacher, beta, base_seed, action_space, disturb, kinds)
    bar = progress(total=len(seeds), desc=f"DAgger rollouts ({envs.n} envs)", unit="ep", leave=False)
    try:
        return run_episodes(envs, actor, seeds, max_steps=max_steps, labeler=teacher,
                            on_episode=lambda i, ep: bar.update(1))
    finally:
        bar.close()


def _save_round(episodes, env, out: str, r: int, beta: float) -> str:
    """Write one round's episodes, actions replaced by the expert's labels, as a Minari dataset."""
    import dataclasses

    path = f"{out}-r{r}-v0"
    if isinstance(env, CarRacingEnvs):
        env = env.template()  # the recording's spaces and spec: the one-env path's env
    writer = RecordingWriter(path, env, "dagger-student", overwrite=True,
                             description=f"DAgger round {r}: frames the student visited (expert's action executed "
                                         f"with probability {beta:.3f}); actions are the PPO expert's labels")
    for ep in episodes:
        writer.add(dataclasses.replace(ep, actions=ep.labels))
    return path


def dagger(policy, train_source, val_source, expert, env, cfg, report, tb=None, checkpoint=None, resume=None,
           t_start: float | None = None):
    """``cfg.dagger_rounds`` rounds of rollouts, relabelling, aggregation and :func:`fit`; returns the policy.

    Args:
        checkpoint: an :class:`agent.train.checkpoint.Checkpointer`, or None: when given, each
            round's relabelled episodes are written to the run folder once its rollouts end and
            trained on from there, memory-mapped (:func:`agent.train.checkpoint.load_round`: the
            frames of the rounds stay on disk), and a checkpoint is written after the rollouts,
            after every epoch of the round's fit and after the round. None: the rounds' frames
            stay in memory.
        resume: a checkpoint of stage "dagger" (:func:`agent.train.checkpoint.load_checkpoint`),
            with the global RNG states already restored: the rounds' saved data are added back in
            order, DAgger's generator is set, and the run continues where the checkpoint was taken
            (the policy's weights are the caller's to restore, or the fit state's).
        t_start: the run's start (``time.time()``), for the checkpoints' elapsed seconds.

    Raises:
        agent.train.checkpoint.CheckpointError: a round's saved data is missing or unreadable.
        OSError: a checkpoint cannot be written (the previous one stays).
    """
    rng = np.random.default_rng(cfg.seed)
    done = cfg.epochs
    betas = beta_schedule(cfg.dagger_beta, cfg.dagger_beta_decay, cfg.dagger_rounds)
    t_start = t_start if t_start is not None else time.time()
    rounds: list[str] = []  # the rounds' data files in the run folder
    r_resume, round_done, fit_resume = 0, True, None
    if resume is not None:
        if resume["rng"].get("dagger") is not None:
            rng.bit_generator.state = resume["rng"]["dagger"]
        rounds = list(resume["rounds"])
        for name in rounds:
            train_source = train_source.extend(load_round(checkpoint.run_dir, name))
        r_resume, round_done, fit_resume = int(resume["round"]), bool(resume["round_done"]), resume["fit"]

    def save(what: str, **state) -> None:
        if checkpoint is not None:
            checkpoint.save(what, dagger_rng=rng, stage="dagger", report=report.as_dict(),
                            elapsed=time.time() - t_start, rounds=list(rounds), **state)

    for r, beta in enumerate(betas, start=1):
        if r < r_resume or (r == r_resume and round_done):  # finished before the run was resumed
            done += cfg.dagger_epochs
            continue
        t0 = time.time()
        if r == r_resume:  # the rollouts ended before the interruption; their data were added back above
            resumed_fit, fit_resume = fit_resume, None
        else:
            resumed_fit = None
            seeds = [cfg.dagger_seed + (r - 1) * cfg.dagger_episodes + i for i in range(cfg.dagger_episodes)]
            new, returns, episodes = dagger_round(policy, expert, env, seeds, beta, cfg.dagger_max_steps, rng,
                                                  cfg.dagger_disturb, tuple(cfg.dagger_disturb_kinds),
                                                  cfg.dagger_edge_weight, cfg.dagger_edge_horizon,
                                                  cfg.dagger_wrong_way_weight)
            report.dagger_returns.append([float(x) for x in returns])
            log.info("DAgger round %d/%d (beta %.3f): return %.1f ± %.1f on %d tracks; %d frames relabelled", r,
                     cfg.dagger_rounds, beta, np.mean(returns), np.std(returns), len(returns), new.n_frames)
            wrong = sum(ep.wrong_way_steps or 0 for ep in episodes)
            log.info("DAgger round %d: %d of %d steps driven the wrong way%s", r, wrong, new.n_frames,
                     f" (their frames weigh {cfg.dagger_wrong_way_weight:g})" if cfg.dagger_wrong_way_weight != 1.0 else "")
            if cfg.dagger_edge_weight != 1.0 and new.weights is not None:
                near = sum(int(np.count_nonzero(w != 1.0)) for w in new.weights)
                log.info("DAgger round %d: %d of %d frames near the road's edge weigh %.1f", r, near, new.n_frames,
                         cfg.dagger_edge_weight)
            if cfg.dagger_out:
                log.info("DAgger round %d data -> %s", r, _save_round(episodes, env, cfg.dagger_out, r, beta))
            if tb is not None:
                tb.add_scalar("eval/dagger_return", float(np.mean(returns)), r)
                tb.add_scalar("charts/dagger_beta", beta, r)
            replay = (RoundReplay(envs_fields(env), cfg.dagger_max_steps, [ep.actions for ep in episodes])
                      if isinstance(env, CarRacingEnvs) else None)  # the frames replay from these (agent.actors.replay)
            del episodes  # their frames: the round's data is `new`
            if checkpoint is not None:  # the round on disk; trained on memory-mapped, so memory does not grow
                rounds.append(checkpoint.save_round(r, new, replay))
                new = load_round(checkpoint.run_dir, rounds[-1])
            train_source = train_source.extend(new)
            del new
            if checkpoint is not None:
                save(f"DAgger round {r} rollouts", round=r, round_done=False, fit=None, policy=policy.state_dict())

        def on_epoch(state, r=r):
            save(f"DAgger round {r} epoch {state['epochs_done']} of {cfg.dagger_epochs}", round=r,
                 round_done=False, fit=state, policy=None)

        policy = fit(policy, train_source, val_source, cfg, cfg.dagger_epochs, report, tb, f"dagger {r}",
                     epoch_offset=done, resume=resumed_fit, on_epoch=on_epoch)
        done += cfg.dagger_epochs
        report.seconds[f"dagger_round_{r}"] = time.time() - t0
        save(f"DAgger round {r}", round=r, round_done=True, fit=None, policy=policy.state_dict())
    report.n_train_frames = int(sum(train_source.lengths))
    report.n_train_sequences = len(train_source.lengths)
    return policy


__all__ = ["beta_schedule", "dagger", "dagger_round", "edge_weights", "episode_weights", "wrong_way_weights"]
