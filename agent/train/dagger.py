"""DAgger on top of behaviour cloning (Ross, Gordon and Bagnell 2011, "A Reduction of Imitation
Learning and Structured Prediction to No-Regret Online Learning").

Each round the student drives ``dagger_episodes`` training tracks (the expert's action is
executed instead with probability ``dagger_beta``, :class:`agent.rollout.MixtureActor`), the
expert labels every state the student visits (cheap here: it reads the privileged state of the
same env), the labelled episodes join the training data, and :func:`agent.train.bc.fit` trains
the student further on the aggregate. Tracks of round r: ``dagger_seed + r * dagger_episodes + i``
(500,000 onwards by default: never the evaluation tracks). TensorBoard: ``eval/dagger_return``.
"""

from __future__ import annotations

import time

import numpy as np

from agent.log import get_logger, progress

log = get_logger(__name__)


def dagger_round(policy, expert, env, seeds: list[int], beta: float, max_steps: int | None,
                 rng: np.random.Generator):
    """The student drives on ``seeds``; the expert labels every visited state.

    Returns:
        (Demonstrations of the labelled episodes, their episode returns).
    """
    from agent.data.recordings import Demonstrations
    from agent.rollout import ExpertActor, MixtureActor, PolicyActor, rollout

    actor = MixtureActor(PolicyActor(policy), ExpertActor(expert), beta, rng)
    frames, labels, returns = [], [], []
    for s in progress(seeds, desc="DAgger rollouts", unit="ep", leave=False):
        ep = rollout(env, actor, s, max_steps=max_steps, labeler=expert.act)
        frames.append(ep.observations[:-1])
        labels.append(ep.labels)
        returns.append(ep.episode_return)
    return Demonstrations(frames, labels, list(seeds), returns), returns


def dagger(policy, train_source, val_source, expert, env, cfg, report, tb=None):
    """``cfg.dagger_rounds`` rounds of rollouts, relabelling, aggregation and :func:`fit`; returns the policy."""
    from agent.train.bc import fit

    rng = np.random.default_rng(cfg.seed)
    done = cfg.epochs
    for r in range(cfg.dagger_rounds):
        t0 = time.time()
        seeds = [cfg.dagger_seed + r * cfg.dagger_episodes + i for i in range(cfg.dagger_episodes)]
        new, returns = dagger_round(policy, expert, env, seeds, cfg.dagger_beta, cfg.dagger_max_steps, rng)
        report.dagger_returns.append([float(x) for x in returns])
        log.info("DAgger round %d/%d: student return %.1f ± %.1f on %d tracks; %d frames relabelled", r + 1,
                 cfg.dagger_rounds, np.mean(returns), np.std(returns), len(returns), new.n_frames)
        if tb is not None:
            tb.add_scalar("eval/dagger_return", float(np.mean(returns)), r + 1)
        train_source = train_source.extend(new)
        policy = fit(policy, train_source, val_source, cfg, cfg.dagger_epochs, report, tb, f"dagger {r + 1}",
                     epoch_offset=done)
        done += cfg.dagger_epochs
        report.seconds[f"dagger_round_{r + 1}"] = time.time() - t0
    report.n_train_frames = int(sum(train_source.lengths))
    report.n_train_sequences = len(train_source.lengths)
    return policy


__all__ = ["dagger", "dagger_round"]
