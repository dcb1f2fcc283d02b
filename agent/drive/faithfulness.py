"""How faithful are the saliency overlays? ROAD, confidence change and sanity checks, per CAM method and layer.

The live runner shows a CAM of the chosen action (HiResCAM at the second-to-last convolution since
2026-11-27, chosen with this module; Grad-CAM at the last convolution before:
:mod:`agent.drive.saliency`). This module measures, on frames of closed-loop drives, whether
such a map marks the pixels the policy actually uses, for every CAM method of the
pytorch-grad-cam library (``grad-cam``) that runs on the policy and at each convolution of the
CNN, against baselines that know nothing of the policy:

- **ROAD** (Remove And Debias; Rong, Leemann, Borisov, Kasneci and Kasneci, "A Consistent and
  Efficient Evaluation Strategy for Attribution Methods", ICML 2022), through the library's
  ``pytorch_grad_cam.metrics.road``: at percentile ``p`` the ``100 - p`` % most relevant pixels
  (MoRF, :class:`~pytorch_grad_cam.metrics.road.ROADMostRelevantFirst`) or least relevant
  pixels (LeRF, ``ROADLeastRelevantFirst``) are replaced by the library's noisy linear
  imputation of their neighbours, and the change of the target score is recorded. A faithful
  map makes MoRF drop the score and LeRF keep it; the combined score is ``(LeRF - MoRF) / 2``
  averaged over the percentiles (the library's ``ROADCombined``), higher is better.
- **Confidence change** (the library's
  :class:`~pytorch_grad_cam.metrics.cam_mult_image.CamMultImageConfidenceChange`): the change
  of the target score when the input is multiplied by the map (higher: the map keeps what
  matters).
- **Sanity check** (Adebayo, Gilmer, Muelly, Goodfellow, Hardt and Kim, "Sanity Checks for
  Saliency Maps", NeurIPS 2018), cascading model-parameter randomisation: on a deep copy of
  the policy the parameters are re-drawn group by group from the top (action head, temporal
  core, speed embedding if any, then the convolutions from the last to the first), and each
  method's map is compared with the trained policy's map by Spearman rank correlation
  (``scipy.stats.spearmanr``) and SSIM (Wang, Bovik, Sheikh and Simoncelli 2004; a small
  implementation here, scikit-image is not a dependency). A method whose map survives the
  randomisation of the whole model (mean rank correlation >= :data:`SANITY_THRESHOLD`) does
  not depend on what the model learnt and fails.

Baselines, scored the same way: the library's ``RandomCAM`` (random channel weights at the
target layer), its Sobel edge map (``pytorch_grad_cam.sobel_cam.sobel_cam``, a map of the
image alone) and the CarRacing road mask (:func:`road_mask`, grey road pixels).

What is perturbed. The policy is temporal: the CAM is that of the newest frame given the
window's earlier frames, which enter through the policy state the policy was given for that
frame (the NAC cache), held fixed, as in the live overlay (:class:`NewestFrameModel`). ROAD and
the confidence change perturb the newest frame's network input only, every channel of it: with
``motion`` the input also holds ``frame - previous``, and that channel is imputed (or
multiplied) with the frame, so a removed pixel takes its motion with it. The earlier frames are
never perturbed. Pixels that the CNN does not read (the dashboard strip that ``speed``,
``speedometer`` and ``speed-input`` blank; :meth:`agent.nn.features.FeaturesExtractor.readable`)
are held at their values (:class:`ReadableInputModel`): a ``speed-input`` policy reads its
speed off that strip as a number, which is not part of the image the map explains. Maps are 0
there, as the overlay draws them.

Ties. The library ranks pixels with ``np.percentile`` and ``mask < threshold``; many tied
values (an all-zero map, or large zero areas after Grad-CAM's ReLU) then remove far more or far
fewer pixels than the percentile says. Every map is given a tie-break of at most 1e-7
(seeded, the same for every method on a step) before scoring, so ties are ordered at random:
an empty map scores as a random ranking.

Targets. The map is computed for the logit of the action the policy chose (as live). The
scores measure that action's logit margin, its logit minus the largest other logit
(:class:`LogitMarginTarget`, in logit units; positive while the action stays chosen): the
shipped policy is so confident (logit gaps of 5 to 500) that the softmax probability of its
action is 1.0 in float32 on many frames and no perturbation short of flipping the decision
moves it. ``target="softmax"`` (``ClassifierOutputSoftmaxTarget``) and ``"logit"``
(``ClassifierOutputTarget``) are available in :func:`faithfulness_scores`.

Entry point: :func:`faithfulness_report` (and ``python -m agent.drive.faithfulness --help``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from agent._torchvision_compat import ensure_torchvision
from agent.atomic import write_atomic
from agent.drive.regions import road_mask
from agent.drive.stats import format_interval, json_default, mean_interval
from agent.drive.saliency import NewestFrameModel, conv_layers

log = logging.getLogger(__name__)

#: CAM methods of pytorch-grad-cam tried, by class name (a method that fails on the policy is
#: skipped and its error recorded). FullGrad ignores the target layer (it uses every conv bias).
LIBRARY_METHODS = ("GradCAM", "HiResCAM", "GradCAMPlusPlus", "XGradCAM", "LayerCAM", "GradCAMElementWise",
                   "EigenCAM", "EigenGradCAM", "KPCA_CAM", "FEM", "ScoreCAM", "AblationCAM", "ShapleyCAM",
                   "FinerCAM", "FullGrad")
#: Baselines: the library's RandomCAM (per layer), its Sobel edge map and the road mask (no layer).
BASELINES = ("RandomCAM", "SobelCAM", "road")
#: Methods whose map does not depend on the target layer (one row, layer "-").
LAYERLESS = ("SobelCAM", "road", "FullGrad")
#: ROAD percentiles: at p, 100 - p % of the pixels are imputed (MoRF: the most relevant; LeRF: the least).
DEFAULT_PERCENTILES = (20, 50, 80)
#: A method fails the sanity check when, with every parameter group randomised, its maps keep a
#: mean Spearman rank correlation of at least this with the trained model's maps (the project's
#: choice; Adebayo et al. judge by eye, their failing methods stay near 1).
SANITY_THRESHOLD = 0.5
#: The tie-break added to every map before ROAD (see the module docstring).
TIE_BREAK = 1e-7


# ----------------------------------------------------------------------------- the model the library sees

def input_keep_mask(policy, frame_hw: tuple[int, int]) -> np.ndarray:
    """(H', W') float32 over the network input: 1 where the CNN reads the pixel, 0 where ``preprocess``
    blanks it (the features extractor's ``readable`` weights, cut to ``saliency_region``)."""
    top, bottom, left, right = policy.saliency_region(frame_hw)
    readable = getattr(policy.features, "readable", None)
    full = readable(frame_hw) if readable is not None else np.ones(frame_hw, np.float32)
    return np.ascontiguousarray(np.asarray(full, np.float32)[top:bottom, left:right])


class ReadableInputModel(nn.Module):
    """(N, C', H', W') newest-frame input -> (N, A) policy output, for the library's CAMs and metrics.

    :class:`agent.drive.saliency.NewestFrameModel` (the policy state and time of the frame held
    fixed), with the pixels the CNN does not read held at the frame's own values: ``x * keep +
    x0 * (1 - keep)``, so a perturbation of the dashboard strip (which a ``speed-input`` policy
    reads as a number) changes nothing. Set the frame with :meth:`set_frame` before calling.
    """

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy
        self.inner = NewestFrameModel(policy)
        self.x0: Tensor | None = None
        self.keep: Tensor | None = None

    def set_frame(self, x0: Tensor, state_before, t: Tensor | None, keep: np.ndarray | None) -> None:
        """The (1, C', H', W') unperturbed input, its policy state and time, and the (H', W') keep mask."""
        self.x0 = x0.detach()
        self.inner.state_before, self.inner.t = state_before, t
        self.keep = None if keep is None else torch.as_tensor(keep, dtype=x0.dtype, device=x0.device)[None, None]

    def forward(self, x: Tensor) -> Tensor:
        if self.keep is not None and self.x0 is not None:
            x = x * self.keep + self.x0 * (1.0 - self.keep)
        return self.inner(x)


@contextlib.contextmanager
def seeded(seed: int):
    """Within the block torch's and NumPy's global RNGs are seeded with ``seed`` (RandomCAM draws from
    NumPy's, ROAD's imputation noise from torch's); both are restored afterwards."""
    np_state = np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        np.random.seed(int(seed) % 2 ** 32)
        try:
            yield
        finally:
            np.random.set_state(np_state)


@contextlib.contextmanager
def gradient_at(policy: nn.Module, layer: nn.Module | None):
    """Within the block only ``layer``'s bias (or weight) requires a gradient (None: the first
    convolution's), as the live overlay does: the backward stops at the target layer and
    computes no weight gradients. The flags are restored afterwards."""
    saved = {n: p.requires_grad for n, p in policy.named_parameters()}
    if layer is None:
        layer = next(iter(conv_layers(policy).values()))
    policy.requires_grad_(False)
    leaf = layer.bias if getattr(layer, "bias", None) is not None else layer.weight
    leaf.requires_grad_(True)
    try:
        yield
    finally:
        for n, p in policy.named_parameters():
            p.requires_grad_(saved.get(n, True))


# ----------------------------------------------------------------------------- maps

def sobel_map(frame: np.ndarray) -> np.ndarray:
    """(H, W) float32 in [0, 1]: the library's Sobel edge map of an RGB frame (``sobel_cam``), / its maximum."""
    ensure_torchvision()
    from pytorch_grad_cam.sobel_cam import sobel_cam

    g = sobel_cam(np.ascontiguousarray(np.asarray(frame, np.uint8)[..., :3])).astype(np.float32)
    m = float(g.max())
    return g / m if m > 0 else g


def make_cam(name: str, model: nn.Module, layer: nn.Module):
    """A pytorch-grad-cam CAM object of class ``name`` on ``model`` at ``layer`` (use it as a context
    manager: its exit releases the hooks).

    Raises:
        ValueError: ``name`` is no CAM class of the library.
    """
    ensure_torchvision()
    import pytorch_grad_cam as lib

    cls = getattr(lib, name, None)
    if cls is None or not isinstance(cls, type):
        raise ValueError(f"pytorch_grad_cam has no CAM class {name!r}")
    if name == "FullGrad":
        with contextlib.redirect_stdout(None):  # it prints that target_layers is ignored
            return cls(model=model, target_layers=[])
    return cls(model=model, target_layers=[layer])


class LogitMarginTarget:
    """A target for the library's metrics: (A,) one row of logits -> ``logit[index] - max(other logits)``."""

    def __init__(self, index: int):
        self.index = int(index)

    def __call__(self, model_output: Tensor) -> Tensor:
        out = model_output.reshape(-1)
        others = torch.cat([out[: self.index], out[self.index + 1:]])
        return out[self.index] - others.max()


def _metric_target(index: int, kind: str = "margin"):
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget, ClassifierOutputTarget

    if kind == "margin":
        return LogitMarginTarget(index)
    if kind == "softmax":
        return ClassifierOutputSoftmaxTarget(int(index))
    if kind == "logit":
        return ClassifierOutputTarget(int(index))
    raise ValueError(f"target must be 'margin', 'softmax' or 'logit', got {kind!r}")


def _cam_target(index: int):
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    return ClassifierOutputTarget(int(index))


def _as_map(cam, shape: tuple[int, int]) -> np.ndarray:
    """The library's (1, h, w) or (h, w) output -> (H', W') float32 in [0, 1], NaN as 0."""
    c = np.nan_to_num(np.asarray(cam, np.float32).reshape(np.shape(cam)[-2:]))
    if c.shape != tuple(shape):
        import cv2

        c = cv2.resize(c, (shape[1], shape[0]), interpolation=cv2.INTER_LINEAR)
    return np.clip(c, 0.0, None)


# ----------------------------------------------------------------------------- scores

def tie_broken(cam: np.ndarray, seed: int) -> np.ndarray:
    """``cam`` (H, W) as float64 plus a seeded uniform tie-break in [0, :data:`TIE_BREAK`)."""
    rng = np.random.default_rng(int(seed))
    return np.asarray(cam, np.float64) + rng.random(np.shape(cam)) * TIE_BREAK


def faithfulness_scores(model: nn.Module, x: Tensor, cam: np.ndarray, target_index: int,
                        percentiles: Sequence[int] = DEFAULT_PERCENTILES, seed: int = 0,
                        target: str = "margin") -> dict:
    """ROAD (MoRF and LeRF at each percentile, and combined) and the confidence change of one map.

    Uses the library's ``ROADMostRelevantFirst``, ``ROADLeastRelevantFirst`` and
    ``CamMultImageConfidenceChange`` (Rong et al. 2022; pytorch-grad-cam's metrics). The combined
    score is the library's ``ROADCombined`` formula, mean over ``percentiles`` of (LeRF - MoRF) / 2.

    Args:
        model: (1, C, H, W) -> (1, A), e.g. a :class:`ReadableInputModel` with its frame set.
        x: (1, C, H, W) the input to perturb (every channel is imputed at a removed pixel).
        cam: (H, W) map, >= 0, higher = more relevant (any scale: ROAD uses its ranking; the
            confidence change multiplies the input by it, so give it in [0, 1]).
        target_index: the output scored (the chosen action).
        percentiles: ROAD's percentiles p: 100 - p % of the pixels are imputed.
        seed: seeds the tie-break (:func:`tie_broken`) and the imputation noise (the global torch
            RNG is forked, not changed); give every method the same seed on a frame.
        target: "margin" (:class:`LogitMarginTarget`, the default), "softmax" (the probability of
            ``target_index``) or "logit" (the raw output).

    Returns:
        {"morf": {p: change}, "lerf": {p: change}, "road": combined, "conf_change": change}; a
        change is the score after the perturbation minus before.

    Raises:
        ValueError: ``x`` is not one (1, C, H, W) input, ``cam`` is not (H, W), or an unknown ``target``.
    """
    ensure_torchvision()
    from pytorch_grad_cam.metrics.cam_mult_image import CamMultImageConfidenceChange
    from pytorch_grad_cam.metrics.road import ROADLeastRelevantFirst, ROADMostRelevantFirst

    if x.ndim != 4 or x.shape[0] != 1:
        raise ValueError(f"x must be one (1, C, H, W) input, got {tuple(x.shape)}")
    if tuple(np.shape(cam)) != tuple(x.shape[-2:]):
        raise ValueError(f"cam must be {tuple(x.shape[-2:])} (the input's H, W), got {np.shape(cam)}")
    tgt = [_metric_target(target_index, target)]
    ranked = tie_broken(cam, seed)[None]  # (1, H, W) float64: float32 would round the tie-break away near 1
    x = x.detach()
    out = {"morf": {}, "lerf": {}}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for p in percentiles:
            torch.manual_seed(int(seed) * 1000 + int(p))
            out["morf"][int(p)] = float(ROADMostRelevantFirst(int(p))(x, ranked, tgt, model)[0])
            torch.manual_seed(int(seed) * 1000 + int(p) + 500)
            out["lerf"][int(p)] = float(ROADLeastRelevantFirst(int(p))(x, ranked, tgt, model)[0])
        mult = np.clip(np.asarray(cam, np.float32), 0.0, 1.0)[None]
        out["conf_change"] = float(CamMultImageConfidenceChange()(x, mult, tgt, model)[0])
    out["road"] = float(np.mean([(out["lerf"][p] - out["morf"][p]) / 2 for p in out["morf"]]))
    return out


def ssim(a: np.ndarray, b: np.ndarray, data_range: float = 1.0, sigma: float = 1.5) -> float:
    """Mean structural similarity of two (H, W) maps (Wang, Bovik, Sheikh and Simoncelli 2004, eq. 13,
    Gaussian window of ``sigma`` pixels, K1 = 0.01, K2 = 0.03). 1 for equal maps.

    Raises:
        ValueError: maps of different or non-2-D shapes.
    """
    from scipy.ndimage import gaussian_filter

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"ssim needs two (H, W) maps of one shape, got {a.shape} and {b.shape}")
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu_a, mu_b = gaussian_filter(a, sigma), gaussian_filter(b, sigma)
    var_a = gaussian_filter(a * a, sigma) - mu_a ** 2
    var_b = gaussian_filter(b * b, sigma) - mu_b ** 2
    cov = gaussian_filter(a * b, sigma) - mu_a * mu_b
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))
    return float(s.mean())


