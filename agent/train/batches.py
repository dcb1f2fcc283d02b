"""Training batches for behaviour cloning (:func:`agent.train.bc.fit`): built on the device from frames
held there, or loaded on the host and copied over.

Two paths give the same batches (the same windows in the same order, the same tensors):

- ``device``: the training frames (uint8), their labels, loss masks and weights are copied to the
  device ONCE (:class:`DeviceWindows`); each batch is gathered there by index (windows of T frames
  from one flat frame tensor and the windows' first-frame indices), padding, synthetic standstills
  and masks are torch ops on the device, and only a few hundred bytes of indices cross the bus
  per step. The policy's own preprocessing (uint8 -> float / 255, dashboard masks, motion
  channels; :meth:`agent.nn.features.CarRacingCNN.preprocess`) runs on the device anyway. Only
  CarRacing sources (:class:`agent.data.windows.DemonstrationSource`) can go there: Udacity
  windows are augmented per window on the host.
- ``loader``: the ``DataLoader`` of :class:`agent.data.windows.WindowDataset` (``--workers``
  processes), as before; on CUDA its batches are pinned, the workers prefetch 4 batches each, and
  the next batch is copied (``non_blocking``) while the current one trains.

``auto`` takes ``device`` on CUDA when the frames and labels fit in ``device_share`` of the GPU's
free memory (``torch.cuda.mem_get_info``), else ``loader``; on the CPU it takes ``loader``, which
reads the (memory-mapped) frames where they are, exactly as before. Both paths draw the window
order from the same ``torch.Generator`` in the same way (a ``DataLoader``'s shuffle), and the
standstill draws from the same per-window generators, so a seed gives the same training on either
(tests/test_train_device_data.py checks the batches and the weights after training).

Shapes: B windows per batch, T the window, H x W x C a frame, N the source's frames, A actions.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from agent.data.windows import CARRACING_GAS, WindowDataset, standstill_keep
from agent.log import get_logger

log = get_logger(__name__)

#: the values of ``TrainConfig.batches`` (``--train.batches``)
BATCH_PATHS = ("auto", "device", "loader")

#: the default share of the GPU's free memory that ``auto`` lets the training data take
DEVICE_SHARE = 0.5


def data_bytes(source) -> int:
    """Bytes that :class:`DeviceWindows` puts on the device for ``source``: the frames (uint8), the
    targets, and the per-frame loss masks and weights (an estimate; no frame is read).

    Raises:
        TypeError: ``source`` is not a CarRacing source (no ``frame_shape`` and ``demos``).
    """
    if not hasattr(source, "demos"):
        raise TypeError(f"{type(source).__name__} frames cannot be held on the device")
    n = int(sum(source.lengths))
    frame = int(np.prod(source.frame_shape))
    label = sum(int(a[:1].nbytes) for a in source.demos.actions[:1]) or 8
    return n * (frame + label + 1 + 4)


def choose_path(source, device: torch.device | str, mode: str = "auto", share: float = DEVICE_SHARE,
                distributed: bool = False) -> tuple[str, str]:
    """Where the batches of ``source`` are built: ``("device" | "loader", why)``.

    Args:
        source: the training source (:mod:`agent.data.windows`).
        device: the training device.
        mode: ``auto``, ``device`` (forced) or ``loader`` (forced).
        share: ``auto`` on CUDA takes ``device`` when :func:`data_bytes` <= ``share`` x the free GPU
            memory (``torch.cuda.mem_get_info``), in (0, 1].
        distributed: a torchrun run: always ``loader`` (each rank reads its ``DistributedSampler`` shard).

    Raises:
        ValueError: an unknown ``mode``, ``share`` outside (0, 1], or ``device`` forced for a source
            that cannot go there (Udacity) or for a torchrun run.
    """
    if mode not in BATCH_PATHS:
        raise ValueError(f"batches must be one of {', '.join(BATCH_PATHS)}, got {mode!r}")
    if not 0.0 < share <= 1.0:
        raise ValueError(f"device_share must be a share of the free GPU memory in (0, 1], got {share}")
    device = torch.device(device)
    carracing = hasattr(source, "demos") and callable(getattr(source, "previous_frame", None))
    if mode == "device" and not carracing:
        raise ValueError(f"batches device holds CarRacing frames on the device; {type(source).__name__} windows are "
                         "augmented per window on the host: use batches auto or loader")
    if mode == "device" and distributed:
        raise ValueError("batches device is for one-process runs; under torchrun each rank loads its shard "
                         "(batches auto or loader)")
    if mode != "auto":
        return mode, f"chosen: batches {mode}"
    if distributed:
        return "loader", "torchrun: each rank loads its shard of the windows"
    if not carracing:
        return "loader", f"{type(source).__name__} windows are augmented on the host"
    if device.type != "cuda":
        return "loader", f"device {device.type}: the loader reads the frames where they are"
    need = data_bytes(source)
    free, total = torch.cuda.mem_get_info(device)
    gib = 1 << 30
    if need <= share * free:
        return "device", (f"{need / gib:.2f} GiB of frames and labels fit in {share:.0%} of the "
                          f"{free / gib:.1f} GiB free on {torch.cuda.get_device_name(device)}")
    return "loader", (f"{need / gib:.2f} GiB of frames and labels exceed {share:.0%} of the {free / gib:.1f} GiB "
                      f"free on {torch.cuda.get_device_name(device)}")


class DeviceWindows:
    """A CarRacing source's frames, labels, loss masks and weights on ``device``, and the batches of a
    :class:`agent.data.windows.WindowDataset` over it, gathered there (:meth:`batch`).

    The frames are read once, episode by episode, as the dataset reads them
    (:meth:`agent.data.windows.DemonstrationSource.window`: the speedometer drawn where it is drawn
    on read, the mapped pages released as they go), into one flat (N, H, W, C) uint8 tensor;
    episode e's frame i is row ``offsets[e] + i``.

    Args:
        source: a :class:`agent.data.windows.DemonstrationSource`.
        device: where to hold them (``cpu`` works too: the same code, in RAM).
        causal: the policy's core is causal (the loss counts every real position; else each window's
            last one, :func:`agent.train.bc._loss_mask`); for the host-side count of counted positions.

    Attributes:
        frames: (N, H, W, C) uint8. targets: (N,) int64 or (N, A) float32. weights: (N,) float32 or
            None (unweighted source). offsets: (E,) int64 numpy, each episode's first row.
        nbytes: bytes held on the device.

    Raises:
        ValueError: a source without frames or not CarRacing's.
        torch.cuda.OutOfMemoryError: the frames do not fit (``choose_path`` checks before).
    """

    def __init__(self, source, device: torch.device | str, causal: bool = True):
        if not (hasattr(source, "demos") and callable(getattr(source, "previous_frame", None))):
            raise ValueError(f"{type(source).__name__} frames cannot be held on the device (CarRacing sources only)")
        lengths = [int(n) for n in source.lengths]
        if sum(lengths) == 0:
            raise ValueError("no frames to train on (the recordings are empty)")
        self.source, self.device, self.causal = source, torch.device(device), causal
        self.offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        n, shape = sum(lengths), tuple(source.frame_shape)
        self.frames = torch.empty((n, *shape), dtype=torch.uint8, device=self.device)
        targets, learn, weights = [], [], []
        for e, (off, length) in enumerate(zip(self.offsets.tolist(), lengths)):
            if not length:
                continue
            frames, target, _ = source.window(e, 0, length)
            self.frames[off:off + length].copy_(torch.from_numpy(np.array(frames, dtype=np.uint8)))
            targets.append(np.asarray(target))
            # the stall test compares each frame with the one before it (the first with itself), above the
            # dashboard strip, so a frame's mask does not depend on where its window starts
            learn.append(np.asarray(source.loss_mask(e, 0, length, frames=frames), bool))
            if source.weighted:
                weights.append(source.loss_weights(e, 0, length))
        self.targets = torch.from_numpy(np.concatenate(targets).astype(source.target_dtype)).to(self.device)
        self.learn_host = np.concatenate(learn)  # (N,) bool: the host's copy, for the count of counted positions
        self.learn = torch.from_numpy(self.learn_host).to(self.device)
        self.weights = torch.from_numpy(np.concatenate(weights).astype(np.float32)).to(self.device) \
            if source.weighted else None
        self.keep = torch.from_numpy(standstill_keep(*shape[:2])).to(self.device)  # (H, W) bool
        self._times: dict[int, torch.Tensor] = {}  # (T,) float64 seconds of a window's frames, per T
        self.nbytes = sum(t.numel() * t.element_size() for t in (self.frames, self.targets, self.learn)) + \
            (self.weights.numel() * 4 if self.weights is not None else 0)

    def batch(self, dataset: WindowDataset, indices) -> dict:
        """The batch of windows ``indices`` of ``dataset`` (over this source, at its current epoch):
        the same tensors as ``default_collate([dataset[i] for i in indices])``, on the device.

        Returns:
            ``obs`` (B, T, H, W, C) uint8, ``target`` (B, T) int64 or (B, T, A) float32, ``t`` (B, T)
            float64 seconds, ``mask`` (B, T) bool, ``learn`` (B, T) bool, with ``dataset.previous``
            ``prev`` (B, H, W, C) uint8, for a weighted source ``weight`` (B, T) float32; and
            ``counted``, an int: the positions the loss counts (computed on the host, so the
            training step need not wait for the device to know it).

        Raises:
            ValueError: ``dataset`` is over another source.
        """
        if dataset.source is not self.source:
            raise ValueError("the dataset's windows are over another source than the frames on the device")
        items = np.asarray([dataset.items[i] for i in indices], dtype=np.int64).reshape(-1, 3)
        e, start, n = items[:, 0], items[:, 1], items[:, 2]
        B, T = len(items), dataset.window
        pos = np.arange(T)
        valid = pos[None] < n[:, None]  # (B, T)
        first = self.offsets[e] + start  # (B,) row of each window's first frame
        label = first[:, None] + np.minimum(pos[None], n[:, None] - 1)  # (B, T) rows of the labels
        image = label.copy()  # (B, T) rows of the frames (a standstill repeats one)
        prev = self.offsets[e] + np.maximum(start - 1, 0)  # (B,) DemonstrationSource.previous_frame
        still = np.zeros(B, bool)
        pick = getattr(self.source, "standstill_pick", None)
        if dataset.shuffle_borders and pick is not None and self.source.standstills > 0:
            for b, i in enumerate(indices):  # WindowDataset.__getitem__'s generator for window i
                k = pick(np.random.default_rng([dataset.seed, dataset.epoch, int(i)]), int(n[b]))
                if k is not None:
                    still[b] = True
                    image[b] = prev[b] = first[b] + k
        learn = valid & (self.learn_host[label] | still[:, None])  # (B, T) host copy, for the count
        counted = learn if self.causal else learn & (pos[None] == (n[:, None] - 1))
        packed = torch.from_numpy(np.concatenate([label.ravel(), image.ravel(), prev, valid.ravel(), still]))
        packed = packed.to(self.device, non_blocking=True)
        label_d, image_d = packed[:B * T], packed[B * T:2 * B * T]
        prev_d, valid_d = packed[2 * B * T:2 * B * T + B], packed[2 * B * T + B:3 * B * T + B].bool().view(B, T)
        still_d = packed[3 * B * T + B:].bool()

        obs = self.frames.index_select(0, image_d).view(B, T, *self.frames.shape[1:])
        obs.masked_fill_(~valid_d.view(B, T, 1, 1, 1), 0)
        target = self.targets.index_select(0, label_d).view(B, T, *self.targets.shape[1:])
        target.masked_fill_(~valid_d.view(B, T, *([1] * (target.dim() - 2))), 0)
        out = {"obs": obs, "target": target, "mask": valid_d}
        if T not in self._times:  # DemonstrationSource.window's times: np.arange(n) * frame_dt
            self._times[T] = torch.from_numpy(np.arange(T, dtype=np.float64) * self.source.frame_dt).to(self.device)
        out["t"] = self._times[T].expand(B, T).masked_fill(~valid_d, 0.0)
        if still.any():
            blank = still_d.view(B, 1, 1, 1) & ~self.keep.view(1, *self.keep.shape, 1)  # (B, H, W, 1)
            obs.masked_fill_(blank.unsqueeze(1), 0)
            at_rest = still_d.view(B, 1) & valid_d
            if target.dim() == 3:  # continuous: full throttle, the recorded steering kept
                target[..., -1] = torch.where(at_rest, torch.ones((), dtype=target.dtype, device=target.device),
                                              target[..., -1])
            else:
                target.masked_fill_(at_rest, CARRACING_GAS)
        if dataset.previous:
            p = self.frames.index_select(0, prev_d)
            if still.any():
                p.masked_fill_(blank, 0)
            out["prev"] = p
        out["learn"] = valid_d & (self.learn.index_select(0, label_d).view(B, T) | still_d.view(B, 1))
        if self.weights is not None:
            w = self.weights.index_select(0, label_d).view(B, T)
            out["weight"] = torch.where(still_d.view(B, 1), torch.ones_like(w), w).masked_fill(~valid_d, 0.0)
        out["counted"] = int(counted.sum())
        return out


class _Indices(Dataset):
    """The indices of a dataset's items (its length as it is now): a ``DataLoader`` over it draws the
    same shuffle from its generator as one over the dataset itself."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> int:
        return i


