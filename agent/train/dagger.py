"""DAgger on top of behaviour cloning (Ross, Gordon and Bagnell 2011, "A Reduction of Imitation
Learning and Structured Prediction to No-Regret Online Learning").

Each round r = 1..R the student drives ``dagger_episodes`` training tracks, the expert labels
every state the student visits (cheap here: it reads the privileged state of the same env), the
labelled episodes join the training data, and :func:`agent.train.bc.fit` trains the student
further on the aggregate.

- **Mixing schedule.** On each step the expert's action is executed instead of the student's
  with probability beta_r = ``dagger_beta`` * ``dagger_beta_decay`` ** (r - 1)
  (:class:`agent.rollout.MixtureActor`): Ross et al.'s beta_i = p^(i-1), where round 0, the
  expert's own demonstrations, had beta = 1. ``--dagger-beta 0.5 --dagger-beta-decay 0.5`` gives
  0.5, 0.25, 0.125, ...
- **Failure states.** Episodes are never cut when the car leaves the road or stops: the student
  drives on, and the expert labels the way back. With ``dagger_disturb`` > 0, disturbances
  (:mod:`agent.train.perturb`, in the spirit of DART, Laskey et al. 2017) push the car off the
  road or to a standstill that many times per 1000 steps on average, so those states are
  labelled even when the student itself would not reach them.
- **Data.** With ``dagger_out``, each round's relabelled episodes are also written as a Minari
  dataset ``<dagger_out>-r<round>-v0`` whose actions are the expert's labels (what the student
  is trained on), so ``agent train --data`` can use them again.

Tracks of round r: ``dagger_seed + (r - 1) * dagger_episodes + i`` (500,000 onwards by default:
never the evaluation tracks). TensorBoard: ``eval/dagger_return``, ``charts/dagger_beta``.

**Vectorised rollouts.** Given an :class:`agent.vector.CarRacingEnvs` instead of one env
(``agent train --envs N``), each round's episodes run on N envs at once, the student and the
expert acting on the batch (:func:`agent.vector.run_episodes`); the episodes come back in seed
order. With beta = 0 and no disturbances they are those of the one-env path; otherwise each
episode draws from its own generator (:class:`agent.vector.BatchMixtureActor`), so they do not
depend on N but differ from the one-env path's single stream.
"""

from __future__ import annotations

import time

import numpy as np

from agent.log import get_logger, progress

log = get_logger(__name__)


def beta_schedule(beta: float, decay: float, rounds: int) -> list[float]:
    """beta_r = beta * decay ** (r - 1) for rounds r = 1..``rounds`` (each in [0, 1])."""
    return [float(beta * decay ** r) for r in range(rounds)]


def dagger_round(policy, expert, env, seeds: list[int], beta: float, max_steps: int | None,
                 rng: np.random.Generator, disturb: float = 0.0, disturb_kinds: tuple[str, ...] | None = None):
    """The student drives on ``seeds`` (the expert's action executed with probability ``beta``,
    ``disturb`` disturbances per 1000 steps, drawn from ``disturb_kinds``, default
    :data:`agent.train.perturb.DEFAULT_KINDS`); the expert labels every visited state.

    Args:
        env: one CarRacing env (episodes one after another), or an
            :class:`agent.vector.CarRacingEnvs` (N envs at once; it must carry the privileged
            state in ``info``: ``privileged_info=True``).

    Returns:
        (Demonstrations of the labelled episodes, their episode returns, the Episodes themselves),
        in seed order.
    """
    from agent.data.recordings import Demonstrations
    from agent.rollout import ExpertActor, MixtureActor, PolicyActor, rollout
    from agent.train.perturb import DEFAULT_KINDS, DisturbanceConfig, PerturbedActor
    from agent.vector import CarRacingEnvs

    kinds = tuple(disturb_kinds or DEFAULT_KINDS)
    if isinstance(env, CarRacingEnvs):
        episodes = _vector_round(policy, expert, env, seeds, beta, max_steps, rng, disturb, kinds)
    else:
        actor = MixtureActor(PolicyActor(policy), ExpertActor(expert), beta, rng)
        if disturb > 0:
            actor = PerturbedActor(actor, DisturbanceConfig(per_episode=disturb, kinds=kinds), rng)
        episodes = [rollout(env, actor, s, max_steps=max_steps, labeler=expert.act)
                    for s in progress(seeds, desc="DAgger rollouts", unit="ep", leave=False)]
    frames, labels, returns = [], [], []
    for ep in episodes:
        frames.append(ep.observations[:-1])
        labels.append(ep.labels)
        returns.append(ep.episode_return)
    return Demonstrations(frames, labels, list(seeds), returns), returns, episodes