def rank_correlation(a: np.ndarray, b: np.ndarray, keep: np.ndarray | None = None) -> float:
    """Spearman rank correlation (``scipy.stats.spearmanr``) of two maps over the pixels where ``keep`` > 0;
    NaN when either map is constant there."""
    from scipy.stats import spearmanr

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if keep is not None:
        sel = np.asarray(keep) > 0
        a, b = a[sel], b[sel]
    a, b = a.ravel(), b.ravel()
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def _rho_with_limits(a: np.ndarray, b: np.ndarray, keep: np.ndarray | None) -> float:
    """:func:`rank_correlation`, with its undefined cases given their limits for the sanity check: 1 when
    both maps are constant and equal, 0 when exactly one is constant (an empty map after
    randomisation shares no ranking with a non-empty one) or both are constant but differ."""
    rho = rank_correlation(a, b, keep)
    if np.isfinite(rho):
        return rho
    sel = np.ones(np.shape(a), bool) if keep is None else np.asarray(keep) > 0
    ca, cb = np.ptp(np.asarray(a)[sel]) == 0, np.ptp(np.asarray(b)[sel]) == 0
    if ca and cb:
        return 1.0 if np.allclose(np.asarray(a)[sel], np.asarray(b)[sel]) else 0.0
    return 0.0


