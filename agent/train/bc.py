"""Behaviour cloning (BC) of the CNN + NAC policy on frame windows, and DAgger.

BC: the recorded episodes are cut into windows of T consecutive frames; the policy predicts
the expert's action at every position of a window (causal NAC, so position i sees frames <= i)
with a cross-entropy loss. Train and validation sets are split by episode, never by frame.
The checkpoint with the best held-out accuracy (at full-context positions, the situation of a
rollout after its first T frames) is kept.

DAgger (Ross et al., 2011, "A Reduction of Imitation Learning and Structured Prediction to
No-Regret Online Learning"): the student drives, the expert labels every state the student
visits (cheap here: the expert reads privileged state from the same env), the labelled
episodes join the data, and the student is trained further on the aggregate.

TensorBoard scalars: ``losses/train``, ``losses/val``, ``charts/val_accuracy``,
``eval/dagger_return``.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from agent.nn.policy import NACPolicy, PolicyConfig
from agent.data.recordings import Demonstrations


@dataclass
class TrainConfig:
    """Hyper-parameters of a behaviour-cloning run (and its DAgger rounds)."""

    epochs: int = 8
    batch_frames: int = 256  # frames per batch (windows per batch = batch_frames // T), fair across T
    lr: float = 1e-3
    weight_decay: float = 1e-4
    val_fraction: float = 0.1
    seed: int = 0
    device: str = "cpu"
    dagger_rounds: int = 0
    dagger_episodes: int = 8  # student episodes per round
    dagger_epochs: int = 3  # epochs on the aggregate after each round
    dagger_seed: int = 500_000  # tracks of round r: dagger_seed + r * dagger_episodes + i
    dagger_beta: float = 0.0  # probability that the expert's action is executed in DAgger rollouts
    max_steps: int | None = None  # cap on DAgger episode length (None: the env's 1000)


@dataclass
class EpochMetrics:
    epoch: int
    train_loss: float
    val_loss: float
    val_accuracy: float  # at full-context positions
    seconds: float


@dataclass
class TrainReport:
    """What a training run measured (also stored in the policy file's metadata)."""

    config: dict
    policy_config: dict
    n_train_episodes: int
    n_val_episodes: int
    n_train_frames: int
    best_val_accuracy: float = 0.0
    epochs: list[EpochMetrics] = field(default_factory=list)
    dagger_returns: list[list[float]] = field(default_factory=list)
    seconds: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def split_by_episode(demos: Demonstrations, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Episode indices for training and validation (at least one each when there are >= 2)."""
    n = len(demos.actions)
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(max(1, round(n * val_fraction)), n - 1) if n >= 2 else 0
    return sorted(order[n_val:].tolist()), sorted(order[:n_val].tolist())


def make_windows(lengths: list[int], window: int, rng: np.random.Generator | None) -> list[tuple[int, int]]:
    """(episode, start) of non-overlapping windows covering each episode once.

    With an rng the first window of each episode starts at a random offset (so window borders
    move between epochs); without one, windows start at 0 (deterministic, for validation).
    A final shorter remainder is covered by a window that ends at the episode's last frame.
    """
    out = []
    for e, n in enumerate(lengths):
        if n <= 0:
            continue
        if n <= window:
            out.append((e, 0))
            continue
        off = int(rng.integers(0, window)) if rng is not None else 0
        starts = list(range(off, n - window + 1, window))
        if off > 0:
            starts.insert(0, 0)
        if starts[-1] + window < n:
            starts.append(n - window)
        out.extend((e, s) for s in starts)
    return out


def batch_windows(demos: Demonstrations, items: list[tuple[int, int]], window: int):
    """Stack windows into obs (B, T, H, W, C) uint8, actions (B, T) int64, mask (B, T) bool.

    Windows shorter than T (short episodes) are right-padded with masked, label -100 steps.
    """
    B = len(items)
    H, W, C = demos.frames[items[0][0]].shape[1:]
    obs = np.zeros((B, window, H, W, C), np.uint8)
    act = np.full((B, window), -100, np.int64)
    mask = np.zeros((B, window), bool)
    for b, (e, s) in enumerate(items):
        f, a = demos.frames[e][s:s + window], demos.actions[e][s:s + window]
        obs[b, : len(a)], act[b, : len(a)], mask[b, : len(a)] = f, a, True
    return torch.from_numpy(obs), torch.from_numpy(act), torch.from_numpy(mask)


@torch.no_grad()
def evaluate_windows(policy: NACPolicy, demos: Demonstrations, episodes: list[int], batch_size: int
                     ) -> tuple[float, float]:
    """Mean cross-entropy over all positions and accuracy at full-context positions (the last
    position of each full window) on the given episodes. Returns (loss, accuracy)."""
    T = policy.config.window
    sub = demos.subset(episodes)
    # non-overlapping windows from each episode's start; accuracy counts the last position of
    # every full window (T-1 frames of context, as in a rollout after its first T frames)
    policy.eval()
    losses, correct, counted = [], 0, 0
    items = make_windows([len(a) for a in sub.actions], T, None)
    for i in range(0, len(items), batch_size):
        obs, act, mask = batch_windows(sub, items[i:i + batch_size], T)
        logits = policy(obs.to(policy.device), mask.to(policy.device))
        losses.append(F.cross_entropy(logits.flatten(0, 1), act.flatten().to(policy.device),
                                      ignore_index=-100, reduction="sum").item())
        full = mask.all(1)
        if full.any():
            pred = logits[full.to(policy.device), -1].argmax(-1).cpu()
            correct += int((pred == act[full, -1]).sum())
            counted += int(full.sum())
    n = sum(len(a) for a in sub.actions)
    return sum(losses) / max(n, 1), correct / max(counted, 1)


def fit(policy: NACPolicy, demos: Demonstrations, train_eps: list[int], val_eps: list[int], epochs: int,
        cfg: TrainConfig, report: TrainReport, tb=None, progress: bool = True, tag: str = "bc",
        epoch_offset: int = 0) -> NACPolicy:
    """Train ``policy`` in place for ``epochs`` epochs; return the best-by-validation copy."""
    from tqdm.auto import tqdm

    device = torch.device(cfg.device)
    policy.to(device)
    T = policy.config.window
    bsz = max(1, cfg.batch_frames // T)  # windows per batch
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(cfg.seed + epoch_offset)
    lengths = [len(demos.actions[i]) for i in train_eps]
    sub = demos.subset(train_eps)
    n_batches = math.ceil(len(make_windows(lengths, T, None)) / bsz)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=max(epochs * (n_batches + 1), 1),
                                                pct_start=0.15)
    best_acc, best_state = -1.0, None
    for epoch in range(epochs):
        t0 = time.time()
        policy.train()
        items = make_windows(lengths, T, rng)
        rng.shuffle(items)
        total, seen = 0.0, 0
        bar = tqdm(range(0, len(items), bsz), desc=f"{tag} epoch {epoch + 1}/{epochs}", unit="batch",
                   disable=not progress, leave=False)
        for i in bar:
            obs, act, mask = batch_windows(sub, items[i:i + bsz], T)
            logits = policy(obs.to(device), mask.to(device))  # (B, T, A)
            loss = F.cross_entropy(logits.flatten(0, 1), act.flatten().to(device), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
            if sched.last_epoch + 1 < sched.total_steps:
                sched.step()
            total += loss.item() * len(obs)
            seen += len(obs)
            bar.set_postfix(loss=f"{total / seen:.3f}")
        bar.close()
        val_loss, val_acc = evaluate_windows(policy, demos, val_eps, bsz) if val_eps else (float("nan"), 0.0)
        m = EpochMetrics(epoch_offset + epoch + 1, total / max(seen, 1), val_loss, val_acc, time.time() - t0)
        report.epochs.append(m)
        print(f"{tag} epoch {epoch + 1}/{epochs}: train loss {m.train_loss:.4f}  val loss {val_loss:.4f}  "
              f"val accuracy {val_acc:.3f}  ({m.seconds:.0f} s)")
        if tb is not None:
            step = epoch_offset + epoch + 1
            tb.add_scalar("losses/train", m.train_loss, step)
            tb.add_scalar("losses/val", val_loss, step)
            tb.add_scalar("charts/val_accuracy", val_acc, step)
        if val_acc >= best_acc or not val_eps:
            best_acc, best_state = val_acc, copy.deepcopy(policy.state_dict())
    policy.load_state_dict(best_state)
    report.best_val_accuracy = best_acc
    return policy


def dagger_round(policy: NACPolicy, expert, env, seeds: list[int], beta: float, max_steps: int | None,
                 rng: np.random.Generator, progress: bool = True) -> tuple[Demonstrations, list[float]]:
    """The student drives on ``seeds`` (the expert's action executed with probability ``beta``);
    the expert labels every visited state. Returns the labelled episodes and the returns."""
    from tqdm.auto import tqdm

    from agent.rollout import PolicyActor, rollout

    student = PolicyActor(policy)

    class Mixed:
        def reset(self):
            student.reset()

        def act(self, obs, env_):
            a = student.act(obs, env_)  # always advance the student's window
            return expert.act(env_) if beta > 0 and rng.random() < beta else a

    frames, labels, returns = [], [], []
    for s in tqdm(seeds, desc="DAgger rollouts", unit="ep", disable=not progress, leave=False):
        ep = rollout(env, Mixed(), s, max_steps=max_steps, labeler=expert.act)
        frames.append(ep.observations[:-1])
        labels.append(ep.labels)
        returns.append(ep.episode_return)
    return Demonstrations(frames, labels, list(seeds), returns), returns


def train(demos: Demonstrations, cfg: TrainConfig, policy_config: PolicyConfig, expert=None, env=None,
          tensorboard_dir: str | Path | None = None, progress: bool = True,
          bc_checkpoint: str | Path | None = None) -> tuple[NACPolicy, TrainReport]:
    """BC on ``demos``, then ``cfg.dagger_rounds`` DAgger rounds with ``expert`` in ``env``.

    ``bc_checkpoint``: also save the policy as it is after behaviour cloning, before DAgger.

    Raises:
        ValueError: DAgger rounds requested without an expert and env, or too little data.
    """
    if cfg.dagger_rounds and (expert is None or env is None):
        raise ValueError("DAgger needs --expert (the PPO expert that labels the student's states)")
    if len(demos.actions) < 2:
        raise ValueError("behaviour cloning needs at least 2 episodes (one is held out for validation)")
    torch.manual_seed(cfg.seed)
    policy = NACPolicy(policy_config)
    train_eps, val_eps = split_by_episode(demos, cfg.val_fraction, cfg.seed)
    report = TrainReport(config=asdict(cfg), policy_config=asdict(policy_config), n_train_episodes=len(train_eps),
                         n_val_episodes=len(val_eps), n_train_frames=sum(len(demos.actions[i]) for i in train_eps))
    tb = None
    if tensorboard_dir:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(str(tensorboard_dir))
    print(f"behaviour cloning: {len(train_eps)} train / {len(val_eps)} validation episodes, "
          f"{report.n_train_frames} train frames, window T={policy_config.window}")
    t0 = time.time()
    policy = fit(policy, demos, train_eps, val_eps, cfg.epochs, cfg, report, tb, progress, "bc")
    report.seconds["bc"] = time.time() - t0
    if bc_checkpoint is not None:
        policy.save(bc_checkpoint, metadata={"stage": "behaviour cloning (before DAgger)",
                                             "best_val_accuracy": report.best_val_accuracy})
    rng = np.random.default_rng(cfg.seed)
    done = cfg.epochs
    for r in range(cfg.dagger_rounds):
        t1 = time.time()
        seeds = [cfg.dagger_seed + r * cfg.dagger_episodes + i for i in range(cfg.dagger_episodes)]
        new, returns = dagger_round(policy, expert, env, seeds, cfg.dagger_beta, cfg.max_steps, rng, progress)
        report.dagger_returns.append(returns)
        print(f"DAgger round {r + 1}/{cfg.dagger_rounds}: student return {np.mean(returns):.1f} "
              f"± {np.std(returns):.1f} on {len(returns)} tracks; {new.n_frames} frames relabelled")
        if tb is not None:
            tb.add_scalar("eval/dagger_return", float(np.mean(returns)), r + 1)
        n_before = len(demos.actions)
        demos = demos.extend(new)
        train_eps = train_eps + list(range(n_before, len(demos.actions)))
        policy = fit(policy, demos, train_eps, val_eps, cfg.dagger_epochs, cfg, report, tb, progress,
                     f"dagger {r + 1}", epoch_offset=done)
        done += cfg.dagger_epochs
        report.seconds[f"dagger_round_{r + 1}"] = time.time() - t1
    report.n_train_episodes = len(train_eps)
    report.n_train_frames = sum(len(demos.actions[i]) for i in train_eps)
    report.seconds["total"] = time.time() - t0
    if tb is not None:
        tb.close()
    return policy, report
