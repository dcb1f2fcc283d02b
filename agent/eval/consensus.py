"""What the other drivers steer where this one drives: a nearest-neighbour consensus, no training.

Shapes: N frames of one recording; M database frames (the other drivers'); D = 16 x 50 = 800 pixel
features, P principal components.

Leave-one-driver-out (:mod:`agent.train.lodo`) scores a policy trained on the other drivers against
a held-out driver's intent (the labels smoothed over +-0.5 s, :mod:`agent.eval.steering`). A
policy that sees only frames cannot know whose style it is scored against, so part of its error is
the held-out driver's difference from the other drivers at the same place, which no policy trained
on them removes. This module estimates that part directly. For each held-out frame it finds the
``k`` frames of the *other* drivers whose center-camera views look most alike, and predicts the
mean of their smoothed steering: the other drivers' consensus at that view. Scored exactly as a
fold's policy is (:func:`agent.eval.offline.score_recording`), it tells how far a setting is from
what the other drivers' steering itself implies, fold by fold
(:func:`agent.train.lodo.run_consensus_lodo` writes it as a leave-one-driver-out folder).

It is a k-nearest-neighbour regression (Fix and Hodges 1951; Cover and Hart 1967) on a standard
appearance feature: the luma (Y) of the network's 66x200 input crop, area-averaged to 16x50,
standardised per frame (so a brighter rendering of the same view matches), projected on the first
``dims`` principal components of the database (Pearson 1901, by SVD). The view alone decides the
neighbours: no label of the held-out driver is read before scoring. The database holds the other
drivers' frames driven forwards (at least ``min_speed`` mph and not reversing,
:func:`agent.data.udacity.reversing_frames`), as a policy's training loss counts them.

What it is not: a lower bound. A better match of views (position and heading on the track) could
find a closer consensus, and a trained policy generalises between views where the pixels differ.
Where the consensus scores *better* than a trained policy, the policy is not at the data's limit;
where both sit far from a driver, that driver steers unlike the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import torch

from agent.data.udacity import UdacityRecording, preprocess, reversing_frames
from agent.data.udacity_cache import CachedRecording
from agent.eval.steering import smooth_in_time

#: (rows, columns) of the pixel feature: the 66x200 crop's luma area-averaged to this size
FEATURE_SHAPE = (16, 50)


@dataclass(frozen=True)
class ConsensusConfig:
    """Settings of the consensus predictor.

    Attributes:
        k: neighbours averaged per frame (>= 1).
        dims: principal components kept (1 .. 800).
        min_speed: mph; database frames slower than this are left out (as ``--udacity.min-speed``).
        chunk: held-out frames compared at a time (memory: chunk x M floats).

    Raises:
        ValueError: a value outside its range.
    """

    k: int = 20
    dims: int = 64
    min_speed: float = 5.0
    chunk: int = 1024

    def __post_init__(self):
        d = FEATURE_SHAPE[0] * FEATURE_SHAPE[1]
        if not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"k (neighbours) must be an integer >= 1, got {self.k!r}")
        if not (isinstance(self.dims, int) and 1 <= self.dims <= d):
            raise ValueError(f"dims (principal components) must be an integer in 1..{d}, got {self.dims!r}")
        if not (np.isfinite(self.min_speed) and self.min_speed >= 0):
            raise ValueError(f"min_speed must be a finite speed >= 0 mph, got {self.min_speed!r}")
        if not (isinstance(self.chunk, int) and self.chunk >= 1):
            raise ValueError(f"chunk must be an integer >= 1, got {self.chunk!r}")


def view_features(crops: np.ndarray, batch: int = 512) -> np.ndarray:
    """The appearance feature of each frame: (N, 800) float32.

    Args:
        crops: (N, 66, 200, 3) uint8 YUV crops (the network's input, :func:`agent.data.udacity.preprocess`).
        batch: frames read at a time (a memory map is read in pieces).

    Returns:
        (N, 800) float32: the Y channel area-averaged to 16x50, minus its mean, over its standard
        deviation (per frame; a flat frame gives zeros).

    Raises:
        ValueError: crops not (N, 66, 200, 3).
    """
    if crops.ndim != 4 or crops.shape[1:] != (66, 200, 3):
        raise ValueError(f"crops must be (N, 66, 200, 3) YUV, got {crops.shape}")
    h, w = FEATURE_SHAPE
    out = np.empty((len(crops), h * w), np.float32)
    for i in range(0, len(crops), batch):
        y = np.asarray(crops[i:i + batch, :, :, 0])
        small = [cv2.resize(a, (w, h), interpolation=cv2.INTER_AREA) for a in y]
        out[i:i + len(y)] = np.stack(small).reshape(len(y), -1)
    out -= out.mean(1, keepdims=True)
    out /= out.std(1, keepdims=True) + 1e-6
    return out


def recording_crops(rec) -> np.ndarray:
    """(N, 66, 200, 3) uint8 YUV center-camera crops of a loaded recording (a view for a cached one).

    Raises:
        TypeError: not a :class:`~agent.data.udacity.UdacityRecording` or
            :class:`~agent.data.udacity_cache.CachedRecording`.
    """
    if isinstance(rec, CachedRecording):
        return rec.camera("center")
    if isinstance(rec, UdacityRecording):
        return preprocess(rec.frames_center)
    raise TypeError(f"expected a loaded Udacity recording, got {type(rec).__name__}")


def forward_frames(rec, min_speed: float) -> np.ndarray:
    """(N,) bool: the frames driven forwards at ``min_speed`` mph or faster (not reversing)."""
    rev = reversing_frames(rec.speed, rec.throttle, rec.brake, rec.segments)
    return (np.asarray(rec.speed) >= min_speed) & ~rev


def consensus_predict(query: np.ndarray, database: np.ndarray, targets: np.ndarray,
                      cfg: ConsensusConfig = ConsensusConfig()) -> np.ndarray:
    """The mean target of the ``k`` nearest database frames of each query frame: (N,) float64.

    The features are projected on the first ``cfg.dims`` principal components of ``database``
    (centred on its mean), and distances are Euclidean there.

    Args:
        query: (N, D) float32 features (:func:`view_features`) of the frames to predict.
        database: (M, D) float32 features of the other drivers' frames, M >= ``cfg.k``.
        targets: (M,) the database frames' steering (smoothed labels, normalised).
        cfg: k, dims and chunk.

    Returns:
        (N,) float64 predicted steering.

    Raises:
        ValueError: features of different widths, targets not one per database frame, fewer
            database frames than ``k``, or non-finite values.
    """
    query, database = np.asarray(query, np.float32), np.asarray(database, np.float32)
    targets = np.asarray(targets, np.float64)
    if query.ndim != 2 or database.ndim != 2 or query.shape[1] != database.shape[1]:
        raise ValueError(f"query (N, D) and database (M, D) must have the same width, got {query.shape} and "
                         f"{database.shape}")
    if targets.shape != (len(database),):
        raise ValueError(f"targets must be one per database frame: ({len(database)},), got {targets.shape}")
    if len(database) < cfg.k:
        raise ValueError(f"the database has {len(database)} frames, fewer than k = {cfg.k}")
    if not (np.isfinite(query).all() and np.isfinite(database).all() and np.isfinite(targets).all()):
        raise ValueError("features and targets must be finite")
    mean = database.mean(0)
    _, _, vt = np.linalg.svd(database[:: max(1, len(database) // 20000)] - mean, full_matrices=False)
    basis = vt[:cfg.dims].T.astype(np.float32)  # (D, P)
    db = torch.from_numpy((database - mean) @ basis)
    tg = torch.from_numpy(targets)
    out = np.empty(len(query), np.float64)
    for i in range(0, len(query), cfg.chunk):
        q = torch.from_numpy((query[i:i + cfg.chunk] - mean) @ basis)
        idx = torch.cdist(q, db).topk(cfg.k, largest=False).indices  # (chunk, k)
        out[i:i + len(q)] = tg[idx].mean(1).numpy()
    return out


@dataclass(frozen=True)
class VoteInputs:
    """What one recording brings to a vote: its frames' features, smoothed steering and which frames vote.

    Attributes:
        features: (N, 800) float32 (:func:`view_features`).
        smoothed: (N,) float64 steering smoothed over +-0.5 s (:func:`agent.eval.steering.smooth_in_time`).
        voters: (N,) bool, the frames driven forwards at ``min_speed`` or faster (:func:`forward_frames`).
    """

    features: np.ndarray
    smoothed: np.ndarray
    voters: np.ndarray


def vote_inputs(rec, min_speed: float = ConsensusConfig.min_speed) -> VoteInputs:
    """The :class:`VoteInputs` of a loaded recording (reads every center crop once)."""
    return VoteInputs(view_features(recording_crops(rec)),
                      smooth_in_time(rec.steering, rec.timestamps, segments=rec.segments),
                      forward_frames(rec, min_speed))


def leave_one_out_votes(inputs: list[VoteInputs], cfg: ConsensusConfig = ConsensusConfig()) -> list[np.ndarray]:
    """Each recording's frames predicted by the vote of the OTHER recordings' voters: one (N_i,) float64 each.

    Used as training targets (``agent train --udacity.consensus-k K``): every driver's frames are
    labelled with what the other drivers steer at the most alike views, so a policy learns the
    drivers' common steering rather than one driver's style; no recording votes on its own frames.

    Args:
        inputs: one :class:`VoteInputs` per recording (one driver each), at least 2.
        cfg: k, dims and chunk (``cfg.min_speed`` is already in ``inputs``' voters).

    Raises:
        ValueError: fewer than 2 recordings, or fewer voters among the others than ``cfg.k``.
    """
    if len(inputs) < 2:
        raise ValueError(f"a vote of the other drivers needs at least 2 recordings, got {len(inputs)}")
    out = []
    for i, own in enumerate(inputs):
        others = [x for j, x in enumerate(inputs) if j != i]
        out.append(consensus_predict(own.features, np.concatenate([x.features[x.voters] for x in others]),
                                     np.concatenate([x.smoothed[x.voters] for x in others]), cfg))
    return out


__all__ = ["FEATURE_SHAPE", "ConsensusConfig", "VoteInputs", "consensus_predict", "forward_frames",
           "leave_one_out_votes", "recording_crops", "view_features", "vote_inputs"]