# ----------------------------------------------------------------------------- frames from drives

@dataclass
class Sample:
    """One step of a closed-loop drive, enough to recompute the policy's view of it.

    Attributes:
        frame: (H, W, 3) uint8, the newest frame.
        state_before: the policy state ``step`` was given for it (None at the episode start).
        t: (1,) its timestamp in seconds, or None.
        action: the action the policy chose (its argmax).
        track: the track seed. step: the step index in the episode.
        history: (K, H, W, 3) uint8, the K frames before it (oldest first), to rebuild the state
            on another copy of the policy (:func:`stream_state`).
    """

    frame: np.ndarray
    state_before: object
    t: Tensor | None
    action: int
    track: int
    step: int
    history: np.ndarray = field(default_factory=lambda: np.zeros((0, 96, 96, 3), np.uint8))


class _RecordingActor:
    """Wraps an actor and keeps every decision's (frame, state before, time, action)."""

    def __init__(self, inner):
        self.inner, self.kept = inner, []
        self.label, self.has_probs, self.traces_reason = inner.label, inner.has_probs, inner.traces_reason

    def reset(self) -> None:
        self.inner.reset()
        self.kept = []

    def act(self, obs, env=None, info=None):
        d = self.inner.act(obs, env, info)
        self.kept.append((np.array(obs, np.uint8), d.state_before, d.t, int(d.action_class)))
        return d


