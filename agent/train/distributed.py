"""Data-parallel behaviour cloning under ``torchrun``: the process group, the shards and the reductions.

``torchrun --nproc-per-node N --no-python agent train ...`` starts N copies of ``agent train``;
each one is a *rank*. :func:`init_from_env` sees torchrun's environment (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``;
``torch.distributed.is_torchelastic_launched()``) and joins the process group with the ``env://``
method: gloo for a CPU device, NCCL for CUDA (rank r of a machine then trains on ``cuda:LOCAL_RANK``).
Without torchrun it returns a one-process :class:`DistContext` and starts nothing, so a plain
``agent train`` runs exactly as before.

What each rank does (:func:`agent.train.bc.fit`):

* the same windows dataset on every rank (same seed), split by :func:`epoch_loader` with a
  ``torch.utils.data.DistributedSampler``: each rank reads its own 1/N of the windows each epoch
  (the sampler pads the last few with repeats so every rank takes the same number of steps);
* ``--batch-frames`` stays the *global* batch: each rank takes ``ceil(windows / N)`` windows per
  step, so the recipe's learning rate and schedule keep their meaning and an epoch has the same
  number of optimizer steps as with one process;
* the model is wrapped in ``torch.nn.parallel.DistributedDataParallel`` (DDP), which broadcasts
  rank 0's initial weights and averages the gradients (PyTorch docs, "Getting Started with
  Distributed Data Parallel", https://pytorch.org/tutorials/intermediate/ddp_tutorial.html);
* validation: each rank scores a disjoint share of the held-out sequences (:class:`ShardSource`)
  and the metric's sums are all-reduced (:func:`all_reduce_sums`), so every rank gets the value a
  single process would compute and all of them pick the same best epoch;
* rank 0 alone logs (console, progress bars, TensorBoard) and writes files; the other ranks log
  warnings and errors only.

DAgger rounds are refused under torchrun (:data:`DAGGER_UNDER_TORCHRUN`): the rollouts are
sequential CarRacing episodes that one process runs; run DAgger without torchrun on the saved BC
policy (``agent train --init POLICY --epochs 0 --dagger-rounds R ...``).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from agent.actors.vector import cpu_cores
from agent.eval.offline import score_stream, stream_outputs
from agent.log import PROJECT_LOGGERS

#: the error message for DAgger rounds under torchrun
DAGGER_UNDER_TORCHRUN = (
    "DAgger rounds cannot run under torchrun (the student's rollouts are CarRacing episodes that one process "
    "drives); train behaviour cloning with torchrun, then run DAgger without torchrun on the saved policy: "
    "agent train --init POLICY --epochs 0 --dagger-rounds R --expert EXPERT ...")


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in a data-parallel run.

    Attributes:
        world_size: processes in the run (1 without torchrun).
        rank: this process's rank, 0 .. world_size - 1 (rank 0 logs and writes files).
        local_rank: its rank on this machine (its CUDA device index under NCCL).
        local_world_size: processes on this machine (the CPU cores are shared among them).
        backend: "gloo", "nccl", or None without a process group.
        device: the torch device this rank trains on (e.g. "cpu", "cuda:1").
    """

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the one that logs and writes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether a process group is in use (launched by torchrun)."""
        return self.backend is not None


def _device_for(device: str, local_rank: int, local_world_size: int) -> torch.device:
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    if dev.index is not None and local_world_size > 1:
        raise ValueError(f"--device {device} under torchrun with {local_world_size} processes per machine: each "
                         "rank takes cuda:LOCAL_RANK; pass --device cuda")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {device}, but CUDA is not available on this machine")
    index = dev.index if dev.index is not None else local_rank
    if index >= torch.cuda.device_count():
        raise ValueError(f"rank with LOCAL_RANK {local_rank} needs cuda:{index}, but this machine has "
                         f"{torch.cuda.device_count()} CUDA device(s); start at most that many processes per node")
    return torch.device("cuda", index)


def init_from_env(device: str = "cpu", threads: int = 0) -> DistContext:
    """Join torchrun's process group if this process was started by torchrun; else a one-process context.

    Under torchrun: ``init_process_group(backend, init_method="env://")`` with gloo for a CPU
    device and NCCL for CUDA (``torch.cuda.set_device(cuda:LOCAL_RANK)`` first); torch's CPU
    threads are set to ``threads``, or to cores / LOCAL_WORLD_SIZE (at least 1) when ``threads``
    is 0 (torchrun itself sets ``OMP_NUM_THREADS=1``); the project's loggers of ranks other than 0
    are raised to WARNING. Calling it again in a process that already joined returns the same
    context. Without torchrun nothing is started and ``threads`` (if > 0) is applied as given.

    Args:
        device: the requested torch device ("cpu", "cuda", ...).
        threads: torch CPU threads per process (0: the default described above).

    Returns:
        the :class:`DistContext`.

    Raises:
        ValueError: a CUDA device that this machine lacks, or an explicit ``cuda:K`` with more
            than one process per machine.
        RuntimeError: the rendezvous fails (from ``torch.distributed.init_process_group``).
    """
    if not dist.is_torchelastic_launched():
        if threads:
            torch.set_num_threads(threads)
        return DistContext(device=device)
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    dev = _device_for(device, local_rank, local_world)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    torch.set_num_threads(threads if threads else max(1, cpu_cores() // local_world))
    if not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend, init_method="env://", world_size=world, rank=rank)
    if rank != 0:
        for name in PROJECT_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    return DistContext(world, rank, local_rank, local_world, backend, str(dev))


def close(ctx: DistContext) -> None:
    """Leave the process group if ``ctx`` joined one; else nothing. Every rank waits at a barrier
    first, so the ranks destroy the group together, as torch's documentation of
    ``destroy_process_group`` asks: the other ranks used to leave while rank 0 was still writing
    the policy, and one CI run of tests/test_distributed.py saw rank 1 abort in that teardown
    ("terminate called without an active exception", gloo)."""
    if ctx.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sums(ctx: DistContext, *values: float) -> list[float]:
    """The sums over all ranks of each of ``values`` (float64; one ``all_reduce``); ``values`` as
    floats without a process group."""
    if not ctx.distributed:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def any_rank(ctx: DistContext, flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (so that every rank takes the same decision, e.g. to stop)."""
    if not ctx.distributed:
        return bool(flag)
    return all_reduce_sums(ctx, float(bool(flag)))[0] > 0


