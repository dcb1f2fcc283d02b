"""``agent bench train``: frames/s of ``agent train``'s training loop beside the pure compute of its step.

The CarRacing default policy (:func:`agent.nn.policy.default_config`, or ``--core``) trains on a
synthetic frame set (fresh uniform-random uint8 96x96x3 frames and random discrete actions, in
episodes of 1,000 frames, held in memory; no files). Two rates per row, in frames per second
(windows per batch x T per step; padded positions count, as the step computes them):

- loop: the real loop of :func:`agent.train.bc.fit` (the same :class:`agent.train.batches.TrainBatches`
  and :func:`agent.train.bc.train_step`, epoch after epoch with the windows recut) for ``steps``
  steps after ``warmup``: what the data path and the step give together;
- compute: :func:`agent.train.bc.train_step` (forward, backward, clipping, AdamW, schedule) repeated
  on ONE batch already on the device: what the step alone gives.

Their ratio is the share of the compute rate that the loop reaches (1: the step is the bound; far
below 1: the data path is). On CUDA the device is synchronised before each clock reading.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import numpy as np
import torch

from agent.data.recordings import Demonstrations
from agent.data.windows import DemonstrationSource, WindowDataset
from agent.nn.policy import DrivingPolicy, default_config
from agent.train.batches import TrainBatches
from agent.train.bc import TRAIN_DEFAULTS, TrainConfig, make_optimizer, train_step

#: frames per synthetic episode
EPISODE = 1000


def synthetic_source(frames: int, seed: int = 0, episode: int = EPISODE, shape: tuple[int, int, int] = (96, 96, 3),
                     actions: int = 5) -> DemonstrationSource:
    """A CarRacing source of ``frames`` uniform-random uint8 frames ``shape`` (in memory) and random
    discrete actions in [0, ``actions``), in episodes of ``episode`` frames (the last one shorter).

    Raises:
        ValueError: ``frames`` < 1 or ``episode`` < 1.
    """
    if frames < 1 or episode < 1:
        raise ValueError(f"frames and episode must be >= 1, got {frames} and {episode}")
    rng = np.random.default_rng(seed)
    lengths = [episode] * (frames // episode) + ([frames % episode] if frames % episode else [])
    demos = Demonstrations([rng.integers(0, 256, (n, *shape), dtype=np.uint8) for n in lengths],
                           [rng.integers(0, actions, n).astype(np.int64) for n in lengths],
                           list(range(len(lengths))), [0.0] * len(lengths))
    return DemonstrationSource(demos)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _epochs(batches: TrainBatches, dataset: WindowDataset):
    """The batches of epoch 1, 2, ... without end (the windows recut each epoch, as fit() does)."""
    epoch = 0
    while True:
        epoch += 1
        dataset.set_epoch(epoch)
        yield from batches


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's (``platform.processor()``, else the machine type)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def bench_train(device: str = "cpu", frames: int = 20_000, steps: int = 50, warmup: int = 10,
                threads: tuple[int, ...] = (0, 1), batch_frames: int | None = None,
                data: tuple[str, ...] = ("auto",), workers: int = 0, core: str | None = None, seed: int = 0,
                out=None) -> list[dict]:
    """Time the training loop and the pure step (module docstring): one row per (threads, data).

    Args:
        device: torch device (``cpu``, ``cuda``, ``cuda:N``).
        frames: frames in the synthetic set (:func:`synthetic_source`).
        steps, warmup: timed and untimed steps of each measurement.
        threads: torch CPU thread counts, one set of rows each (0: torch's default count).
        batch_frames: frames per batch (None: CarRacing's training default, 256); windows per batch =
            batch_frames // T.
        data: the batch paths to time (``auto``, ``device``, ``loader``; :mod:`agent.train.batches`).
        workers: the loader's worker processes (``agent train --workers``).
        core: the temporal core (None: CarRacing's default, nac-steady).
        seed: the data, the weights and the shuffle.
        out: a file for one progress line per row (None: stderr).

    Returns:
        rows: ``device``, ``device_name``, ``torch``, ``cpus``, ``threads`` (torch's count used),
        ``data`` (asked), ``path`` (taken) and ``why``, ``workers``, ``core``, ``window``, ``batch_windows``,
        ``batch_frames``, ``frames``, ``steps``, ``warmup``, ``loop_fps``, ``compute_fps`` (frames/s),
        ``ratio`` (loop / compute), ``loop_step_ms``, ``compute_step_ms``.

    Raises:
        ValueError: bad sizes, an unknown core or data path.
        RuntimeError: a CUDA device that torch cannot use.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got {steps} and {warmup}")
    out = out or sys.stderr
    dev = torch.device(device)
    source = synthetic_source(frames, seed)
    pcfg = default_config("carracing", core)
    T = pcfg.window
    batch_frames = batch_frames or TRAIN_DEFAULTS["carracing"]["batch_frames"]
    cfg = TrainConfig(batch_frames=batch_frames, seed=seed, device=str(dev), workers=workers)
    bsz = max(1, batch_frames // T)
    default_threads = torch.get_num_threads()
    rows = []
    try:
        for n_threads in threads:
            torch.set_num_threads(n_threads or default_threads)
            torch.manual_seed(seed)
            policy = DrivingPolicy(pcfg).to(dev).train()
            dataset = WindowDataset(source, T, shuffle_borders=True, seed=seed, previous=policy.features.uses_previous)
            opt, sched, total_steps = make_optimizer(policy, cfg, 1_000_000)
            compute = None
            for mode in data:
                batches = TrainBatches(dataset, bsz, dev, seed, workers, mode, cfg.device_share, policy.core.causal)
                it = _epochs(batches, dataset)
                for _ in range(warmup):
                    train_step(policy, policy, next(it), opt, sched, total_steps, cfg.grad_clip)
                _sync(dev)
                done, t0 = 0, time.perf_counter()
                for _ in range(steps):
                    batch = next(it)
                    done += batch["mask"].shape[0] * T
                    train_step(policy, policy, batch, opt, sched, total_steps, cfg.grad_clip)
                _sync(dev)
                loop_s = time.perf_counter() - t0
                it.close()  # ends the epoch's loader (and its workers)
                if compute is None:  # the step alone, on one batch already on the device
                    dataset.set_epoch(0)
                    batch = next(iter(batches))
                    for _ in range(warmup):
                        train_step(policy, policy, batch, opt, sched, total_steps, cfg.grad_clip)
                    _sync(dev)
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        train_step(policy, policy, batch, opt, sched, total_steps, cfg.grad_clip)
                    _sync(dev)
                    compute = (batch["mask"].shape[0] * T * steps, time.perf_counter() - t0)
                row = {"device": str(dev), "device_name": device_name(dev), "torch": torch.__version__,
                       "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "data": mode,
                       "path": batches.path, "why": batches.reason, "workers": workers, "core": pcfg.core,
                       "window": T, "batch_windows": bsz, "batch_frames": bsz * T, "frames": frames, "steps": steps,
                       "warmup": warmup, "loop_fps": done / loop_s, "compute_fps": compute[0] / compute[1],
                       "loop_step_ms": 1000 * loop_s / steps, "compute_step_ms": 1000 * compute[1] / steps}
                row["ratio"] = row["loop_fps"] / row["compute_fps"]
                rows.append(row)
                print(f"threads {row['threads']}, data {mode} -> {batches.path}: loop {row['loop_fps']:,.0f} frames/s, "
                      f"compute {row['compute_fps']:,.0f} frames/s", file=out, flush=True)
                del batches, it
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    finally:
        torch.set_num_threads(default_threads)
    return rows


def print_train_table(rows: list[dict], file=None) -> None:
    """Print the rows of :func:`bench_train` as a Markdown table, then the conditions."""
    def p(line=""):
        print(line, file=file)

    if not rows:
        return
    r0 = rows[0]
    p(f"training throughput: {r0['device_name']} ({r0['device']}), torch {r0['torch']}, {r0['cpus']} CPUs; "
      f"CarRacing default policy, core {r0['core']}, T={r0['window']}, {r0['batch_windows']} windows "
      f"({r0['batch_frames']} frames) per batch, {r0['frames']:,} synthetic frames; {r0['steps']} timed steps after "
      f"{r0['warmup']} warm-up")
    p()
    p("| threads | data (taken) | workers | loop frames/s | compute frames/s | loop / compute | loop ms/step | "
      "compute ms/step |")
    p("|---|---|---|---|---|---|---|---|")
    for r in rows:
        taken = r["path"] if r["data"] == r["path"] else f"{r['data']} -> {r['path']}"
        p(f"| {r['threads']} | {taken} | {r['workers']} | {r['loop_fps']:,.0f} | {r['compute_fps']:,.0f} | "
          f"{r['ratio']:.2f} | {r['loop_step_ms']:.2f} | {r['compute_step_ms']:.2f} |")
    p()
    for why in dict.fromkeys(f"{r['data']} -> {r['path']}: {r['why']}" for r in rows):
        p(why)
    p("loop: agent train's loop (batches built, copied and trained on); compute: the same step repeated on one batch "
      "already on the device (forward, backward, clipping, AdamW).")


__all__ = ["EPISODE", "bench_train", "device_name", "print_train_table", "synthetic_source"]