def collect_samples(policy, tracks: Sequence[int], steps_per_track: int, max_steps: int = 1000,
                    history: int | None = None) -> list[Sample]:
    """Drive ``policy`` (deterministic) one episode on each track and keep ``steps_per_track`` steps of each,
    evenly spaced over the episode, from the step after the window has filled.

    Uses the project's rollout (:func:`agent.actors.rollout.rollout` through
    :func:`agent.actors.loading.make_actor` and ``make_carracing_for``).

    Args:
        policy: a discrete CarRacing :class:`agent.nn.policy.DrivingPolicy`.
        tracks: track seeds (unseen tracks are >= 1,000,000).
        steps_per_track: steps kept per track (fewer if the episode is shorter).
        max_steps: episode cap.
        history: frames kept before each step (default: the window + 1).

    Raises:
        ValueError: a policy without discrete outputs.
    """
    from agent.actors.loading import make_actor, make_carracing_for
    from agent.actors.rollout import rollout

    if getattr(policy, "output_kind", None) != "discrete":
        raise ValueError("faithfulness is measured for discrete policies (targets are action logits)")
    k = int(history if history is not None else policy.config.window + 1)
    out: list[Sample] = []
    policy.eval()
    for seed in tracks:
        env = make_carracing_for(policy)
        try:
            actor = _RecordingActor(make_actor(policy, deterministic=True))
            rollout(env, actor, int(seed), max_steps=max_steps, keep_frames=False)
        finally:
            env.close()
        kept = actor.kept
        first = min(k, len(kept) - 1)
        idx = np.unique(np.linspace(first, len(kept) - 1, num=min(steps_per_track, len(kept) - first)).round().astype(int))
        frames = np.stack([f for f, *_ in kept])
        for i in idx:
            f, s, t, a = kept[i]
            out.append(Sample(f, s, t, a, int(seed), int(i), frames[max(0, i - k):i].copy()))
        log.info("track %d: %d steps driven, %d kept", seed, len(kept), len(idx))
    return out


def stream_state(policy, history: np.ndarray):
    """The policy state after ``policy.step`` on each frame of ``history`` (K, H, W, 3), from None."""
    state = None
    with torch.no_grad():
        for f in history:
            _, state = policy.step(torch.as_tensor(np.ascontiguousarray(f))[None], state)
    return state


# ----------------------------------------------------------------------------- maps of many methods

@dataclass
class MapRun:
    """Maps of one method at one layer over a list of samples.

    Attributes:
        maps: list of (H', W') float32 in [0, 1] (0 where the CNN reads nothing), one per sample.
        seconds: the time each map took (the library call: forward and backward), in seconds.
        error: why the method could not run, or None.
    """

    maps: list
    seconds: list
    error: str | None = None


