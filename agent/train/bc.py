"""Behaviour cloning: one training loop for both simulators and every core.

Read top to bottom (CleanRL style; docs/design.md section 6):

1. the data: a source of sequences (CarRacing episodes or Udacity session segments,
   :mod:`agent.data.windows`) is split for validation (by episode; Udacity: the last block of each
   recording) and cut into windows of T frames, batched by :class:`agent.train.batches.TrainBatches`:
   on the device from frames copied there once (CUDA, when they fit), or by a ``DataLoader``
   (augmentation runs in its workers, ``--workers``; pinned and prefetched on CUDA);
2. the policy (:class:`agent.nn.policy.DrivingPolicy`) predicts the target at EVERY position of a
   window (its core is causal, so position i sees frames <= i: T targets for the price of T
   features passes; early positions train the short context that starts a drive). A non-causal
   core (torch-nac) is scored on the last position only. The loss is the head's own:
   cross-entropy for discrete actions, mean squared error for steering;
3. AdamW with gradient clipping, and a one-cycle or cosine learning-rate schedule;
4. after each epoch the held-out sequences are scored exactly as the policy acts (streaming,
   one frame at a time, :func:`agent.eval.offline.score_stream`) with the head's metric, and the
   best checkpoint by that metric's direction (higher accuracy, lower MSE) is kept.

TensorBoard (``runs/<run name>``, the name holds env, core, seed and time): ``losses/train``,
``losses/val_<metric>``, ``charts/lr``, ``charts/epoch_seconds``, ``charts/train_frames_per_s`` (window
positions trained on per second of the epoch's training loop, this rank's), and the hyper-parameters
as text. DAgger (:mod:`agent.train.dagger`) sits on top of :func:`fit`; :func:`agent.train.run.train` runs
behaviour cloning, then DAgger.

Under ``torchrun`` (:mod:`agent.train.distributed`) the same loop runs data-parallel: each rank
reads its shard of the windows (``DistributedSampler``), the model is wrapped in
``DistributedDataParallel``, the held-out metric is all-reduced, and rank 0 alone logs and writes.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch

from agent.actors.perturb import DisturbanceConfig
from agent.data.windows import WindowDataset
from agent.eval.offline import score_stream
from agent.log import get_logger, progress
from agent.nn.policy import DrivingPolicy, PolicyConfig
from agent.train import distributed as ddp
from agent.train.batches import BATCH_PATHS, DEVICE_SHARE, TrainBatches, to_device
from agent.train.distributed import DistContext
from envs.tracks import DAGGER_SEED_BASE

log = get_logger(__name__)

SCHEDULES = ("onecycle", "cosine")


@dataclass
class TrainConfig:
    """Hyper-parameters of a behaviour-cloning run (and of the DAgger rounds on top).

    Attributes:
        epochs: passes over the training windows.
        batch_frames: frames per batch (windows per batch = batch_frames // T, fair across T).
        lr: peak learning rate. weight_decay: AdamW's. grad_clip: max gradient norm.
        schedule: "onecycle" (warm up over 15 %, then anneal) or "cosine" (decay to lr / 20).
        val_fraction: the share held out for validation (episodes; Udacity: each recording's last rows).
        seed: weights, split, batches and augmentation.
        device: torch device. workers: DataLoader worker processes (0: load in the main process).
        batches: where the training batches are built (:mod:`agent.train.batches`): "device" (the
            frames copied to the device once, windows gathered there), "loader" (the DataLoader;
            pinned and prefetched on CUDA) or "auto" ("device" on CUDA when the data fit in
            ``device_share`` of the free GPU memory, else "loader"; "loader" on the CPU). Either gives
            the same batches for a seed.
        device_share: the share of the free GPU memory, in (0, 1], that "auto" lets the data take.
        time_limit_s: stop after the epoch that crosses this many seconds (None: no limit).
        dagger_*: see :mod:`agent.train.dagger` (CarRacing only); ``dagger_edge_weight`` and
            ``dagger_edge_horizon`` (steps): :func:`agent.train.dagger.edge_weights`;
            ``dagger_wrong_way_weight``: :func:`agent.train.dagger.wrong_way_weights`.
        class_weights: discrete heads: one loss weight per action (in the head's action order), given
            to every frame by its target action (:func:`class_frame_weights`), e.g. ``(1, 1, 1, 1, 4)``
            weighs CarRacing's rare brake labels 4 times; None: all 1. The usual class-weighted
            cross-entropy of imbalanced classification, as a weighted mean (:meth:`ActionHead.loss`).
        concordance: continuous heads: the loss is MSE + concordance x (1 - CCC) over each batch
            (:meth:`agent.nn.heads.RegressionHead.concordance_loss`, Lin's concordance correlation), a
            term that does not reward outputs shrunk toward 0; 0: MSE alone.

    Raises:
        ValueError: a setting out of range (epochs < 0, batch_frames < 1, an unknown schedule,
            lr <= 0, workers < 0, class weights that are negative, not finite or all 0, an unknown
            ``batches``, ``device_share`` outside (0, 1]), a negative or non-finite ``concordance``.
    """

    epochs: int = 8
    batch_frames: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-4
    schedule: str = "onecycle"
    grad_clip: float = 1.0
    val_fraction: float = 0.1
    seed: int = 0
    device: str = "cpu"
    workers: int = 0
    time_limit_s: float | None = None
    dagger_rounds: int = 0
    dagger_episodes: int = 8
    dagger_epochs: int = 3
    dagger_seed: int = DAGGER_SEED_BASE
    dagger_beta: float = 0.0
    dagger_beta_decay: float = 1.0
    dagger_max_steps: int | None = None
    dagger_disturb: float = 0.0
    dagger_disturb_kinds: tuple[str, ...] = ("off-road", "stop")
    dagger_out: str | None = None
    dagger_edge_weight: float = 1.0
    dagger_edge_horizon: int = 10
    dagger_wrong_way_weight: float = 1.0
    class_weights: tuple[float, ...] | None = None
    batches: str = "auto"
    device_share: float = DEVICE_SHARE
    concordance: float = 0.0

    def __post_init__(self):
        if not (np.isfinite(self.concordance) and self.concordance >= 0):
            raise ValueError(f"concordance must be a finite weight >= 0, got {self.concordance}")
        if self.batches not in BATCH_PATHS:
            raise ValueError(f"batches must be one of {', '.join(BATCH_PATHS)}, got {self.batches!r}")
        if not 0.0 < self.device_share <= 1.0:
            raise ValueError(f"device_share must be in (0, 1], got {self.device_share}")
        if self.class_weights is not None:
            w = np.asarray(self.class_weights, dtype=np.float64)
            if w.ndim != 1 or not len(w) or not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
                raise ValueError(f"class_weights must be one finite weight >= 0 per action, not all 0; "
                                 f"got {self.class_weights}")
            self.class_weights = tuple(float(x) for x in w)
        if self.epochs < 0 or self.batch_frames < 1:
            raise ValueError(f"epochs must be >= 0 and batch_frames >= 1, got {self.epochs} and {self.batch_frames}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.lr <= 0 or self.workers < 0:
            raise ValueError("lr must be > 0 and workers >= 0")
        if not (0.0 <= self.dagger_beta <= 1.0 and 0.0 <= self.dagger_beta_decay <= 1.0):
            raise ValueError(f"dagger_beta and dagger_beta_decay must be in [0, 1], got {self.dagger_beta} and "
                             f"{self.dagger_beta_decay}")
        if self.dagger_disturb < 0:
            raise ValueError(f"dagger_disturb must be >= 0 disturbances per 1000 steps, got {self.dagger_disturb}")
        if self.dagger_edge_weight < 0 or not math.isfinite(self.dagger_edge_weight) or self.dagger_edge_horizon < 0:
            raise ValueError(f"dagger_edge_weight must be finite and >= 0 and dagger_edge_horizon >= 0 steps, got "
                             f"{self.dagger_edge_weight} and {self.dagger_edge_horizon}")
        if not (math.isfinite(self.dagger_wrong_way_weight) and self.dagger_wrong_way_weight >= 0):
            raise ValueError(f"dagger_wrong_way_weight must be finite and >= 0, got {self.dagger_wrong_way_weight}")
        DisturbanceConfig(kinds=tuple(self.dagger_disturb_kinds))  # validates the kinds


#: Each simulator's training defaults (the settings that made the shipped policies).
TRAIN_DEFAULTS = {
    "carracing": dict(epochs=8, batch_frames=256, lr=1e-3, weight_decay=1e-4, schedule="onecycle", val_fraction=0.1),
    "udacity": dict(epochs=40, batch_frames=64, lr=3e-4, weight_decay=0.0, schedule="cosine", val_fraction=0.15),
}


@dataclass
class EpochMetrics:
    """One epoch: mean training loss, held-out metric (streaming), seconds."""

    epoch: int
    train_loss: float
    val_metric: float
    seconds: float
    tag: str = "bc"


@dataclass
class TrainReport:
    """What a training run measured (also stored in the policy file's metadata)."""

    run_name: str
    config: dict
    policy_config: dict
    metric: str
    higher_is_better: bool
    data: str
    n_train_frames: int
    n_val_frames: int
    n_train_sequences: int = 0  # episodes (CarRacing) or session segments (Udacity)
    n_val_sequences: int = 0
    best_metric: float = float("nan")
    best_epoch: int = 0
    epochs: list[EpochMetrics] = field(default_factory=list)
    dagger_returns: list[list[float]] = field(default_factory=list)
    baselines: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainReport":
        """The report that :meth:`as_dict` gave (a checkpoint's, :mod:`agent.train.checkpoint`)."""
        values = dict(values)
        values["epochs"] = [EpochMetrics(**m) for m in values.get("epochs", [])]
        return cls(**values)


def run_name(env: str, core: str, seed: int) -> str:
    """``<env>__<core>__s<seed>__<yyyymmdd-HHMMSS>``: the TensorBoard run folder."""
    return f"{env}__{core}__s{seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def hparams_text(cfg: TrainConfig, pcfg: PolicyConfig) -> str:
    """The run's hyper-parameters as a markdown table (TensorBoard's text tab)."""
    rows = [f"|{k}|{v}|" for k, v in {**asdict(cfg), **{f"policy.{k}": v for k, v in pcfg.to_dict().items()}}.items()]
    return "|parameter|value|\n|-|-|\n" + "\n".join(rows)


def _loss_mask(policy: DrivingPolicy, mask: torch.Tensor) -> torch.Tensor:
    """The positions the loss counts: all real ones for a causal core; else each window's last real one."""
    if policy.core.causal:
        return mask
    last = mask.long().cumsum(1).argmax(1)  # (B,) index of the last real position
    out = torch.zeros_like(mask)
    out[torch.arange(len(mask)), last] = True
    return out & mask


def class_frame_weights(target: torch.Tensor, class_weights: torch.Tensor,
                        weight: torch.Tensor | None = None) -> torch.Tensor:
    """Per-frame loss weights from the frames' target actions (class-weighted cross-entropy, the
    usual remedy for imbalanced classes; here CarRacing's rare brake labels, README "Wider rounds
    and class-weighted rounds").

    Args:
        target: (B, T) int64 target actions; positions outside ``0..K-1`` (padding) get weight 0,
            and the loss mask leaves them out anyway.
        class_weights: (K,) float, one weight per action.
        weight: (B, T) float per-frame weights to multiply (DAgger's edge weights), or None.

    Returns:
        (B, T) float: ``class_weights[target]`` (times ``weight``), on ``target``'s device.
    """
    k = class_weights.numel()
    valid = (target >= 0) & (target < k)
    w = class_weights.to(target.device)[target.clamp(0, k - 1)] * valid
    return w if weight is None else w * weight.to(w.dtype)


def _class_weight_table(head, class_weights, device) -> torch.Tensor | None:
    """(K,) float32 tensor of ``class_weights`` on ``device`` (None for None), checked against ``head``."""
    if class_weights is None:
        return None
    if head.kind != "discrete":
        raise ValueError("class weights weigh discrete actions; this policy's head is continuous (drop "
                         "--class-weights, or train the discrete configuration)")
    if len(class_weights) != head.out_dim:
        raise ValueError(f"class weights need one weight per action: this head has {head.out_dim} actions, "
                         f"{len(class_weights)} weights were given ({list(class_weights)})")
    return torch.tensor(class_weights, dtype=torch.float32, device=device)


def make_optimizer(policy: DrivingPolicy, cfg: TrainConfig, steps: int):
    """(AdamW, its learning-rate schedule, the schedule's length in steps) for about ``steps`` steps.

    The schedule is ``cfg.schedule`` over ``max(1, steps + 1)`` steps: one-cycle (peak ``cfg.lr``,
    15 % warm-up) or cosine (to ``cfg.lr / 20``); :func:`train_step` stops stepping it at its end.
    """
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    total_steps = max(1, steps + 1)
    if cfg.schedule == "onecycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=total_steps, pct_start=0.15)
    else:
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total_steps, eta_min=cfg.lr / 20)
    return opt, sched, total_steps


def train_step(model, policy: DrivingPolicy, batch: dict, opt, sched, total_steps: int, grad_clip: float,
               class_weights: torch.Tensor | None = None, distributed: bool = False,
               concordance: float = 0.0) -> tuple[torch.Tensor | None, int]:
    """One optimisation step of :func:`fit` on ``batch`` (tensors already on the policy's device).

    Args:
        model: ``policy`` or its ``DistributedDataParallel`` wrapper (called for the outputs).
        batch: ``obs`` (B, T, H, W, C) uint8, ``t`` (B, T) seconds, ``mask`` (B, T) bool, ``target``,
            optionally ``prev`` (B, H, W, C) uint8, ``learn`` (B, T) bool, ``weight`` (B, T) float32,
            and ``counted`` (int: the positions the loss counts, known on the host; else counted on
            the device, which waits for it) (:mod:`agent.train.batches`).
        opt, sched, total_steps: from :func:`make_optimizer`; the schedule steps while
            ``sched.last_epoch + 1 < total_steps``.
        grad_clip: the gradients' max norm. class_weights: (K,) float or None.
        distributed: a data-parallel step: a batch without counted positions still joins the
            gradient all-reduce with a zero loss.
        concordance: continuous heads: add this times the batch's 1 - CCC to the MSE (:class:`TrainConfig`).

    Returns:
        (the loss, a detached 0-dim tensor on the device, the counted positions), or (None, 0) when
        the batch counts no position (no step taken).
    """
    mask = batch["mask"]
    out = model(batch["obs"], batch["t"], mask, prev=batch.get("prev"))  # (B, T, A); prev: motion channels
    counted = _loss_mask(policy, mask)
    if "learn" in batch:  # the source's own exclusions (the expert's stalls, --skip-stalls)
        counted = counted & batch["learn"]
    n = batch.get("counted")
    n = int(counted.sum()) if n is None else int(n)
    if not n:
        if not distributed:
            return None, 0
        # every rank must join each step's gradient all-reduce: a zero loss adds zero gradients
        loss = out.sum() * 0.0
    else:
        weight = batch.get("weight")  # (B, T): edge weights
        target = batch["target"]
        if class_weights is not None:
            weight = class_frame_weights(target, class_weights, weight)
        loss = policy.head.loss(out, target, counted, weight)
        if concordance:
            loss = loss + concordance * policy.head.concordance_loss(out, target, counted, weight)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
    opt.step()
    if sched.last_epoch + 1 < total_steps:
        sched.step()
    return loss.detach(), n


def fit(policy: DrivingPolicy, train_source, val_source, cfg: TrainConfig, epochs: int, report: TrainReport,
        tb=None, tag: str = "bc", epoch_offset: int = 0, t_start: float | None = None,
        dist: DistContext | None = None, resume: dict | None = None,
        on_epoch: Callable[[dict], None] | None = None) -> DrivingPolicy:
    """Train ``policy`` in place for ``epochs`` epochs on ``train_source``; return the best checkpoint.

    The best is chosen by the head's metric on ``val_source`` (streaming); without a validation
    source, the last epoch's weights are returned.

    With ``dist`` of a torchrun process group (:func:`agent.train.distributed.init_from_env`) the
    epoch is data-parallel: this rank trains on its ``DistributedSampler`` shard of the windows
    with ``ceil(windows per batch / N)`` windows per step (``cfg.batch_frames`` is the global
    batch), through ``torch.nn.parallel.DistributedDataParallel`` (gradients averaged over the
    ranks); the training loss and the held-out metric are all-reduced, so every rank keeps the
    same best epoch; only rank 0 logs and writes ``tb``. ``policy`` itself (not the DDP wrapper)
    is trained in place and returned. Without ``dist`` (or with a one-process one) nothing changes.

    Checkpoints (:mod:`agent.train.checkpoint`): after each epoch ``on_epoch(state)`` gets this
    call's state, ``{"epochs_done", "stopped" (the time limit ends the call after this epoch),
    "model", "optimizer", "scheduler", "generator" (the data loader's torch.Generator state),
    "best_state", "best"}`` (live tensors: write them before training goes on). Given that dict as
    ``resume`` (with the same other arguments and the global RNG states of that moment), the call
    continues after epoch ``epochs_done`` and ends with the weights an uninterrupted call gives.

    Raises:
        ValueError: a source without frames; ``cfg.class_weights`` for a continuous head, or not one
            weight per action.
    """
    dist = dist if dist is not None else DistContext(device=cfg.device)
    device = torch.device(dist.device if dist.distributed else cfg.device)
    policy.to(device)
    head, T = policy.head, policy.config.window
    class_weights = _class_weight_table(head, cfg.class_weights, device)
    if cfg.concordance and head.kind != "continuous":
        raise ValueError(f"concordance is a loss term of continuous heads; this policy's head is {head.kind}: "
                         f"leave it at 0")
    bsz = max(1, cfg.batch_frames // T)  # windows per batch (all ranks together)
    dataset = WindowDataset(train_source, T, shuffle_borders=True, seed=cfg.seed + epoch_offset,
                            previous=policy.features.uses_previous)
    model = policy
    if dist.distributed:
        from torch.nn.parallel import DistributedDataParallel

        # broadcasts rank 0's weights now and averages the gradients in backward()
        model = DistributedDataParallel(policy, device_ids=[device.index] if device.type == "cuda" else None)
        bsz = ddp.shard_batch_size(bsz, dist)  # this rank's windows per step
        batches = None  # one loader per epoch (ddp.epoch_loader), after the dataset recuts its windows
        if cfg.batches == "device":
            raise ValueError("batches device is for one-process runs; under torchrun each rank loads its shard "
                             "(batches auto or loader)")
    else:
        batches = TrainBatches(dataset, bsz, device, cfg.seed + epoch_offset, cfg.workers, cfg.batches,
                               cfg.device_share, causal=policy.core.causal)
        log.info("%s training batches: %s", tag, batches.describe())
    opt, sched, total_steps = make_optimizer(policy, cfg, epochs * math.ceil(len(dataset) * 1.1 / dist.world_size / bsz))
    best_state, best = None, float("nan")  # the best of THIS call (a DAgger round starts afresh)
    start, stopped = 0, False
    if resume is not None:  # a checkpoint of this call after epoch `epochs_done`
        policy.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        sched.load_state_dict(resume["scheduler"])
        if batches is not None:
            batches.generator.set_state(resume["generator"])
        best_state, best = resume["best_state"], float(resume["best"])
        start, stopped = int(resume["epochs_done"]), bool(resume["stopped"])
    t_start = t_start if t_start is not None else time.time()
    for epoch in range(start, epochs if not stopped else start):
        t0 = time.time()
        n_epoch = epoch_offset + epoch + 1
        dataset.set_epoch(n_epoch)
        if dist.distributed:
            loader = ddp.epoch_loader(dataset, bsz, dist, cfg.seed + epoch_offset, n_epoch, cfg.workers)
            epoch_batches = (to_device(b, device) for b in loader)
        else:
            epoch_batches = batches
        policy.train()
        total, seen = torch.zeros((), dtype=torch.float64, device=device), 0  # the loss summed on the device
        frames = 0  # window positions trained on (padding included): the loop's throughput
        bar = progress(epoch_batches, desc=f"{tag} epoch {epoch + 1}/{epochs}", unit="batch", leave=False,
                       disable=not dist.is_main, total=len(batches) if batches is not None else len(loader))
        for batch in bar:
            frames += batch["mask"].numel()
            loss, n = train_step(model, policy, batch, opt, sched, total_steps, cfg.grad_clip, class_weights,
                                 dist.distributed, cfg.concordance)
            if loss is None:
                continue
            total, seen = total + loss.double() * n, seen + n  # as loss.item() * n in float64, without waiting
            if not bar.disable and bar.n % 16 == 0:  # reading the loss waits for the device: now and then
                bar.set_postfix(loss=f"{float(total) / max(seen, 1):.4f}")
        bar.close()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        train_seconds = time.time() - t0
        total, seen = ddp.all_reduce_sums(dist, float(total), seen)  # the loss over every rank's frames
        if dist.distributed:
            val, _ = ddp.score_stream_sharded(policy, val_source, dist) if val_source is not None else (float("nan"), 0)
        else:
            val, _ = score_stream(policy, val_source) if val_source is not None else (float("nan"), 0)
        m = EpochMetrics(n_epoch, total / max(seen, 1), val, time.time() - t0, tag)
        report.epochs.append(m)
        improved = val_source is not None and head.better(val, best)
        if improved or val_source is None:
            best, best_state = val, copy.deepcopy(policy.state_dict())
            report.best_metric, report.best_epoch = val, n_epoch
        held_out = (f"held-out {head.metric} {val:.4f}{'  (best)' if improved else ''}" if val_source is not None
                    else "no held-out split (val_fraction 0: the last epoch is kept)")
        log.info("%s epoch %d/%d: train loss %.4f  %s  (%.0f s; training %.0f frames/s)", tag, epoch + 1,
                 epochs, m.train_loss, held_out, m.seconds, frames / max(train_seconds, 1e-9))
        if tb is not None:
            tb.add_scalar("losses/train", m.train_loss, n_epoch)
            if val_source is not None:
                tb.add_scalar(f"losses/val_{head.metric}", val, n_epoch)
            tb.add_scalar("charts/lr", sched.get_last_lr()[0], n_epoch)
            tb.add_scalar("charts/epoch_seconds", m.seconds, n_epoch)
            tb.add_scalar("charts/train_frames_per_s", frames / max(train_seconds, 1e-9), n_epoch)
        # rank 0's clock decides, so that every rank stops after the same epoch
        stop = ddp.any_rank(dist, dist.is_main and cfg.time_limit_s is not None and
                            time.time() - t_start > cfg.time_limit_s) and epoch + 1 < epochs
        if on_epoch is not None:
            on_epoch({"epochs_done": epoch + 1, "stopped": stop, "model": policy.state_dict(),
                      "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                      "generator": batches.generator.get_state() if batches is not None else None,
                      "best_state": best_state, "best": best})
        if stop:
            log.info("time limit of %.0f s reached after epoch %d; stopping", cfg.time_limit_s, epoch + 1)
            break
    if best_state is not None:
        policy.load_state_dict(best_state)
    return policy.eval()


def report_metadata(report: TrainReport, **extra) -> dict:
    """The policy file's metadata for a run: metric, best value, data, baselines, seconds (+ ``extra``)."""
    meta = {"run_name": report.run_name, "metric": report.metric, f"best_val_{report.metric}": report.best_metric,
            "best_epoch": report.best_epoch, "data": report.data, "dagger_returns": report.dagger_returns,
            "seconds": report.seconds, **report.baselines}
    meta.update(extra)
    return meta


__all__ = ["EpochMetrics", "SCHEDULES", "TRAIN_DEFAULTS", "TrainConfig", "TrainReport", "class_frame_weights", "fit",
           "hparams_text", "make_optimizer", "report_metadata", "run_name", "train_step"]