def _as_list(indices: list) -> list:
    return indices


def counted_positions(mask: torch.Tensor, learn: torch.Tensor | None, causal: bool) -> int:
    """The positions a batch's loss counts, as :func:`agent.train.bc.train_step` counts them: every
    real position (``mask`` (B, T) bool) of a causal core, else each window's last real one; and of
    those only the ones ``learn`` (B, T) bool keeps. Meant for host tensors (no device to wait for)."""
    if causal:
        counted = mask
    else:  # agent.train.bc._loss_mask
        last = mask.long().cumsum(1).argmax(1)
        counted = torch.zeros_like(mask)
        counted[torch.arange(len(mask)), last] = True
        counted = counted & mask
    if learn is not None:
        counted = counted & learn
    return int(counted.sum())


def with_count(batch: dict, causal: bool) -> dict:
    """A loader's batch (host tensors) with ``counted`` (:func:`counted_positions`) added."""
    batch["counted"] = counted_positions(batch["mask"], batch.get("learn"), causal)
    return batch


def to_device(batch: dict, device: torch.device) -> dict:
    """``batch`` with every tensor on ``device`` (``non_blocking``: from pinned memory the copy
    overlaps the work queued before it; on the same device the tensors themselves)."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class TrainBatches:
    """One epoch after another of training batches on the device, by either path (module docstring).

    Iterate it once per epoch, after ``dataset.set_epoch(epoch)``; every batch is a dict of device
    tensors as :meth:`DeviceWindows.batch` describes, ``counted`` included (on the ``loader`` path
    counted on the host before the copy, :func:`counted_positions`).

    Args:
        dataset: the training windows (:class:`agent.data.windows.WindowDataset`).
        batch_size: windows per batch.
        device: the training device.
        seed: seeds the shuffle's ``torch.Generator`` (:attr:`generator`; a checkpoint stores its state).
        workers: the loader's worker processes (the ``device`` path uses none).
        mode, share: as :func:`choose_path`.
        causal: as :class:`DeviceWindows`.

    Attributes:
        path: ``"device"`` or ``"loader"``; reason: why (logged). generator: the shuffle's generator.
        windows: the :class:`DeviceWindows` of the ``device`` path, else None.

    Raises:
        ValueError: as :func:`choose_path`.
    """

    def __init__(self, dataset: WindowDataset, batch_size: int, device: torch.device | str, seed: int,
                 workers: int = 0, mode: str = "auto", share: float = DEVICE_SHARE, causal: bool = True):
        self.dataset, self.device, self.causal = dataset, torch.device(device), causal
        self.path, self.reason = choose_path(dataset.source, self.device, mode, share)
        self.generator = torch.Generator().manual_seed(seed)
        self.windows = None
        if self.path == "device":
            self.windows = DeviceWindows(dataset.source, self.device, causal)
            self.loader = DataLoader(_Indices(dataset), batch_size=batch_size, shuffle=True, num_workers=0,
                                     generator=self.generator, drop_last=False, collate_fn=_as_list)
        else:
            cuda = self.device.type == "cuda"
            self.loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                     generator=self.generator, drop_last=False, pin_memory=cuda,
                                     prefetch_factor=4 if cuda and workers else None)

    def __len__(self) -> int:
        return len(self.loader)

    def describe(self) -> str:
        """One line: the path, why, and the bytes held on the device."""
        held = f", {self.windows.nbytes / (1 << 30):.2f} GiB on {self.device}" if self.windows is not None else ""
        return f"{self.path} ({self.reason}{held})"

    def __iter__(self):
        if self.windows is not None:
            for indices in self.loader:
                yield self.windows.batch(self.dataset, indices)
            return
        moved = (to_device(with_count(batch, self.causal), self.device) for batch in self.loader)
        yield from one_ahead(moved) if self.device.type == "cuda" else moved


def one_ahead(batches):
    """``batches`` in order, each yielded only once the next one has been taken: with
    :func:`to_device` from pinned memory the next batch's copy is queued before the current
    batch trains, so the two overlap."""
    ahead, have = None, False
    for batch in batches:
        if have:
            yield ahead
        ahead, have = batch, True
    if have:
        yield ahead


__all__ = ["BATCH_PATHS", "DEVICE_SHARE", "DeviceWindows", "TrainBatches", "choose_path", "counted_positions",
           "data_bytes", "one_ahead", "to_device", "with_count"]