def method_maps(policy, samples: Sequence[Sample], method: str, layer: nn.Module | None,
                states: Sequence | None = None, targets: Sequence[int] | None = None) -> MapRun:
    """``method``'s maps of the newest frame of each sample, at ``layer``.

    Args:
        policy: the policy (its eval mode is set; its ``requires_grad`` flags are restored).
        samples: the steps.
        method: a library CAM class name (:data:`LIBRARY_METHODS`, ``"RandomCAM"``), ``"SobelCAM"`` or ``"road"``.
        layer: the target layer (ignored by the layerless methods).
        states: the policy states to use instead of the samples' own (a re-streamed state, for
            a randomised copy of the policy).
        targets: the action indices to attribute instead of the samples' chosen actions.

    Returns:
        a :class:`MapRun`; ``error`` is set (and ``maps`` empty) when the library fails on the
        policy, with the exception's type and message.
    """
    policy.eval()
    frame_hw = samples[0].frame.shape[:2] if samples else (96, 96)
    keep = input_keep_mask(policy, frame_hw)
    top, bottom, left, right = policy.saliency_region(frame_hw)
    maps, secs = [], []
    if method in ("SobelCAM", "road"):
        for s in samples:
            t0 = time.perf_counter()
            full = sobel_map(s.frame) if method == "SobelCAM" else road_mask(s.frame)
            maps.append(full[top:bottom, left:right] * keep)
            secs.append(time.perf_counter() - t0)
        return MapRun(maps, secs)
    model = ReadableInputModel(policy)
    try:
        with gradient_at(policy, None if method == "FullGrad" else layer), make_cam(method, model, layer) as cam:
            for i, s in enumerate(samples):
                state = s.state_before if states is None else states[i]
                x = policy.saliency_input(s.frame, state)
                model.set_frame(x, state, s.t if states is None else None, keep)
                a = s.action if targets is None else int(targets[i])
                t0 = time.perf_counter()
                with contextlib.redirect_stdout(None), contextlib.redirect_stderr(io.StringIO()):  # tqdm bars
                    c = cam(input_tensor=x, targets=[_cam_target(a)])
                secs.append(time.perf_counter() - t0)
                maps.append(_as_map(c, keep.shape) * keep)
    except Exception as exc:  # the library's error on this model: recorded, the method skipped
        return MapRun([], [], f"{type(exc).__name__}: {exc}"[:300])
    if len(maps) != len(samples):  # BaseCAM's __exit__ swallows an IndexError
        return MapRun([], [], f"stopped after {len(maps)} of {len(samples)} frames (an IndexError inside the library)")
    return MapRun(maps, secs)


# ----------------------------------------------------------------------------- sanity checks

def randomisation_groups(policy) -> list[tuple[str, list[str]]]:
    """The parameter groups of a :class:`agent.nn.policy.DrivingPolicy` from the output down:
    ``("head", names)``, ``("core", names)``, ``("speed_embed", names)`` if any, then the
    convolutions from the last to the first (``("conv3", ...)``, ..., ``("conv1", ...)``)."""
    groups = []
    for name in ("head", "core"):
        mod = getattr(policy, name, None)
        if isinstance(mod, nn.Module):
            names = [f"{name}.{n}" for n, _ in mod.named_parameters()]
            if names:
                groups.append((name, names))
    emb = getattr(policy.features, "speed_embed", None)
    if isinstance(emb, nn.Module):
        groups.append(("speed_embed", [f"features.speed_embed.{n}" for n, _ in emb.named_parameters()]))
    by_module = {m: n for n, m in policy.named_modules()}
    for cname, conv in reversed(list(conv_layers(policy).items())):
        groups.append((cname, [f"{by_module[conv]}.{n}" for n, _ in conv.named_parameters()]))
    return groups


def cascade_copies(policy, seed: int = 0):
    """Yield (group name, copy) for each step of the cascading randomisation (Adebayo et al. 2018, section 4).

    Copy k is a deep copy of ``policy`` with the first k groups of :func:`randomisation_groups`
    re-drawn: every parameter tensor of a group is replaced by i.i.d. Gaussian values with the
    trained tensor's mean and standard deviation (its scale kept, its learnt structure gone).
    The draws are made once, so copy k + 1 randomises copy k's groups identically plus one more.
    Loaded with ``load_state_dict``, which also drops the NAC's kept derived weights.
    """
    groups = randomisation_groups(policy)
    gen = torch.Generator().manual_seed(int(seed))
    trained = {n: p.detach() for n, p in policy.named_parameters()}
    drawn: dict[str, Tensor] = {}
    for gname, names in groups:
        for n in names:
            p = trained[n]
            std = float(p.float().std()) if p.numel() > 1 else 0.0
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            drawn[n] = (noise * std + float(p.float().mean())).to(p.dtype)
        cp = copy.deepcopy(policy)
        sd = cp.state_dict()
        for n, v in drawn.items():
            sd[n] = v.to(sd[n].device)
        cp.load_state_dict(sd)
        cp.eval()
        yield gname, cp


