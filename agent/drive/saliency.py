"""Live CAM saliency on the newest frame: where the CNN looks when the policy decides.

The map is a gradient CAM of the ``grad-cam`` package (pytorch-grad-cam) at one convolution of the
features extractor. The default is **HiResCAM** (Draelos and Carin 2020, "Use HiResCAM instead of
Grad-CAM for faithful explanations of convolutional neural networks") at the **first
convolution** (conv1 of CarRacing's CNN, a 47x47 grid): the element-wise product of the layer's activations and
the gradient of the target, summed over channels. On the shipped CarRacing student it was the most
faithful method measured with ROAD (Rong et al. 2022) that passes the cascading-randomisation
sanity check (Adebayo et al. 2018) and keeps the live window above 50 FPS; Grad-CAM (Selvaraju et
al. 2017) at the last convolution, the earlier default, ranked pixels barely better than their
opposite and gave empty maps on 10 % of the frames (docs/experiments, "saliency faithfulness").
:data:`SALIENCY_METHODS` lists the methods the live loop can run (``drive --saliency-method``,
``--saliency-layer``): those that need one forward and one backward. Targets:

- a discrete policy (CarRacing): the logit of the chosen action (``ClassifierOutputTarget``);
- a steering policy (Udacity): the steering output with both signs, as the library does for
  regression and binary outputs (``BinaryClassifierOutputTarget(1)`` = "steer more to the right",
  ``(0)`` = "steer more to the left"); the overlay shows the map for the side the policy steers to.

The model that Grad-CAM sees (:class:`NewestFrameModel`) takes the newest frame as one
(N, C, H, W) tensor, as the library expects, and returns one tensor, the policy output. The
window's earlier frames enter through the NAC cache of the state the policy was given for this
frame, held fixed, so the CAM is the newest frame's. The paper (arXiv 2512.10282, Figure 6)
shows Grad-CAM maps offline; here they are computed live, once per control step.

An empty map (no pixel with positive evidence, which Grad-CAM's ReLU gives when the weighted
channels cancel) is reported, not drawn as a cold frame: :attr:`SaliencyMap.empty` is set and the
HUD says "no positive evidence for ...".

While the overlay is on, the runner acts through :meth:`SaliencyOverlay.begin`: the forward that
Grad-CAM differentiates is the policy's own step for the frame (``saliency_step``), so a control
step costs one forward and Grad-CAM's backward, not a no-grad step plus a second forward. The
target is then read off that output (:class:`ChosenOutputTarget`). The backward waits in a
:class:`PendingSaliency` until :meth:`SaliencyOverlay.finish`: the runner sends the action first,
so the env steps (in its worker process) while the map is computed. On the 2-core development
machine that is 6.0 ms of CPU per step instead of 8.8 ms for a plain no-grad step (2.1 ms) plus
:meth:`SaliencyOverlay.compute` (6.7 ms), while the action still goes out after the forward
alone (4.0 ms). :meth:`SaliencyOverlay.step` does both halves at once.

The CAM object is built once per run (:class:`SaliencyOverlay`) and its hooks are
released by :meth:`SaliencyOverlay.close` (also a context manager).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
from torch import Tensor, nn

from agent._torchvision_compat import ensure_torchvision

log = logging.getLogger(__name__)

#: The CAM methods the live loop runs, by option name -> pytorch-grad-cam class name. Each needs
#: only the target layer's activations and the target's gradient there (one forward, one backward).
SALIENCY_METHODS = {
    "hirescam": "HiResCAM",
    "layercam": "LayerCAM",
    "gradcam": "GradCAM",
    "gradcam++": "GradCAMPlusPlus",
    "xgradcam": "XGradCAM",
    "gradcam-elementwise": "GradCAMElementWise",
}
#: The live default method (see the module docstring for why).
DEFAULT_METHOD = "hirescam"
#: The live default layer: ``auto`` is the features extractor's first convolution (measured the
#: most faithful for HiResCAM on CarRacing's CNN, ahead of conv2 and conv3; not measured on Udacity's).
DEFAULT_LAYER = "auto"


def conv_layers(policy) -> dict[str, nn.Module]:
    """The convolutions of a policy's features extractor, in forward order: ``{"conv1": ..., "convN": ...}``.

    Raises:
        ValueError: the policy has no features extractor or no convolution in it.
    """
    feats = getattr(policy, "features", None)
    if not isinstance(feats, nn.Module):
        raise ValueError(f"{type(policy).__name__} has no features extractor")
    convs = [m for m in feats.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d))]
    if not convs:
        raise ValueError(f"{type(feats).__name__} has no convolution")
    return {f"conv{i + 1}": m for i, m in enumerate(convs)}


def resolve_saliency_layer(policy, layer: str | None = DEFAULT_LAYER) -> tuple[str, nn.Module]:
    """The convolution a live CAM attributes to: ``(name, module)``.

    Args:
        policy: a policy with a features extractor.
        layer: ``conv1`` .. ``convN`` (:func:`conv_layers`), ``last`` (the last convolution, the
            policy's ``saliency_layer()``), or ``auto``/None (the first).

    A policy whose convolutions cannot be listed (no ``features`` module) but that names its
    saliency layer gets that layer for ``auto`` and ``last``.

    Raises:
        ValueError: no such layer (the message lists the policy's convolutions).
    """
    try:
        convs = conv_layers(policy)
    except ValueError:
        if layer in (None, "auto", "last") and callable(getattr(policy, "saliency_layer", None)):
            return "last", policy.saliency_layer()
        raise
    names = list(convs)
    if layer in (None, "auto"):
        name = names[0]
    elif layer == "last":
        name = names[-1]
    elif layer in convs:
        name = layer
    else:
        raise ValueError(f"saliency layer {layer!r} is not a convolution of this policy; choose one of "
                         f"{', '.join(names)}, 'last' or 'auto' (the first)")
    return name, convs[name]


def check_saliency_method(method: str) -> str:
    """``method`` if the live loop can run it, else ValueError listing :data:`SALIENCY_METHODS`."""
    if method not in SALIENCY_METHODS:
        raise ValueError(f"saliency method {method!r} is not one the live loop runs; choose one of "
                         f"{', '.join(SALIENCY_METHODS)}")
    return method


def saliency_unavailable_reason(policy) -> str | None:
    """Why a CAM cannot run on ``policy``, or None when it can.

    A policy qualifies when it has the saliency hooks of :class:`agent.nn.policy.DrivingPolicy`
    (``saliency_layer``, ``saliency_input``, ``saliency_forward``, ``saliency_region``) and its
    ``saliency_layer()`` is a convolution.
    """
    missing = [m for m in ("saliency_layer", "saliency_input", "saliency_forward", "saliency_region")
               if not callable(getattr(policy, m, None))]
    if missing:
        return f"{type(policy).__name__} has no CNN saliency hooks ({', '.join(missing)})"
    layer = policy.saliency_layer()
    if not isinstance(layer, (nn.Conv2d, nn.Conv3d)):
        return f"{type(policy).__name__} has no convolution layer to attribute to (got {type(layer).__name__})"
    if getattr(policy, "output_kind", None) not in ("discrete", "steering"):
        return f"{type(policy).__name__} has output_kind {getattr(policy, 'output_kind', None)!r}; " \
               "a CAM needs 'discrete' or 'steering'"
    return None


def _expand_state(state, n: int):
    """The state repeated to batch size ``n`` (the CAM batches the two signs of a steering output)."""
    if state is None or n == 1:
        return state
    return state.expand(n)


class NewestFrameModel(nn.Module):
    """What the CAM sees: (N, C, H, W) newest frame -> (N, A) logits or (N, 1) steering.

    Set :attr:`state_before` (and :attr:`t`) to the policy state and timestamp the policy's
    ``step`` was given for this frame before calling; they are read, never changed. With
    :attr:`stepping` set to ``(return_intermediates, raw frame)`` the forward is the policy's own
    step (``saliency_step``): its outputs and new state are kept in :attr:`last_step`, so the
    runner acts on the very forward the CAM differentiates.
    """

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy
        self.state_before = None
        self.t: Tensor | None = None
        self.stepping: tuple[bool, np.ndarray] | None = None
        self.last_step = None

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        t = self.t.reshape(-1)[:1].expand(n) if self.t is not None else None
        if self.stepping is not None:
            want, frame = self.stepping
            self.last_step = self.policy.saliency_step(x, _expand_state(self.state_before, n), t, want, frame)
            return self.last_step[0]
        return self.policy.saliency_forward(x, _expand_state(self.state_before, n), t)


class ChosenOutputTarget:
    """CAM target read off the output itself: the logit of the argmax action (discrete), or
    the steering output signed to the side it steers to (steering: ``+s`` when ``s >= 0``, else
    ``-s``; what ``ClassifierOutputTarget(argmax)`` and ``BinaryClassifierOutputTarget(1 / 0)``
    give once the output is known). Lets one forward both choose the action and be attributed.

    Attributes:
        chosen: after the call, the action index (discrete) or whether it steers right (steering).
    """

    def __init__(self, kind: str):
        self.kind, self.chosen = kind, None

    def __call__(self, model_output: Tensor) -> Tensor:
        """(A,) one row of the model output -> the scalar to attribute."""
        if self.kind == "discrete":
            self.chosen = int(model_output.detach().argmax())
            return model_output[self.chosen]
        s = model_output.reshape(-1)[0]
        self.chosen = bool(s.detach() >= 0)
        return s if self.chosen else -s


@dataclass
class SaliencyMap:
    """One step's saliency, in raw-frame pixels.

    Attributes:
        cam: (H, W) float32 in [0, 1] over the raw frame (0 outside the region the CNN sees).
        target: what was attributed, e.g. "logit of 'left'" or "steering to the right".
        seconds: time the CAM took (forward + backward), in seconds.
        method: the method and layer, e.g. "HiResCAM @ conv1" (what the HUD names).
    """

    cam: np.ndarray
    target: str
    seconds: float
    method: str = "GradCAM"

    @property
    def empty(self) -> bool:
        """No pixel carries positive evidence for the target (the map is all zero)."""
        return not bool(np.any(self.cam > 0))

    def status(self) -> str:
        """The HUD line: the method, and the target, or why the map is empty."""
        if self.empty:
            what = self.target.removeprefix("logit of ")
            return f"{self.method}: no positive evidence for {what} (empty map)"
        return f"{self.method}: {self.target}"


@dataclass
class PendingSaliency:
    """A CAM whose forward has run (the policy acted on its output) and whose backward has not:
    what :meth:`SaliencyOverlay.begin` returns, to be turned into a :class:`SaliencyMap` by
    :meth:`SaliencyOverlay.finish` once the action is on its way. It holds the forward's graph, so
    finish it (or drop it) before the next step.

    Attributes:
        x: (1, C', H', W') the preprocessed frame the forward saw.
        outputs: (1, A) the forward's outputs, still in the graph.
        target: the :class:`ChosenOutputTarget` to attribute (its ``chosen`` is set).
        frame: (H, W, C) the raw frame.
        seconds: time the forward took, in seconds.
    """

    x: Tensor
    outputs: Tensor
    target: "ChosenOutputTarget"
    frame: np.ndarray
    seconds: float


class SaliencyOverlay:
    """A live CAM (HiResCAM at the first convolution by default), built once per run.

    Args:
        policy: a policy with the saliency hooks (see :func:`saliency_unavailable_reason`).
        action_names: names of the discrete actions, for the target label.
        method: a key of :data:`SALIENCY_METHODS`.
        layer: the convolution (:func:`resolve_saliency_layer`: ``conv1`` .. ``convN``, ``last``, ``auto``).

    Attributes:
        grad_leaf: the one parameter that requires a gradient while the overlay is open (the target
            convolution's bias, or its weight when it has none); every other weight is frozen.
        label: the method and layer, e.g. "HiResCAM @ conv1".

    Raises:
        ValueError: the policy cannot be attributed, or an unknown method or layer (the message says why).
    """

    def __init__(self, policy: nn.Module, action_names: tuple[str, ...] = (), method: str = DEFAULT_METHOD,
                 layer: str | None = DEFAULT_LAYER):
        reason = saliency_unavailable_reason(policy)
        if reason:
            raise ValueError(reason)
        check_saliency_method(method)
        layer_name, layer_module = resolve_saliency_layer(policy, layer)

        ensure_torchvision()  # grad-cam imports torchvision; see that module
        import pytorch_grad_cam
        from pytorch_grad_cam.utils import model_targets

        self.policy = policy
        self.kind = policy.output_kind
        self.action_names = tuple(action_names)
        self.model = NewestFrameModel(policy)
        # Only d(target)/d(activations) of the target layer is needed, never weight gradients: freeze
        # the weights for the run (restored by close()) but the target layer's bias, whose gradient
        # is one sum per channel. Its output then requires a gradient (so the library's hook catches
        # it) while nothing below it does: the backward stops at the target layer instead of running
        # through the earlier convolutions to the input, and computes no weight gradient.
        self._requires_grad = {n: p.requires_grad for n, p in policy.named_parameters()}
        policy.requires_grad_(False)
        self.method, self.layer_name = method, layer_name
        self.label = f"{SALIENCY_METHODS[method]} @ {layer_name}"
        self.grad_leaf = layer_module.bias if layer_module.bias is not None else layer_module.weight
        self.grad_leaf.requires_grad_(True)
        cam_class = getattr(pytorch_grad_cam, SALIENCY_METHODS[method])
        self.cam = cam_class(model=self.model, target_layers=[layer_module])
        self._targets = model_targets
        self._both_signs = [model_targets.BinaryClassifierOutputTarget(1), model_targets.BinaryClassifierOutputTarget(0)]
        self.closed = False
        self._readable_cache: dict = {}  # frame (H, W) -> the features extractor's readable-pixel weights

    @property
    def hooks(self) -> list:
        """The hook handles the CAM holds on the target layer (empty once closed)."""
        return self.cam.activations_and_grads.handles

    def discard(self) -> None:
        """Drop activations the hooks caught outside :meth:`compute` (the policy's own steps).

        The hooks fire on every forward through the target layer; the runner calls this on steps
        where the saliency is switched off, so nothing accumulates.
        """
        self.cam.activations_and_grads.clear()

    def compute(self, frame: np.ndarray, state_before, output: Tensor, t: Tensor | None = None) -> SaliencyMap:
        """The CAM of the newest ``frame`` (H, W, C) uint8.

        Args:
            frame: the raw observation the policy acted on.
            state_before: the policy state given to ``step`` for this frame.
            output: what ``step`` returned for it: (1, A) logits or (1, 1) steering; picks the target.
            t: (1,) the frame's timestamp in seconds, if the policy was given one.
        """
        if self.closed:
            raise RuntimeError("this SaliencyOverlay is closed")
        t0 = time.perf_counter()
        x = self.policy.saliency_input(frame, state_before)  # (1, C, h, w); (1, 2C, h, w) with motion
        self.model.state_before, self.model.t = state_before, t
        if self.kind == "discrete":
            a = int(output.reshape(-1).argmax())
            cams = self.cam(input_tensor=x, targets=[self._targets.ClassifierOutputTarget(a)])  # (1, h, w)
            cam, target = cams[0], self._target_label(a)
        else:  # steering: both signs in one batch of two
            right = float(output.reshape(-1)[0]) >= 0
            cams = self.cam(input_tensor=x.expand(2, *x.shape[1:]),
                            targets=self._both_signs)
            cam = cams[0] if right else cams[1]
            target = self._target_label(right)
        self.discard()
        self.model.state_before = self.model.t = None
        return SaliencyMap(self._full_map(frame, cam), target, time.perf_counter() - t0, self.label)

    def step(self, frame: np.ndarray, state_before, t: Tensor | None = None, return_intermediates: bool = False):
        """The policy's step on the newest ``frame`` and its CAM, from one forward.

        What :meth:`compute` gives after a separate ``policy.step``, for the cost of the
        differentiable forward alone (the live runner's path while the overlay is on).

        Args:
            frame: (H, W, C) uint8, the raw observation.
            state_before: the policy state for this frame (None at an episode start); not changed.
            t: (1,) the frame's timestamp in seconds, or None.
            return_intermediates: keep the core's intermediates in the new state (NAC traces).

        Returns:
            (outputs (1, A), new state, :class:`SaliencyMap`): the outputs and state as the policy's
            ``step`` returns them, cut from the graph.

        Raises:
            RuntimeError: the overlay is closed.
            ValueError: the policy has no ``saliency_step`` (use ``policy.step`` and :meth:`compute`).
        """
        outputs, new, pending = self.begin(frame, state_before, t, return_intermediates)
        return outputs, new, self.finish(pending)

    def begin(self, frame: np.ndarray, state_before, t: Tensor | None = None, return_intermediates: bool = False):
        """The first half of :meth:`step`: the policy's step on ``frame`` as the CAM's forward.

        The outputs are final (act on them at once); the map follows from :meth:`finish`, which
        runs the backward. Between the two, nothing else may run through the policy's CNN.

        Args:
            as :meth:`step`.

        Returns:
            (outputs (1, A), new state, :class:`PendingSaliency`): outputs and state cut from the graph.

        Raises:
            RuntimeError: the overlay is closed.
            ValueError: the policy has no ``saliency_step`` (use ``policy.step`` and :meth:`compute`).
        """
        if self.closed:
            raise RuntimeError("this SaliencyOverlay is closed")
        if not callable(getattr(self.policy, "saliency_step", None)):
            raise ValueError(f"{type(self.policy).__name__} has no saliency_step; step it and call compute()")
        t0 = time.perf_counter()
        x = self.policy.saliency_input(frame, state_before)
        m = self.model
        m.state_before, m.t, m.stepping = state_before, t, (return_intermediates, frame)
        target = ChosenOutputTarget(self.kind)
        try:
            graph_outputs = self.cam.activations_and_grads(x)  # the model's forward, with the library's hooks
            outputs, new = m.last_step
            target(graph_outputs[0])  # picks the chosen action (or steering side) off the output
        except BaseException:
            self.discard()
            raise
        finally:
            m.state_before = m.t = m.stepping = m.last_step = None
        pending = PendingSaliency(x, graph_outputs, target, frame, time.perf_counter() - t0)
        return outputs.detach(), new.detached(), pending

    def finish(self, pending: PendingSaliency) -> SaliencyMap:
        """The second half of :meth:`step`: the CAM's backward and map for a :meth:`begin`.

        What the library's ``BaseCAM.forward`` computes after its model's forward (the target's backward,
        then ``compute_cam_per_layer`` and ``aggregate_multi_layers``), on the forward of
        :meth:`begin`.

        Returns:
            the :class:`SaliencyMap`; its ``seconds`` are the forward's and the backward's together.

        Raises:
            RuntimeError: the overlay is closed.
        """
        if self.closed:
            raise RuntimeError("this SaliencyOverlay is closed")
        t0 = time.perf_counter()
        target = pending.target
        try:
            self.grad_leaf.grad = None  # the one parameter with a gradient (model.zero_grad() walks them all)
            target(pending.outputs[0]).backward()
            layers = self.cam.compute_cam_per_layer(pending.x, [target], False)
            cam = self.cam.aggregate_multi_layers(layers)[0]
        finally:
            self.discard()
            pending.outputs = None  # frees the graph
        full = self._full_map(pending.frame, cam)
        return SaliencyMap(full, self._target_label(target.chosen), pending.seconds + time.perf_counter() - t0,
                           self.label)

    def _target_label(self, chosen) -> str:
        """What was attributed: the chosen action index (discrete) or whether it steers right (steering)."""
        if self.kind == "discrete":
            name = self.action_names[chosen] if chosen < len(self.action_names) else str(chosen)
            return f"logit of '{name}'"
        return f"steering to the {'right' if chosen else 'left'}"

    def _full_map(self, frame: np.ndarray, cam) -> np.ndarray:
        """The library's map over the CNN's region -> (H, W) float32 in [0, 1] over the raw frame."""
        full = np.zeros(frame.shape[:2], np.float32)
        top, bottom, left, right_px = self.policy.saliency_region(frame.shape[:2])
        h, w = bottom - top, right_px - left
        cam = np.nan_to_num(np.asarray(cam, np.float32))
        if cam.shape != (h, w):
            import cv2

            cam = cv2.resize(cam, (w, h), interpolation=cv2.INTER_LINEAR)
        full[top:bottom, left:right_px] = np.clip(cam, 0.0, 1.0)
        full *= self._readable(frame.shape[:2])  # no heat on pixels the input blanks (the "speed" dashboard mask)
        return full

    def _readable(self, frame_hw: tuple[int, int]) -> np.ndarray:
        """The features extractor's readable-pixel weights for this frame size (computed once per size)."""
        cache = self._readable_cache
        if frame_hw not in cache:
            readable = getattr(getattr(self.policy, "features", None), "readable", None)
            cache[frame_hw] = readable(frame_hw) if readable is not None else np.float32(1.0)
        return cache[frame_hw]

    def close(self) -> None:
        """Release the CAM's hooks on the policy (idempotent)."""
        if not self.closed:
            self.cam.activations_and_grads.release()
            for n, p in self.policy.named_parameters():
                p.requires_grad_(self._requires_grad.get(n, True))
            self.closed = True

    def __enter__(self) -> "SaliencyOverlay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: Rows of CarRacing's dashboard strip at the bottom of its 96-row frame: gymnasium draws the
#: indicators (speed, ABS, steering, gyroscope) 5/40 of the frame high.
DASHBOARD_ROWS = 12


def bottom_share(cam: np.ndarray, rows: int = DASHBOARD_ROWS) -> float:
    """Fraction of the Grad-CAM mass in the bottom ``rows`` rows (CarRacing's dashboard strip by default).

    Args:
        cam: one map (H, W) or a run of them (S, H, W), non-negative (as :class:`SaliencyMap` and
            ``drive --dump-traces``'s ``cam`` give them). Maps holding NaN (steps where Grad-CAM was
            off) are skipped; a run is pooled: sum over all kept maps of the bottom rows' mass over
            the sum of all their mass.
        rows: how many rows at the bottom, 0..H.

    Returns:
        the share in [0, 1]; NaN when there is no mass (all maps zero, or none kept).

    Raises:
        ValueError: ``cam`` is not 2-D or 3-D, ``rows`` is outside 0..H, or a value is negative.
    """
    c = np.asarray(cam, dtype=np.float64)
    if c.ndim == 2:
        c = c[None]
    if c.ndim != 3:
        raise ValueError(f"cam must be (H, W) or (S, H, W), got shape {np.shape(cam)}")
    h = c.shape[1]
    if not 0 <= int(rows) <= h:
        raise ValueError(f"rows must be in 0..{h} (the map's height), got {rows}")
    c = c[np.isfinite(c).all(axis=(1, 2))]
    if (c < 0).any():
        raise ValueError("cam has negative values; Grad-CAM maps are >= 0")
    total = c.sum()
    if total <= 0:
        return float("nan")
    return float(c[:, h - int(rows):].sum() / total)


def blend_heatmap(frame: np.ndarray, cam: np.ndarray, opacity: float) -> np.ndarray:
    """The frame with a saliency map blended in.

    Colours follow the JET map of ``pytorch_grad_cam.utils.image.show_cam_on_image``; the weight
    of the heat colour at a pixel is ``opacity * cam`` there, so the road stays visible where the
    CNN does not look (the library blends one weight everywhere).

    Args:
        frame: (H, W, 3) uint8 RGB.
        cam: (H, W) float in [0, 1] (resized if its size differs).
        opacity: 0 (the frame unchanged) .. 1.

    Returns:
        (H, W, 3) uint8, a new array.
    """
    import cv2

    h, w = frame.shape[:2]
    cam = np.asarray(cam, np.float32)
    if cam.shape != (h, w):
        cam = cv2.resize(cam, (w, h), interpolation=cv2.INTER_LINEAR)
    c8 = np.clip(cam * 255.0, 0, 255).astype(np.uint8)
    heat = cv2.cvtColor(cv2.applyColorMap(c8, cv2.COLORMAP_JET), cv2.COLOR_BGR2RGB).astype(np.float32)
    a = (np.clip(cam, 0.0, 1.0) * float(np.clip(opacity, 0.0, 1.0)))[..., None]
    out = frame[..., :3].astype(np.float32) * (1.0 - a) + heat * a
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


__all__ = ["DASHBOARD_ROWS", "DEFAULT_LAYER", "DEFAULT_METHOD", "SALIENCY_METHODS", "ChosenOutputTarget", "NewestFrameModel",
           "SaliencyMap", "SaliencyOverlay", "blend_heatmap", "bottom_share", "check_saliency_method", "conv_layers",
           "resolve_saliency_layer", "saliency_unavailable_reason"]
