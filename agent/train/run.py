"""One training run: behaviour cloning (:mod:`agent.train.bc`), then DAgger rounds (:mod:`agent.train.dagger`).

Both are below this module: :func:`agent.train.dagger.dagger` retrains with
:func:`agent.train.bc.fit`, and :func:`train` runs the two in order.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from agent.actors.loading import reads_speedometer
from agent.log import get_logger
from agent.nn.policy import DrivingPolicy, PolicyConfig
from agent.train import distributed as ddp
from agent.train.bc import TrainConfig, TrainReport, fit, hparams_text, report_metadata, run_name
from agent.train.checkpoint import Checkpointer, restore_rng
from agent.train.dagger import dagger
from agent.train.distributed import DistContext

log = get_logger("agent.train.bc")  # the run's lines keep the logger name they always had


def train(source, policy_config: PolicyConfig, cfg: TrainConfig, tensorboard_dir: str | Path | None = None,
          expert=None, env=None, bc_checkpoint: str | Path | None = None,
          init: DrivingPolicy | None = None, dist: DistContext | None = None, checkpoint: Checkpointer | None = None,
          resume: dict | None = None) -> tuple[DrivingPolicy, TrainReport]:
    """Behaviour cloning on ``source``, then ``cfg.dagger_rounds`` DAgger rounds with ``expert`` in ``env``.

    Args:
        source: a :class:`agent.data.windows.DemonstrationSource` or ``UdacitySource``.
        policy_config: the policy to build (:func:`agent.nn.policy.default_config`).
        cfg: hyper-parameters.
        tensorboard_dir: TensorBoard root (a run folder is made inside), or None.
        expert, env: the PPO expert and the CarRacing env, for DAgger.
        bc_checkpoint: also save the policy as it is after behaviour cloning, before DAgger.
        init: start from this trained policy (its configuration replaces ``policy_config``); with
            ``cfg.epochs == 0`` behaviour cloning is skipped, so DAgger continues a saved BC policy.
        dist: this process's place in a torchrun run (:func:`agent.train.distributed.init_from_env`);
            None: one process. Every rank returns the same policy; only rank 0 logs, writes
            TensorBoard and ``bc_checkpoint``. The initial weights are seeded alike on every rank
            (DDP broadcasts rank 0's anyway); torch's RNG is then reseeded with ``seed + rank``
            (dropout). The augmentation draws depend on (seed, epoch, window), not on the rank.
        checkpoint: an :class:`agent.train.checkpoint.Checkpointer`: a checkpoint after every
            epoch, after behaviour cloning and after every DAgger round (and DAgger's round data),
            written by rank 0 alone. None: none.
        resume: a checkpoint of this run (:func:`agent.train.checkpoint.load_checkpoint`), made
            with the same arguments: the run continues after it and ends with the weights and
            report an uninterrupted run gives (the seconds aside). Needs ``checkpoint`` when it
            is of stage "dagger" (the rounds' data are read from its run folder).

    Returns:
        (the best policy, in eval mode; the report).

    Raises:
        ValueError: DAgger without an expert and env, DAgger under torchrun
            (:data:`agent.train.distributed.DAGGER_UNDER_TORCHRUN`), a source without training
            frames, no epochs and nothing to start from, or synthetic standstills
            (``source.standstills``) for a student that reads the whole dashboard; a
            ``speedometer`` student on frames without recorded speeds (nothing drawn then);
            ``resume`` under torchrun.
        OSError: a checkpoint cannot be written (:func:`agent.train.checkpoint.atomic_save`).
    """
    dist = dist if dist is not None else DistContext(device=cfg.device)
    if cfg.epochs == 0 and init is None:
        raise ValueError("epochs 0 (no behaviour cloning) needs a policy to start from (--init)")
    if cfg.dagger_rounds and dist.world_size > 1:
        raise ValueError(ddp.DAGGER_UNDER_TORCHRUN)
    if cfg.dagger_rounds and (expert is None or env is None):
        raise ValueError("DAgger needs --expert (the PPO expert that labels the student's states)")
    if resume is not None and dist.world_size > 1:
        raise ValueError("resuming a checkpoint under torchrun is not supported; resume it in one process")
    t_start = time.time()
    torch.manual_seed(cfg.seed)
    if init is not None:
        policy, policy_config = init, init.config
    else:
        policy = DrivingPolicy(policy_config)
    if dist.distributed:
        torch.manual_seed(cfg.seed + dist.rank)  # dropout differs between ranks; the weights above do not
    if reads_speedometer(policy):
        if not hasattr(source, "draw_speedometer"):
            raise ValueError(f"--dashboard {policy.features.dashboard} reads the speed CarRacing frames carry; "
                             "these data are not CarRacing's")
        source.draw_speedometer()  # recorded frames, as the speedometer env would have given them
    if getattr(source, "standstills", 0) and getattr(policy.features, "dashboard", None) == "visible":
        raise ValueError("synthetic standstills (--standstills) blank only the speed bar; a student that reads the "
                         "whole dashboard (--dashboard visible) would see indicators no standing car shows. Use "
                         "--dashboard speed or hidden, or leave --standstills at 0")
    train_src, val_src = source.split(cfg.val_fraction, cfg.seed)
    name = run_name(policy_config.env, policy_config.core, cfg.seed)
    report = TrainReport(run_name=name, config=asdict(cfg), policy_config=policy_config.to_dict(),
                         metric=policy.head.metric, higher_is_better=policy.head.higher_is_better,
                         data=source.describe(), n_train_frames=int(sum(train_src.lengths)),
                         n_val_frames=int(sum(val_src.lengths)) if val_src is not None else 0,
                         n_train_sequences=len(train_src.lengths),
                         n_val_sequences=len(val_src.lengths) if val_src is not None else 0)
    if policy.head.kind == "continuous":  # the trivial baselines on the held-out frames
        ys = [train_src.targets(e) for e, n in enumerate(train_src.lengths) if n]
        # per output: (A,) for (N, A) targets (CarRacing's steering and throttle), a scalar for (N,) steering
        mean = np.mean(np.concatenate(ys), axis=0) if ys else 0.0
        if np.ndim(mean) == 0:
            mean = float(mean)
            report.baselines["train_mean_steering"] = mean
        else:
            report.baselines["train_mean_action"] = [float(m) for m in mean]
        if val_src is not None:
            vy = np.concatenate([val_src.targets(e) for e, n in enumerate(val_src.lengths) if n])
            report.baselines.update(val_zero_mse=float(np.mean(vy ** 2)), val_mean_mse=float(np.mean((vy - mean) ** 2)))
    stage = "bc"
    if resume is not None:  # the report so far, its run name, and the seconds already spent
        report = TrainReport.from_dict(resume["report"])
        name, stage, t_start = report.run_name, resume["stage"], time.time() - float(resume["elapsed"])
    tb = None
    if tensorboard_dir and dist.is_main:
        from torch.utils.tensorboard import SummaryWriter  # tensorboard loads only when a run logs to it

        tb = SummaryWriter(str(Path(tensorboard_dir) / name))
        tb.add_text("hyperparameters", hparams_text(cfg, policy_config))
    log.info("behaviour cloning %s: %s (train %d frames, held-out %d), %s core, window T=%d, %d parameters",
             name, source.describe(), report.n_train_frames, report.n_val_frames, policy_config.core,
             policy_config.window, sum(p.numel() for p in policy.parameters()))
    if dist.distributed:
        log.info("data-parallel (torchrun): world size %d, %s, %d torch thread(s) per rank, %d windows per step "
                 "per rank", dist.world_size, dist.backend, torch.get_num_threads(),
                 ddp.shard_batch_size(max(1, cfg.batch_frames // policy_config.window), dist))
    if report.baselines.get("val_zero_mse") is not None:
        log.info("held-out baselines: predict 0 MSE %.4f, predict the training mean MSE %.4f",
                 report.baselines["val_zero_mse"], report.baselines["val_mean_mse"])
    if resume is not None:
        log.info("resumed from the checkpoint of %s", resume.get("what", stage))
        restore_rng(resume["rng"])  # the generators as they were when the checkpoint was taken
    checkpoint = checkpoint if dist.is_main else None

    def save(what: str, **state) -> None:
        if checkpoint is not None:
            checkpoint.save(what, report=report.as_dict(), elapsed=time.time() - t_start, **state)

    if stage == "bc":
        if cfg.epochs:
            policy = fit(policy, train_src, val_src, cfg, cfg.epochs, report, tb, "bc", t_start=t_start, dist=dist,
                         resume=resume["fit"] if resume is not None else None,
                         on_epoch=lambda state: save(f"bc epoch {state['epochs_done']} of {cfg.epochs}", stage="bc",
                                                     fit=state, policy=None, rounds=[]))
        report.seconds["bc"] = time.time() - t_start
        if bc_checkpoint is not None and dist.is_main:
            _save_bc(policy, Path(bc_checkpoint), report_metadata(report, stage="behaviour cloning (before DAgger)"))
        if cfg.dagger_rounds:
            save("behaviour cloning", stage="dagger", round=0, round_done=True, fit=None,
                 policy=policy.state_dict(), rounds=[])
    elif resume.get("policy") is not None:  # behaviour cloning ended before the interruption
        policy.load_state_dict(resume["policy"])
    if stage != "bc":  # as fit() leaves it
        policy.to(torch.device(dist.device if dist.distributed else cfg.device)).eval()
    if cfg.dagger_rounds:
        policy = dagger(policy, train_src, val_src, expert, env, cfg, report, tb, checkpoint=checkpoint,
                        resume=resume if stage == "dagger" else None, t_start=t_start)
    report.seconds["total"] = time.time() - t_start
    if tb is not None:
        tb.close()
    return policy, report


def _save_bc(policy: DrivingPolicy, path: Path, metadata: dict) -> None:
    """``policy.save(path)`` (its ``.tmp`` file removed after a failed write); the OSError says
    which file it was (the checkpoint taken after the last epoch is kept)."""
    try:
        policy.save(path, metadata=metadata)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write the behaviour-cloning policy (--save-bc; {exc.strerror or exc}); "
                                 "the run folder's checkpoint is kept", str(path)) from exc


__all__ = ["train"]