def sanity_check(policy, samples: Sequence[Sample], methods: Sequence[str], layer_name: str,
                 seed: int = 0, threshold: float = SANITY_THRESHOLD) -> dict:
    """Cascading model-parameter randomisation (Adebayo et al. 2018) of each method's map at one layer.

    Every state is rebuilt from each sample's ``history`` on the model in question
    (:func:`stream_state`), for the trained policy too, and every model attributes the action the
    trained policy chose on the sample.

    Args:
        policy: the trained policy (not changed).
        samples: steps with ``history``.
        methods: method names as :func:`method_maps` takes them.
        layer_name: "conv1", ... (:func:`conv_layers`): the target layer, of each copy.
        seed: the randomisation's seed.
        threshold: :data:`SANITY_THRESHOLD`.

    Returns:
        {method: {"stages": [{"randomised": group, "spearman": interval, "ssim": interval}, ...],
        "final_spearman": mean at the last stage, "passes": bool or None (no finite correlation),
        "error": str or None}}; intervals as :func:`mean_interval` gives them.
    """
    keep = input_keep_mask(policy, samples[0].frame.shape[:2])
    ref_states = [stream_state(policy, s.history) for s in samples]
    targets = [s.action for s in samples]
    ref = {}
    for m in methods:
        with seeded(seed):  # the same draws as each copy's below: RandomCAM keeps its channel weights
            ref[m] = method_maps(policy, samples, m, conv_layers(policy)[layer_name], ref_states, targets)
    result = {m: {"stages": [], "error": ref[m].error} for m in methods}
    for gname, cp in cascade_copies(policy, seed):
        states = [stream_state(cp, s.history) for s in samples]
        layer = conv_layers(cp)[layer_name]
        for m in methods:
            if ref[m].error:
                continue
            with seeded(seed):
                run = method_maps(cp, samples, m, layer, states, targets)
            if run.error:
                result[m]["error"] = f"on the copy with {gname} randomised: {run.error}"
                continue
            rho = [_rho_with_limits(a, b, keep) for a, b in zip(ref[m].maps, run.maps)]
            ss = [ssim(a, b) for a, b in zip(ref[m].maps, run.maps)]
            result[m]["stages"].append({"randomised": gname, "spearman": mean_interval(rho), "ssim": mean_interval(ss)})
        del cp
    for m in methods:
        st = result[m]["stages"]
        final = st[-1]["spearman"]["mean"] if st else float("nan")
        result[m]["final_spearman"] = final
        result[m]["passes"] = None if not np.isfinite(final) else bool(final < threshold)
    return result


# ----------------------------------------------------------------------------- the report