def shard_batch_size(batch: int, ctx: DistContext) -> int:
    """Windows per step on each rank so that the ranks together take ``batch``: ceil(batch / N), >= 1."""
    return max(1, math.ceil(batch / ctx.world_size))


def epoch_loader(dataset, batch_size: int, ctx: DistContext, seed: int, epoch: int, workers: int = 0) -> DataLoader:
    """This rank's ``DataLoader`` for one epoch: a ``DistributedSampler`` (shuffled with ``seed``
    and ``epoch``, padded so every rank takes the same number of windows) over ``dataset``.

    Made afresh each epoch because the dataset's length changes with its window borders
    (:meth:`agent.data.windows.WindowDataset.set_epoch`; call that first), and the sampler fixes
    its length when it is made.

    Args:
        dataset: the windows dataset, identical on every rank.
        batch_size: windows per step on this rank (:func:`shard_batch_size`).
        ctx: the rank and world size.
        seed, epoch: the shuffle (the same on every rank, so the shards are disjoint).
        workers: DataLoader worker processes.
    """
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed,
                                 drop_last=False)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, drop_last=False)


class ShardSource:
    """Rank ``rank``'s share of a source's sequences: sequences rank, rank + N, rank + 2N, ...

    Exposes what the streaming scorer reads (:func:`agent.eval.offline.stream_outputs`):
    ``lengths``, ``window`` and ``targets``, renumbered 0 .. len - 1; any other attribute is the
    source's. The shards of ranks 0 .. N-1 are disjoint and together hold every sequence once.
    """

    def __init__(self, source, rank: int, world_size: int):
        self.source = source
        self.sequences = list(range(rank, len(source.lengths), world_size))

    @property
    def lengths(self) -> list[int]:
        """Frames in each of this rank's sequences."""
        full = self.source.lengths
        return [full[e] for e in self.sequences]

    def window(self, e: int, start: int, n: int, rng=None):
        """The source's ``window`` of this shard's sequence ``e``."""
        return self.source.window(self.sequences[e], start, n, rng)

    def targets(self, e: int):
        """The source's ``targets`` of this shard's sequence ``e``."""
        return self.source.targets(self.sequences[e])

    def __getattr__(self, name):
        if name in ("source", "sequences"):  # not set yet (e.g. while copying): no recursion
            raise AttributeError(name)
        return getattr(self.source, name)


def score_stream_sharded(policy, source, ctx: DistContext) -> tuple[float, int]:
    """:func:`agent.eval.offline.score_stream` over all ranks: each scores its :class:`ShardSource`
    and the metric's sums are all-reduced, so every rank returns the value (and frame count) one
    process scoring all of ``source`` would (exactly, for accuracy: the sums are counts).

    Returns NaN with 0 frames when no rank has a frame.
    """
    import numpy as np

    if not ctx.distributed:
        return score_stream(policy, source)
    shard = ShardSource(source, ctx.rank, ctx.world_size)
    total, count = 0.0, 0
    for e, out in enumerate(stream_outputs(policy, shard) if shard.sequences else []):
        if not len(out):
            continue
        target = torch.from_numpy(np.asarray(shard.targets(e)))[None]
        s, c = policy.head.metric_sums(torch.from_numpy(out)[None], target, torch.ones(1, len(out), dtype=torch.bool))
        total, count = total + s, count + c
    total, count = all_reduce_sums(ctx, total, count)
    return (total / count if count else float("nan")), int(count)


__all__ = ["DAGGER_UNDER_TORCHRUN", "DistContext", "ShardSource", "all_reduce_sums", "any_rank", "close",
           "cpu_cores", "epoch_loader", "init_from_env", "score_stream_sharded", "shard_batch_size"]