def _vector_round(policy, expert, envs, seeds: list[int], beta: float, max_steps: int | None,
                  rng: np.random.Generator, disturb: float, kinds: tuple[str, ...]) -> list:
    """:func:`dagger_round`'s episodes on ``envs`` (an :class:`agent.vector.CarRacingEnvs`), in seed order."""
    from agent.vector import BatchExpertActor, BatchMixtureActor, BatchPolicyActor, run_episodes

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

    from agent.data.recordings import RecordingWriter
    from agent.vector import CarRacingEnvs

    path = f"{out}-r{r}-v0"
    if isinstance(env, CarRacingEnvs):
        env = env.template()  # the recording's spaces and spec: the one-env path's env
    writer = RecordingWriter(path, env, "dagger-student", overwrite=True,
                             description=f"DAgger round {r}: frames the student visited (expert's action executed "
                                         f"with probability {beta:.3f}); actions are the PPO expert's labels")
    for ep in episodes:
        writer.add(dataclasses.replace(ep, actions=ep.labels))
    return path


def dagger(policy, train_source, val_source, expert, env, cfg, report, tb=None):
    """``cfg.dagger_rounds`` rounds of rollouts, relabelling, aggregation and :func:`fit`; returns the policy."""
    from agent.train.bc import fit

    rng = np.random.default_rng(cfg.seed)
    done = cfg.epochs
    betas = beta_schedule(cfg.dagger_beta, cfg.dagger_beta_decay, cfg.dagger_rounds)
    for r, beta in enumerate(betas, start=1):
        t0 = time.time()
        seeds = [cfg.dagger_seed + (r - 1) * cfg.dagger_episodes + i for i in range(cfg.dagger_episodes)]
        new, returns, episodes = dagger_round(policy, expert, env, seeds, beta, cfg.dagger_max_steps, rng,
                                              cfg.dagger_disturb, tuple(cfg.dagger_disturb_kinds))
        report.dagger_returns.append([float(x) for x in returns])
        log.info("DAgger round %d/%d (beta %.3f): return %.1f ± %.1f on %d tracks; %d frames relabelled", r,
                 cfg.dagger_rounds, beta, np.mean(returns), np.std(returns), len(returns), new.n_frames)
        if cfg.dagger_out:
            log.info("DAgger round %d data -> %s", r, _save_round(episodes, env, cfg.dagger_out, r, beta))
        if tb is not None:
            tb.add_scalar("eval/dagger_return", float(np.mean(returns)), r)
            tb.add_scalar("charts/dagger_beta", beta, r)
        train_source = train_source.extend(new)
        policy = fit(policy, train_source, val_source, cfg, cfg.dagger_epochs, report, tb, f"dagger {r}",
                     epoch_offset=done)
        done += cfg.dagger_epochs
        report.seconds[f"dagger_round_{r}"] = time.time() - t0
    report.n_train_frames = int(sum(train_source.lengths))
    report.n_train_sequences = len(train_source.lengths)
    return policy


__all__ = ["beta_schedule", "dagger", "dagger_round"]