def markdown_table(report: dict) -> str:
    """The report's method x layer table (markdown): ROAD combined and confidence change with 95 % intervals,
    MoRF and LeRF per percentile, empty maps, ms per frame and the sanity-check outcome."""
    ps = report["percentiles"]
    head = ("| method | layer | steps | ROAD combined [95 % CI] | "
            + " | ".join(f"MoRF {100 - p} %" for p in ps) + " | " + " | ".join(f"LeRF {100 - p} %" for p in ps)
            + f" | Δ ROAD vs {report.get('reference', 'GradCAM')} [95 % CI]"
            + " | confidence change [95 % CI] | empty maps | ms / frame | sanity (ρ fully randomised) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in report["rows"]:
        if r.get("error"):
            lines.append(f"| {r['method']} | {r['layer']} | - | skipped: {r['error'][:120]} |")
            continue
        san = r.get("sanity")
        san_s = "-" if not san else ("fails" if san["passes"] is False else "passes" if san["passes"] else "n/a") \
            + (f" ({san['final_spearman']:.2f})" if san and np.isfinite(san["final_spearman"]) else "")
        lines.append(f"| {r['method']} | {r['layer']} | {r['steps']} | {format_interval(r['road'], signed=True)} | "
                     + " | ".join(f"{r['morf'][str(p)]['mean']:+.3f}" for p in ps) + " | "
                     + " | ".join(f"{r['lerf'][str(p)]['mean']:+.3f}" for p in ps)
                     + f" | {format_interval(r.get('road_minus_reference'), signed=True) if 'road_minus_reference' in r else '-'}"
                     + f" | {format_interval(r['conf_change'], signed=True)} | {100 * r['empty_share']:.0f} % "
                     + f"| {r['ms_per_frame']:.1f} | {san_s} |")
    return "\n".join(lines) + "\n"


def sanity_markdown(report: dict) -> str:
    """The report's sanity checks (markdown), one table per layer: each method's mean Spearman rank
    correlation (and SSIM) with the trained model's map after each cascading-randomisation stage."""
    out = []
    for lname, res in report.get("sanity", {}).items():
        stages = next((([s["randomised"] for s in v["stages"]]) for v in res.values() if v["stages"]), [])
        out.append(f"Target layer {lname}, {report.get('sanity_steps', '?')} steps; cell: Spearman ρ / SSIM "
                   f"against the trained model's map, after randomising down to the named group.\n")
        out.append("| method | " + " | ".join(stages) + " | outcome |")
        out.append("|---|" + "---|" * (len(stages) + 1))
        for m, v in res.items():
            if v.get("error") and not v["stages"]:
                out.append(f"| {m} | " + " | ".join("-" for _ in stages) + f" | skipped: {v['error'][:80]} |")
                continue
            cells = [f"{s['spearman']['mean']:.2f} / {s['ssim']['mean']:.2f}" for s in v["stages"]]
            verdict = "fails" if v["passes"] is False else "passes" if v["passes"] else "n/a"
            out.append(f"| {m} | " + " | ".join(cells) + f" | {verdict} |")
        out.append("")
    return "\n".join(out)


def faithfulness_report(policy_path, tracks: Sequence[int], steps: int, methods: Sequence[str] | None = None,
                        layers: Sequence[str] | None = None, out_dir: str | Path | None = None,
                        percentiles: Sequence[int] = DEFAULT_PERCENTILES, step_limits: dict | None = None,
                        sanity_steps: int = 20, sanity_layers: Sequence[str] | None = None, seed: int = 0,
                        progress: Callable[[str], None] | None = None, samples: Sequence[Sample] | None = None) -> dict:
    """Measure the faithfulness of every method at every layer on closed-loop drives; write JSON and markdown.

    Args:
        policy_path: a policy file or shipped name (``nac.pt``), a discrete CarRacing policy.
        tracks: track seeds to drive (one episode each; unseen tracks are >= 1,000,000).
        steps: steps scored in all, spread evenly over the tracks and over each episode.
        methods: library CAM class names and baselines (default: :data:`LIBRARY_METHODS` + :data:`BASELINES`).
        layers: "conv1", ... (default: every convolution of the CNN).
        out_dir: where ``faithfulness.json`` and ``faithfulness.md`` go (None: nothing written). Rows
            are saved to ``faithfulness.partial.json`` as they finish; a rerun with the same policy
            weights, tracks, step count, percentiles and seed keeps every row of that file (and those of a
            finished ``faithfulness.json``) that was scored on the same steps, and scores the rest.
        percentiles: ROAD's percentiles (:func:`faithfulness_scores`).
        step_limits: score only n of the steps (evenly spread): {"METHOD": n} for a slow method,
            {"@LAYER": n} for every method at a layer, {"METHOD@LAYER": n} for one row (first match wins
            in that order: row, method, layer).
        sanity_steps: steps used by the sanity check (evenly spread over the scored ones; 0: none).
        sanity_layers: layers checked (default: the last convolution).
        seed: seeds the tie-breaks, ROAD's imputation noise, RandomCAM and the randomisation.
        progress: called with a line of text after each method and layer (e.g. ``print``).
        samples: steps already collected (:func:`collect_samples` with this policy, ``tracks`` and
            ``steps``), to reuse them; None: drive the tracks here.

    Returns:
        the report dict (what ``faithfulness.json`` holds): policy, its weights' sha256, tracks,
        rows (one per method x layer: intervals of "road", "conf_change", "morf"/"lerf" per
        percentile, "empty_share", "ms_per_frame" (median), "sanity"), and "sanity" per layer.

    Raises:
        FileNotFoundError: no such policy. ValueError: a policy that is not discrete, or an
        unknown layer.
    """
    from agent.actors.loading import load_policy, resolve_policy_path
    from agent.eval.card import weights_sha256

    say = progress or (lambda s: log.info("%s", s))
    path = resolve_policy_path(policy_path)
    policy = load_policy(path)
    policy.eval()
    convs = conv_layers(policy)
    layers = list(layers or convs)
    unknown = [n for n in layers if n not in convs]
    if unknown:
        raise ValueError(f"unknown layer(s) {unknown}; this policy has {list(convs)}")
    methods = list(methods or (*LIBRARY_METHODS, *BASELINES))
    step_limits = dict(step_limits or {})
    per_track = int(math.ceil(steps / max(1, len(tracks))))
    t_start = time.perf_counter()
    if samples is None:
        samples = collect_samples(policy, tracks, per_track)
    samples = list(samples)
    say(f"{len(samples)} steps from {len(tracks)} tracks in {time.perf_counter() - t_start:.0f} s")
    rows, road_by_step = [], {}
    # a cut-short run with the same policy, steps and settings left its finished rows: keep them
    key = {"weights_sha256": weights_sha256(path), "tracks": [int(t) for t in tracks], "steps": len(samples),
           "percentiles": [int(p) for p in percentiles], "seed": int(seed)}
    partial = Path(out_dir) / "faithfulness.partial.json" if out_dir is not None else None
    done = {}
    for source in ([partial, partial.with_name("faithfulness.json")] if partial is not None else []):
        # a cut-short run's rows, and a finished report's that it lacks (a rerun with more methods or steps adds to it)
        if not source.is_file():
            continue
        try:
            saved = json.loads(source.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(saved, dict) and "key" not in saved:  # a finished report carries the key's fields
            saved = {"key": {k: saved.get(k) for k in key}, "rows": saved.get("rows", [])}
        if isinstance(saved, dict) and saved.get("key") == key:
            rows_here = {(r["method"], r["layer"]): r for r in saved.get("rows", [])}
            kept = {k: r for k, r in rows_here.items() if k not in done}  # the cut-short run's rows come first
            done.update(kept)
            say(f"resuming: {len(kept)} row(s) kept from {source}")
    for m in methods:
        for lname in (["-"] if m in LAYERLESS else layers):
            limit = step_limits.get(f"{m}@{lname}", step_limits.get(m, step_limits.get(f"@{lname}")))
            idx = np.arange(len(samples)) if not limit or limit >= len(samples) else \
                np.unique(np.linspace(0, len(samples) - 1, int(limit)).round().astype(int))
            row = done.get((m, lname))
            if row is not None and (row.get("error") or row.get("steps_index") == idx.tolist()):
                rows.append(row)  # finished by the cut-short run on the same steps: kept
                if "road_per_step" in row:
                    road_by_step[(m, lname)] = dict(zip(row["steps_index"], row["road_per_step"]))
                continue
            sub = [samples[i] for i in idx]
            t0 = time.perf_counter()
            with seeded(seed):
                run = method_maps(policy, sub, m, None if lname == "-" else convs[lname])
            row = {"method": m, "layer": lname, "baseline": m in BASELINES}
            if run.error:
                row["error"] = run.error
                rows.append(row)
                say(f"{m} @ {lname}: skipped ({run.error})")
                continue
            keep = input_keep_mask(policy, sub[0].frame.shape[:2])
            model = ReadableInputModel(policy)
            sc = []
            for i, s, c in zip(idx, sub, run.maps):
                x = policy.saliency_input(s.frame, s.state_before)
                model.set_frame(x, s.state_before, s.t, keep)
                sc.append(faithfulness_scores(model, x, c, s.action, percentiles, seed=seed * 100003 + int(i)))
            road_by_step[(m, lname)] = dict(zip(idx.tolist(), [d["road"] for d in sc]))
            row.update(steps=len(sub), steps_index=idx.tolist(),
                       road=mean_interval([d["road"] for d in sc]),
                       conf_change=mean_interval([d["conf_change"] for d in sc]),
                       morf={str(p): mean_interval([d["morf"][int(p)] for d in sc]) for p in percentiles},
                       lerf={str(p): mean_interval([d["lerf"][int(p)] for d in sc]) for p in percentiles},
                       empty_share=float(np.mean([float(c.max()) <= 0 for c in run.maps])),
                       ms_per_frame=float(1000 * np.median(run.seconds)),
                       ms_per_frame_mean=float(1000 * np.mean(run.seconds)),
                       road_per_step=[d["road"] for d in sc])
            rows.append(row)
            if partial is not None:  # rows so far, in case the run is cut short (a rerun keeps them)
                write_atomic(partial, json.dumps({"key": key, "rows": rows}, default=json_default),
                             what="partial faithfulness rows")
            say(f"{m} @ {lname}: ROAD {format_interval(row['road'], signed=True)}, "
                f"confidence change {format_interval(row['conf_change'], signed=True)}, "
                f"{row['ms_per_frame']:.1f} ms/frame, {len(sub)} steps, scoring {time.perf_counter() - t0:.0f} s")
    # paired difference against the reference: the paper's Grad-CAM at the last convolution (the live
    # overlay's method until 2026-11-27)
    ref = ("GradCAM", list(convs)[-1])
    if ref in road_by_step:
        for r in rows:
            rk = (r["method"], r["layer"])
            if rk in road_by_step:
                common = sorted(set(road_by_step[rk]) & set(road_by_step[ref]))
                r["road_minus_reference"] = mean_interval([road_by_step[rk][i] - road_by_step[ref][i] for i in common])
    sanity = {}
    if sanity_steps > 0:
        sidx = np.unique(np.linspace(0, len(samples) - 1, int(sanity_steps)).round().astype(int))
        ssub = [samples[i] for i in sidx]
        ran = [r for r in rows if not r.get("error")]
        for lname in (sanity_layers or [list(convs)[-1]]):
            ms = sorted({r["method"] for r in ran if r["layer"] in (lname, "-")} - {"FullGrad"} | (
                {"FullGrad"} if any(r["method"] == "FullGrad" for r in ran) else set()))
            t0 = time.perf_counter()
            sanity[lname] = sanity_check(policy, ssub, ms, lname, seed=seed)
            say(f"sanity check @ {lname}: {len(ssub)} steps, {time.perf_counter() - t0:.0f} s: "
                + ", ".join(f"{m} {'passes' if v['passes'] else 'fails' if v['passes'] is False else 'n/a'}"
                            for m, v in sanity[lname].items()))
            for r in rows:
                if r["method"] in sanity[lname] and r["layer"] in (lname, "-"):
                    r["sanity"] = {k: sanity[lname][r["method"]][k] for k in ("passes", "final_spearman")}
    report = {
        "policy": str(path), "weights_sha256": key["weights_sha256"], "tracks": [int(t) for t in tracks],
        "steps": len(samples), "percentiles": [int(p) for p in percentiles], "seed": int(seed),
        "metric_target": "logit margin of the chosen action (its logit - the largest other)", "cam_target": "logit of the chosen action",
        "sanity_threshold": SANITY_THRESHOLD, "sanity_steps": int(sanity_steps), "tie_break": TIE_BREAK,
        "torch_threads": torch.get_num_threads(), "seconds": time.perf_counter() - t_start,
        "reference": f"{ref[0]} @ {ref[1]}", "rows": rows, "sanity": sanity,
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "faithfulness.json").write_text(json.dumps(report, indent=1, default=json_default) + "\n")
        (out / "faithfulness.md").write_text(markdown_table(report) + "\n" + sanity_markdown(report))
        (out / "faithfulness.partial.json").unlink(missing_ok=True)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agent.drive.faithfulness POLICY --tracks ... --steps N --out DIR``: run :func:`faithfulness_report`."""
    ap = argparse.ArgumentParser(prog="python -m agent.drive.faithfulness", description=__doc__.split("\n\n")[0])
    ap.add_argument("policy", help="policy file or shipped name (nac.pt)")
    ap.add_argument("--tracks", type=int, nargs="+", default=[1_000_000, 1_000_001, 1_000_002])
    ap.add_argument("--steps", type=int, default=300, help="steps scored in all, spread over the tracks")
    ap.add_argument("--methods", nargs="+", default=None, help=f"default: {' '.join(LIBRARY_METHODS + BASELINES)}")
    ap.add_argument("--layers", nargs="+", default=None, help="conv1 conv2 ... (default: every convolution)")
    ap.add_argument("--percentiles", type=int, nargs="+", default=list(DEFAULT_PERCENTILES))
    ap.add_argument("--limit", nargs="+", default=[], metavar="KEY=N",
                    help="score only N steps: METHOD=N, @LAYER=N or METHOD@LAYER=N")
    ap.add_argument("--sanity-steps", type=int, default=20)
    ap.add_argument("--sanity-layers", nargs="+", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="directory for faithfulness.json and faithfulness.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    limits = {k: int(v) for k, v in (s.split("=", 1) for s in args.limit)}
    report = faithfulness_report(args.policy, args.tracks, args.steps, args.methods, args.layers, args.out,
                                 args.percentiles, limits, args.sanity_steps, args.sanity_layers, args.seed,
                                 progress=lambda s: print(s, flush=True))
    print(markdown_table(report))
    print(sanity_markdown(report))
    return 0


__all__ = ["BASELINES", "DEFAULT_PERCENTILES", "LIBRARY_METHODS", "LogitMarginTarget", "MapRun", "ReadableInputModel", "SANITY_THRESHOLD",
           "Sample", "cascade_copies", "collect_samples", "conv_layers", "faithfulness_report", "faithfulness_scores",
           "gradient_at", "input_keep_mask", "make_cam", "markdown_table", "mean_interval", "method_maps",
           "randomisation_groups", "rank_correlation", "road_mask", "sanity_check", "sanity_markdown", "seeded", "sobel_map", "ssim",
           "stream_state", "tie_broken"]

if __name__ == "__main__":
    raise SystemExit(main())
