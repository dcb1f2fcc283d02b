"""The driving policy: a features extractor, then a temporal core, then an action head.

One class serves both simulators (docs/design.md section 2; stable-baselines3's
``common/policies.py`` for the split and for saving the constructor arguments beside the state
dict). Shapes: B batch, T window (frames), H x W x C a raw frame, F features, d the core width,
A the head's outputs.

    frames (B, T, H, W, C) --features--> (B, T, F) --core--> (B, T, d) --head--> (B, T, A)

- CarRacing (the defaults of :func:`default_config` ``("carracing")``): the paper's CNN on
  96x96x3 frames, NAC-Steady (d 64, 16 heads, top-k 8, sparsity 0.5) over T = 4 frames at
  0.02 s, dense 64 (ReLU) and the five action logits (arXiv 2512.10282, Appendix D). Two
  departures from the paper's input, chosen by closed-loop return on held-out training tracks
  (README, "What the student looks at"): the dashboard's indicators are blanked except the
  speed bar (``dashboard="speed"``: no causal-confusion shortcut through the car's own controls),
  and the CNN also reads the difference from the previous frame (``motion=True``).
- CarRacing's continuous configuration (``default_config("carracing", continuous=True)``): the
  same, with two outputs, steering and throttle in [-1, 1] (a Box head, MSE), for the env of
  ``envs.carracing.make_carracing(continuous=True)``.
- Udacity (``default_config("udacity")``): PilotNet on 66x200 YUV crops, NAC-Exact (d 100,
  20 heads, top-k 8) over T = 8 frames with their capture times, dense 64 (ELU) and one
  normalised steering output in [-1, 1] (Appendix D.3.3).

Any core of :mod:`agent.nn.cores` can replace the NAC (``core="lstm"``, ...).

Acting: ``step`` is the streaming call (one features forward and one core step per frame);
``predict`` is stable-baselines3's batched call and resets only the rows whose ``episode_start``
is True. Grad-CAM hooks: ``saliency_layer``, ``saliency_input``, ``saliency_forward``,
``saliency_region``. Files: ``save`` / ``load`` (``torch.load(weights_only=True)``; one file
rebuilds the policy).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from agent.atomic import write_atomic
from agent.bounded import check_zip_sizes
from agent.nn.cores import CORES, TemporalCore, make_core
from agent.nn.features import CarRacingCNN, FeaturesExtractor, make_features
from agent.nn.heads import ActionHead, head_for, space_from_dict
from agent.nn.nac import masks_from_state_dict

#: The ``kind`` stored in every policy file of this project, and its format version.
FILE_KIND = "nac-drive-policy"
FORMAT_VERSION = 2
#: what CarRacing's discrete actions do (1 turns right, 2 left: gymnasium issue #1369; envs.carracing.ACTION_NAMES)
CARRACING_ACTIONS = ("nothing", "right", "left", "gas", "brake")
#: the names files made before that was found carry (gymnasium's documentation); renamed on load
_DOCUMENTED_CARRACING_ACTIONS = ("nothing", "left", "right", "gas", "brake")
#: the outputs of a policy for CarRacing's continuous configuration (``envs.carracing.ThrottleAction``)
CARRACING_CONTROLS = ("steering", "throttle")
#: its action space, as :func:`agent.nn.heads.space_to_dict` describes it: Box(-1, 1, (2,))
CARRACING_CONTINUOUS_SPACE = {"type": "box", "low": [-1.0, -1.0], "high": [1.0, 1.0]}

# Limits on what a policy config may ask for, checked before any module is built (:meth:`PolicyConfig.__post_init__`,
# :func:`check_config_size`). A policy file is input like any other: a crafted config with obs_shape 100000x100000 once
# made the CNN's dry run allocate without bound and escape as a MemoryError (issue 38, "Nothing lost", item 4). Each
# limit is far above what the project's policies use.
#: pixels, the most of each side H and W of ``obs_shape`` (CarRacing 96x96, Udacity 160x320)
MAX_OBS_SIDE = 1024
#: the most channels C of ``obs_shape`` (RGB 3, RGBA 4)
MAX_OBS_CHANNELS = 4
#: frames, the most ``window`` T (the paper's policies use 4 and 8; 256 is 17 s at Udacity's 15 Hz)
MAX_WINDOW = 256
#: the most of ``d_model``, ``head_hidden``, the action outputs, and every integer option of ``features_kwargs`` and
#: ``core_kwargs`` but ``seed`` (channels, num_heads, backbone_units, euler_steps, ...); the policies use 64-100
MAX_WIDTH = 4096
#: the most parameters and buffers (elements: 400 MB as float32) a config may build, as :func:`config_size` bounds
#: them; the shipped policies hold about 1 M
MAX_PARAMETERS = 100_000_000
#: bytes, the most a ``.pt`` policy file's zip records may declare in all (the weights of :data:`MAX_PARAMETERS`
#: float32 parameters, and as much again for buffers and metadata); the shipped files hold 2.3-2.6 MB
MAX_POLICY_FILE_BYTES = 800 * 2**20
#: the most records in a ``.pt`` policy file (``torch.save`` writes one per tensor and a few more; the shipped: 42-46)
MAX_POLICY_FILE_RECORDS = 10_000
#: the most elements the features extractor's layers may output for one frame (256 MB as float32), as its dry run on
#: the ``meta`` device measures them; CarRacing's CNN outputs about 0.05 M, PilotNet about 0.2 M
MAX_FRAME_ACTIVATIONS = 64 * 2**20


@dataclass
class PolicyConfig:
    """Everything needed to rebuild a :class:`DrivingPolicy` (stored in the policy file).

    Attributes:
        env: the simulator the policy drives ("carracing" or "udacity").
        obs_shape: (H, W, C) of the raw frames.
        action_space: a JSON description of the env's action space
            (:func:`agent.nn.heads.space_to_dict`): ``{"type": "discrete", "n": 5}`` or
            ``{"type": "box", "low": [-1.0], "high": [1.0]}``.
        action_names: a name per discrete action, or per output of a Box.
        features, features_kwargs: the features extractor (:data:`agent.nn.features.FEATURES`).
        core, core_kwargs: the temporal core (:data:`agent.nn.cores.CORES`).
        d_model: d, the core's output width.
        window: T, frames the core sees (the newest included).
        frame_dt: seconds between frames when no timestamps are given (CarRacing: 0.02).
        head_hidden, head_activation: the action head's dense layer.
        seed: seed of the weights' initialisation (and of NAC's wirings).
    """

    env: str = "carracing"
    obs_shape: tuple[int, ...] = (96, 96, 3)
    action_space: dict = field(default_factory=lambda: {"type": "discrete", "n": 5})
    action_names: tuple[str, ...] = CARRACING_ACTIONS
    features: str = "carracing-cnn"
    features_kwargs: dict = field(default_factory=lambda: {"dropout": 0.2})
    core: str = "nac-steady"
    core_kwargs: dict = field(default_factory=dict)
    d_model: int = 64
    window: int = 4
    frame_dt: float = 0.02
    head_hidden: int = 64
    head_activation: str = "relu"
    seed: int = 22222

    def __post_init__(self):
        self.obs_shape = tuple(int(s) for s in self.obs_shape)
        self.action_names = tuple(self.action_names)
        if self.env == "carracing" and self.action_names == _DOCUMENTED_CARRACING_ACTIONS:
            self.action_names = CARRACING_ACTIONS  # same actions, named by what they do
        self.features_kwargs, self.core_kwargs = dict(self.features_kwargs), dict(self.core_kwargs)
        self._check_bounds()
        if self.window < 1:
            raise ValueError(f"window must be >= 1 frame, got {self.window}")
        if self.frame_dt <= 0:
            raise ValueError(f"frame_dt must be > 0 seconds, got {self.frame_dt}")
        if self.core not in CORES:
            raise ValueError(f"unknown core {self.core!r}; choose one of {', '.join(CORES)}")
        space = space_from_dict(self.action_space)
        n = int(space.n) if self.action_space["type"] == "discrete" else int(np.prod(space.shape))
        if n > MAX_WIDTH:
            raise ValueError(f"policy config action_space has {n:,} actions/outputs, above the limit of {MAX_WIDTH:,} "
                             "(agent.nn.policy.MAX_WIDTH): not a policy this project builds")
        if len(self.action_names) != n:
            raise ValueError(f"action_names must name each of the {n} actions/outputs, got {self.action_names}")

    def _check_bounds(self) -> None:
        """Refuse sizes above the limits (:data:`MAX_OBS_SIDE`, :data:`MAX_OBS_CHANNELS`, :data:`MAX_WINDOW`,
        :data:`MAX_WIDTH`) before anything is built: ValueError naming the field, its value and the limit."""
        def refuse(name, value, limit, what):
            raise ValueError(f"policy config {name} {value!r} is above the limit of {limit:,} {what}: not a policy "
                             f"this project builds (a corrupt or crafted config?)")

        if len(self.obs_shape) != 3:
            raise ValueError(f"policy config obs_shape must be (H, W, C), got {self.obs_shape}")
        for side, value in zip(("H", "W"), self.obs_shape[:2]):
            if value > MAX_OBS_SIDE:
                refuse(f"obs_shape {side}", value, MAX_OBS_SIDE, "pixels (agent.nn.policy.MAX_OBS_SIDE)")
        if self.obs_shape[2] > MAX_OBS_CHANNELS:
            refuse("obs_shape C", self.obs_shape[2], MAX_OBS_CHANNELS, "channels (agent.nn.policy.MAX_OBS_CHANNELS)")
        if not all(v >= 1 for v in self.obs_shape):
            raise ValueError(f"policy config obs_shape sides must be >= 1, got {self.obs_shape}")
        for name in ("window", "d_model", "head_hidden"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise ValueError(f"policy config {name} must be an integer, got {value!r}")
            limit = MAX_WINDOW if name == "window" else MAX_WIDTH
            if value > limit:
                refuse(name, value, limit, "frames (agent.nn.policy.MAX_WINDOW)" if name == "window" else
                       "(agent.nn.policy.MAX_WIDTH)")
        for group in ("features_kwargs", "core_kwargs"):
            for key, value in getattr(self, group).items():
                if key == "seed":
                    continue
                for v in (value if isinstance(value, (list, tuple)) else [value]):
                    if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > MAX_WIDTH:
                        refuse(f"{group}.{key}", value, MAX_WIDTH, "(agent.nn.policy.MAX_WIDTH)")

    def to_dict(self) -> dict:
        """JSON-able dict (tuples as lists), what the policy file stores."""
        return json_ready(asdict(self))


def json_ready(obj):
    """``obj`` with tuples turned into lists, recursively (policy files hold plain containers)."""
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    return obj


def default_core_kwargs(env: str, core: str) -> dict:
    """The core options each simulator's policy uses by default (the NAC settings of the paper)."""
    if core.startswith("nac-"):
        heads = 20 if env == "udacity" else 16
        return {"num_heads": heads, "topk": 8, "sparsity": 0.5}
    if core == "torch-nac":
        return {"num_heads": 20 if env == "udacity" else 16, "topk": 8}
    return {}


def default_config(env: str = "carracing", core: str | None = None, continuous: bool = False,
                   **overrides) -> PolicyConfig:
    """The policy configuration of a simulator, with ``overrides`` applied.

    Args:
        env: "carracing" or "udacity".
        core: a :data:`agent.nn.cores.CORES` name (default: nac-steady for CarRacing, nac-exact
            for Udacity); its default options come from :func:`default_core_kwargs` unless
            ``core_kwargs`` is overridden.
        continuous: CarRacing's continuous configuration: the action head is a Box(-1, 1, (2,))
            regression head (MSE) named ("steering", "throttle") instead of the five action logits;
            everything else is unchanged.

    Raises:
        ValueError: an unknown env, core, or field; ``continuous`` for another env than carracing.
    """
    if continuous and env != "carracing":
        raise ValueError(f"continuous=True is CarRacing's continuous configuration; {env!r} has its own action space")
    if env == "carracing":
        base = dict(env="carracing", obs_shape=(96, 96, 3), action_space={"type": "discrete", "n": 5},
                    action_names=CARRACING_ACTIONS, features="carracing-cnn",
                    features_kwargs={"dropout": 0.2, "dashboard": "speed", "motion": True},
                    core=core or "nac-steady", d_model=64, window=4, frame_dt=0.02, head_hidden=64,
                    head_activation="relu")
        if continuous:
            base.update(action_space=dict(CARRACING_CONTINUOUS_SPACE), action_names=CARRACING_CONTROLS)
    elif env == "udacity":
        base = dict(env="udacity", obs_shape=(160, 320, 3), action_space={"type": "box", "low": [-1.0], "high": [1.0]},
                    action_names=("steering",), features="pilotnet", features_kwargs={"dropout": 0.5},
                    core=core or "nac-exact", d_model=100, window=8, frame_dt=0.07, head_hidden=64,
                    head_activation="elu")
    else:
        raise ValueError(f"unknown env {env!r}; choose carracing or udacity")
    base["core_kwargs"] = default_core_kwargs(env, base["core"])
    unknown = set(overrides) - {f.name for f in dataclasses.fields(PolicyConfig)}
    if unknown:
        raise ValueError(f"unknown policy option(s) {', '.join(sorted(unknown))}")
    base.update(overrides)
    return PolicyConfig(**base)


def config_size(config: PolicyConfig) -> dict:
    """Upper bounds of what building ``config`` allocates, computed before building it.

    The features extractor, the part ``obs_shape`` and ``features_kwargs`` size, is built on
    PyTorch's ``meta`` device (shapes without storage; ``torch.device("meta")``), so its parameters
    are counted exactly and its dry run measures the elements its layers output for one frame
    without allocating them. The core is not built: some cores check their masks' values while
    they are built, which a meta tensor cannot answer. Its parameters and buffers are bounded by
    ``8 (F + d + U) (d + U) L`` with F the features, d ``d_model``, U the largest integer option
    of ``core_kwargs`` (at least 64, the cores' default widths) and L ``backbone_layers`` (1): every
    core of :data:`agent.nn.cores.CORES` is at most a few (F + d) x d input maps and U x U
    layers (the NAC's three gates with their masks, 6 F d; an LSTM's four gates, 4 (F + d) d).
    The head is counted exactly.

    Returns:
        ``{"features": int, "core": int, "head": int, "parameters": int, "frame_activations": int}``:
        elements of parameters and buffers of each part (the core's an upper bound), their sum, and
        the elements the features extractor's layers output for one frame.

    Raises:
        ValueError: a config whose features extractor cannot be built (as :class:`DrivingPolicy`).
    """
    cfg = config
    activations = [0]

    def count(module, inputs, output):  # leaf modules only: a container's output is its last layer's
        if isinstance(output, Tensor) and next(module.children(), None) is None:
            activations[0] += output.numel()

    hook = torch.nn.modules.module.register_module_forward_hook(count)
    try:
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            features = make_features(cfg.features, obs_shape=cfg.obs_shape, **cfg.features_kwargs)
    finally:
        hook.remove()
    n_features = sum(t.numel() for t in features.parameters()) + sum(t.numel() for t in features.buffers())
    sizes = [v for k, v in cfg.core_kwargs.items() if k != "seed" and isinstance(v, (int, np.integer))
             and not isinstance(v, bool)]
    u = max([64, *sizes])
    layers = max(1, int(cfg.core_kwargs.get("backbone_layers", 1) or 1))
    f, d, h = int(features.features_dim), int(cfg.d_model), int(cfg.head_hidden)
    n_core = 8 * (f + d + u) * (d + u) * layers
    space = space_from_dict(cfg.action_space)
    outputs = int(space.n) if cfg.action_space["type"] == "discrete" else int(np.prod(space.shape))
    n_head = (d + 1) * h + (h + 1) * outputs
    return {"features": n_features, "core": n_core, "head": n_head, "parameters": n_features + n_core + n_head,
            "frame_activations": activations[0]}


def check_config_size(config: PolicyConfig, max_parameters: int = MAX_PARAMETERS,
                      max_frame_activations: int = MAX_FRAME_ACTIVATIONS) -> dict:
    """Refuse a config that would allocate more than the limits, before any real module is built.

    Args:
        config: the policy config (its field limits are checked when it is made).
        max_parameters: the most parameters and buffers, in elements (:data:`MAX_PARAMETERS`).
        max_frame_activations: the most elements the features extractor may output for one frame
            (:data:`MAX_FRAME_ACTIVATIONS`).

    Returns:
        :func:`config_size`'s bounds.

    Raises:
        ValueError: a bound above its limit (the message names the part, its size and the
            limit), or a config that cannot be built.
    """
    size = config_size(config)
    if size["parameters"] > max_parameters:
        part = max(("features", "core", "head"), key=size.get)
        raise ValueError(f"policy config would build up to {size['parameters']:,} parameters (limit "
                         f"{max_parameters:,}, agent.nn.policy.MAX_PARAMETERS; the largest part, the {part}, "
                         f"{size[part]:,}: obs_shape {config.obs_shape}, d_model {config.d_model}, features_kwargs "
                         f"{config.features_kwargs}, core_kwargs {config.core_kwargs}); refused before building it")
    if size["frame_activations"] > max_frame_activations:
        raise ValueError(f"policy config's features extractor would output {size['frame_activations']:,} elements "
                         f"per frame (limit {max_frame_activations:,}, agent.nn.policy.MAX_FRAME_ACTIVATIONS; "
                         f"obs_shape {config.obs_shape}, features_kwargs {config.features_kwargs}); refused before "
                         "building it")
    return size


@dataclass
class PolicyState:
    """Streaming state of a batch of B rollouts.

    Attributes:
        core: the core's state (:class:`agent.nn.nac.NACCache` or :class:`agent.nn.cores.WindowState`),
            None before the first frame.
        steps: (B,) int64, frames seen since each row's episode start.
        last: the newest step's ``output`` (B, A) and, when asked for, ``intermediates``
            (for the runner's HUD and traces).
        frame: (B, H, W, C) the newest raw frames, kept when the features extractor reads the
            previous frame (``motion``); None otherwise.
    """

    core: object = None
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last: dict = field(default_factory=dict)
    frame: Tensor | None = None

    def expand(self, n: int) -> "PolicyState":
        """This one-row state repeated to ``n`` rows (Grad-CAM batches targets); tensors are views."""
        def rep(x):
            return x.expand(n, *x.shape[1:]) if isinstance(x, Tensor) else x

        core = None if self.core is None else dataclasses.replace(
            self.core, **{f.name: rep(getattr(self.core, f.name)) for f in dataclasses.fields(self.core)})
        return PolicyState(core, np.repeat(self.steps[:1], n), {}, rep(self.frame))

    def detached(self) -> "PolicyState":
        """This state with every tensor (core state, ``last`` outputs and intermediates, frame) cut
        from the autograd graph: what :meth:`DrivingPolicy.saliency_step` returns is carried to the
        next step only this way, so one step's graph never reaches the next."""
        return PolicyState(detach_tree(self.core), self.steps, detach_tree(self.last), detach_tree(self.frame))


def detach_tree(x):
    """``x`` with every tensor detached, through dataclasses, dicts, lists and tuples (the rest as is)."""
    if isinstance(x, Tensor):
        return x.detach()
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: detach_tree(getattr(x, f.name)) for f in dataclasses.fields(x)
                                         if f.init})
    if isinstance(x, dict):
        return {k: detach_tree(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(detach_tree(v) for v in x)
    return x


class DrivingPolicy(nn.Module):
    """Features extractor + temporal core + action head; trained by behaviour cloning.

    Args:
        config: a :class:`PolicyConfig` (default: :func:`default_config` ``("carracing")``).

    Attributes:
        features (:class:`agent.nn.features.FeaturesExtractor`), core
        (:class:`agent.nn.cores.TemporalCore`), head (:class:`agent.nn.heads.ActionHead`),
        action_space, metadata (what the file stored beside the weights).

    Raises:
        ValueError: a config that does not fit together (e.g. frames too small for the CNN), or
            one that would allocate more than :data:`MAX_PARAMETERS` parameters or
            :data:`MAX_FRAME_ACTIVATIONS` per frame (:func:`check_config_size`, before building).
    """

    def __init__(self, config: PolicyConfig | None = None, **overrides):
        super().__init__()
        self.config = config or default_config(**overrides)
        cfg = self.config
        check_config_size(cfg)  # before anything is allocated
        with torch.random.fork_rng(devices=[]):  # seeded initialisation, the global RNG left as it was
            torch.manual_seed(cfg.seed)
            self.features: FeaturesExtractor = make_features(cfg.features, obs_shape=cfg.obs_shape,
                                                             **cfg.features_kwargs)
            core_kwargs = dict(cfg.core_kwargs)
            if cfg.core.startswith("nac-"):
                core_kwargs.setdefault("seed", cfg.seed)
            self.core: TemporalCore = make_core(cfg.core, self.features.features_dim, cfg.d_model, cfg.window,
                                                cfg.frame_dt, **core_kwargs)
            self.head: ActionHead = head_for(space_from_dict(cfg.action_space), cfg.d_model, cfg.head_hidden,
                                             cfg.head_activation)
        self.action_space = space_from_dict(cfg.action_space)
        self.metadata: dict = {}

    # ------------------------------------------------------------------ properties
    @property
    def output_kind(self) -> str:
        """"discrete" (action logits), "steering" (one continuous output) or "continuous"."""
        if self.head.kind == "discrete":
            return "discrete"
        return "steering" if self.head.out_dim == 1 else "continuous"

    @property
    def nac(self):
        """The NAC layer of a NAC core (for traces and the wiring picture), else None."""
        return getattr(self.core, "nac", None)

    @property
    def device(self) -> torch.device:
        """The device the weights are on."""
        return next(self.parameters()).device

    # ------------------------------------------------------------------ training
    def forward(self, obs, t: Tensor | None = None, mask: Tensor | None = None, return_intermediates: bool = False,
                prev=None):
        """Outputs for every position of frame windows (causal cores: position i sees frames <= i).

        Args:
            obs: (B, T, H, W, C) frames, raw or as the features extractor's ``preprocess`` also
                accepts them (PilotNet: (B, T, 66, 200, 3) preprocessed YUV); a Tensor or an array.
            t: (B, T) frame times in seconds (only differences matter), or None: position * frame_dt.
            mask: (B, T) bool, True = a real frame (False = padding).
            return_intermediates: also return the core's intermediates (NAC cores; None otherwise).
            prev: (B, H, W, C) the frame before each window's first one, for a features extractor
                with motion channels (``features.uses_previous``); None: each window starts its
                episode (its first frame is its own previous one). Ignored otherwise.

        Returns:
            (B, T, A) logits or continuous outputs (not clipped), or (outputs, intermediates).
        """
        B, T = obs.shape[:2]
        if self.features.uses_previous:
            obs = torch.as_tensor(obs)
            first = obs[:, 0] if prev is None else torch.as_tensor(prev).to(obs.device, obs.dtype)
            before = torch.cat([first[:, None], obs[:, :-1]], dim=1)  # (B, T, H, W, C): frame i-1 at position i
            x = self.features.preprocess(obs.reshape(B * T, *obs.shape[2:]),
                                         before.reshape(B * T, *obs.shape[2:]))  # (B*T, 2C, H', W')
        else:
            x = self.features.preprocess(obs.reshape(B * T, *obs.shape[2:]))  # (B*T, C', H', W')
        # x is this call's own: the extractor may blank it in place
        feats = self.features.from_preprocessed(x, scratch=True).view(B, T, -1)  # (B, T, F)
        if t is not None:
            t = torch.as_tensor(t, device=feats.device)
        if mask is not None:
            mask = torch.as_tensor(mask, device=feats.device)
        out = self.core(feats, t, mask, return_intermediates=return_intermediates)
        y, inter = out if return_intermediates else (out, None)
        outputs = self.head(y)  # (B, T, A)
        return (outputs, inter) if return_intermediates else outputs

    # ------------------------------------------------------------------ acting
    def _times(self, t, B: int) -> Tensor | None:
        if t is None:
            return None
        t = torch.as_tensor(t, dtype=torch.float64, device=self.device).reshape(-1)
        if t.numel() == 1 and B > 1:
            t = t.expand(B)
        if t.numel() != B:
            raise ValueError(f"t must hold one time per frame ({B}), got {t.numel()}")
        return t

    def _core_step(self, feats: Tensor, state: PolicyState | None, t, return_intermediates: bool):
        """Core step and head on (B, F) features -> (outputs (B, A), new PolicyState)."""
        B = feats.shape[0]
        state = state if state is not None else PolicyState(None, np.zeros(B, np.int64))
        out = self.core.step(feats, state.core, t=self._times(t, B), return_intermediates=return_intermediates)
        outputs = self.head(out[0])  # (B, A)
        new = PolicyState(out[1], state.steps + 1 if len(state.steps) == B else np.ones(B, np.int64),
                          {"output": outputs})
        if self.head.kind == "discrete":
            new.last["logits"] = outputs
        if return_intermediates:
            new.last["intermediates"] = out[2]
        return outputs, new

    @torch.no_grad()
    def step(self, obs, state: PolicyState | None = None, return_intermediates: bool = False,
             t=None) -> tuple[Tensor, PolicyState]:
        """One control step for a batch of newest frames (call in eval mode).

        Args:
            obs: (B, H, W, C) newest frames (array or tensor).
            state: the previous step's state (None at the start of the episodes).
            return_intermediates: keep the core's intermediates in ``state.last["intermediates"]``.
            t: (B,) frame times in seconds (any origin; float64 kept), or None: one ``frame_dt``
                after the previous frame. Give times on every step of a drive or on none.

        Returns:
            (outputs (B, A): logits, or continuous outputs clipped to the action box; new state).
        """
        if self.features.uses_previous:
            frames = torch.as_tensor(np.ascontiguousarray(obs) if not isinstance(obs, Tensor) else obs)
            feats = self.features(frames, self._previous_frames(frames, state))  # (B, F)
        else:
            feats = self.features(obs)  # (B, F)
        outputs, new = self._acted(*self._core_step(feats, state, t, return_intermediates))
        if self.features.uses_previous:
            new.frame = frames.clone()  # a copy: the caller may reuse its observation buffer
        return outputs, new

    def _acted(self, outputs: Tensor, new: PolicyState) -> tuple[Tensor, PolicyState]:
        """The head's raw (B, A) outputs as :meth:`step` returns them: logits as they are, continuous
        outputs clipped to the action box (also kept as the new state's ``last["output"]``)."""
        if self.head.kind != "discrete":
            outputs = self.head.act(outputs)
            new.last["output"] = outputs
        return outputs, new

    def _previous_frames(self, frames: Tensor, state: PolicyState | None) -> Tensor | None:
        """(B, H, W, C) the frames one step before ``frames``: the state's newest ones, or the
        frame itself on a row that starts its episode (no motion); None when every row starts."""
        if state is None or state.frame is None or len(state.steps) != len(frames):
            return None
        fresh = torch.as_tensor(state.steps == 0, device=frames.device)  # rows restarted by reset_rows
        prev = state.frame.to(frames.device)
        return torch.where(fresh.view(-1, *([1] * (frames.dim() - 1))), frames, prev) if fresh.any() else prev

    def act(self, outputs: Tensor, deterministic: bool = True) -> np.ndarray:
        """(B, A) outputs of :meth:`step` -> (B,) int64 actions or (B, A) float32 actions."""
        a = self.head.act(outputs, deterministic).cpu().numpy()
        return a.astype(np.int64) if self.head.kind == "discrete" else a.astype(np.float32)

    def reset_rows(self, state: PolicyState | None, episode_start) -> PolicyState | None:
        """``state`` with the rows where ``episode_start`` (B,) is True restarted."""
        if state is None or episode_start is None:
            return state
        rows = np.asarray(episode_start, bool).reshape(-1)
        if not rows.any():
            return state
        if rows.all():
            return None
        steps = state.steps.copy()
        steps[rows] = 0
        return PolicyState(self.core.reset_rows(state.core, torch.as_tensor(rows, device=self.device)), steps, {},
                           state.frame)

    def predict(self, obs, state: PolicyState | None = None, episode_start=None, deterministic: bool = True,
                t=None):
        """stable-baselines3-style batched acting.

        Args:
            obs: one frame (H, W, C) or a batch (B, H, W, C), uint8.
            state: the previous call's state (None at the start).
            episode_start: (B,) bool; the rows where it is True start a new episode (their window
                is emptied; the other rows keep theirs), as SB3's recurrent policies do.
            deterministic: argmax action (discrete); otherwise sample from the softmax.
            t: frame time(s) in seconds, as in :meth:`step`.

        Returns:
            (action, state): for one frame an int (discrete) or a float / (A,) array
            (continuous); for a batch a (B,) int64 or (B, A) float32 array (a 1-D Box: (B,)).

        Raises:
            ValueError: frames of another shape than the policy's observation shape.
        """
        obs = np.asarray(obs)
        single = obs.ndim == len(self.config.obs_shape)
        batch = obs[None] if single else obs
        if tuple(batch.shape[1:]) != self.config.obs_shape:
            raise ValueError(f"this policy takes frames of shape {self.config.obs_shape}, got {tuple(batch.shape[1:])}")
        state = self.reset_rows(state, episode_start)
        if state is not None and len(state.steps) != len(batch):
            raise ValueError(f"the state holds {len(state.steps)} rows but {len(batch)} frames were given; "
                             "pass state=None (or episode_start all True) when the batch size changes")
        was_training = self.training
        self.eval()
        outputs, state = self.step(batch, state, t=t)
        self.train(was_training)
        action = self.act(outputs, deterministic)
        if self.head.kind != "discrete" and action.shape[-1] == 1:
            action = action[:, 0]
        if single:
            return (int(action[0]) if self.head.kind == "discrete" else
                    (float(action[0]) if action.ndim == 1 else action[0])), state
        return action, state

    # ------------------------------------------------------------------ saliency (Grad-CAM)
    def saliency_layer(self) -> nn.Module:
        """The features extractor's last convolution: Grad-CAM's target layer."""
        return self.features.last_conv

    def saliency_input(self, frame: np.ndarray, state_before: PolicyState | None = None) -> Tensor:
        """One raw frame (H, W, C) uint8 -> (1, C', H', W') float, exactly what the first convolution sees.

        ``state_before`` (the state :meth:`step` was given for this frame) supplies the previous
        frame of a features extractor with motion channels; it is not changed.

        Raises:
            ValueError: a frame of another shape than the policy's observation shape.
        """
        frame = np.asarray(frame)
        if tuple(frame.shape) != self.config.obs_shape:
            raise ValueError(f"frame must be {self.config.obs_shape}, got {tuple(frame.shape)}")
        if self.features.uses_previous:
            frames = torch.from_numpy(np.ascontiguousarray(frame[None]))
            prev = self._previous_frames(frames, state_before)
            return self.features.preprocess(frames, None if prev is None else prev[:1])
        return self.features.preprocess(frame[None])

    def saliency_forward(self, x: Tensor, state_before: PolicyState | None = None, t=None) -> Tensor:
        """Differentiable twin of :meth:`step` for Grad-CAM, run in eval mode.

        Args:
            x: (N, C', H', W') preprocessed newest frame(s) (:meth:`saliency_input`).
            state_before: the state :meth:`step` was given for this frame (N rows, or None); not changed.
            t: (N,) the frame's time in seconds, or None.

        Returns:
            (N, A): the logits, or the clipped continuous output, that :meth:`step` returns.
        """
        return self._differentiable_step(x, state_before, t, False)[0]

    def saliency_step(self, x: Tensor, state_before: PolicyState | None = None, t=None,
                      return_intermediates: bool = False, frame: np.ndarray | None = None
                      ) -> tuple[Tensor, PolicyState]:
        """:meth:`step` with the autograd graph kept: one forward serves the action and Grad-CAM.

        The live runner acts through this when the saliency overlay is on, so a step costs one
        forward (plus Grad-CAM's backward) instead of a no-grad step and a second, differentiable
        forward. It computes what :meth:`step` computes (same outputs, same new state).

        Args:
            x: (N, C', H', W') preprocessed newest frame(s) (:meth:`saliency_input`).
            state_before: the state for this frame (N rows, or None); not changed.
            t: (N,) the frame's time in seconds, or None.
            return_intermediates: keep the core's intermediates in the new state's ``last``.
            frame: (H, W, C) the raw newest frame, kept as the new state's ``frame`` when the
                features extractor reads the previous frame (``motion``); ignored otherwise.

        Returns:
            (outputs (N, A) as :meth:`saliency_forward`, new state). Both still hold the graph:
            call :meth:`PolicyState.detached` on the state before the next step.

        Raises:
            ValueError: a motion policy given no ``frame``.
        """
        if self.features.uses_previous and frame is None:
            raise ValueError("this policy reads the previous frame (motion): pass the raw frame as frame=")
        outputs, new = self._differentiable_step(x, state_before, t, return_intermediates)
        if self.features.uses_previous:
            new.frame = torch.from_numpy(np.array(frame, dtype=np.uint8)[None]).expand(x.shape[0], *np.shape(frame))
        return outputs, new

    def _differentiable_step(self, x: Tensor, state_before, t, return_intermediates: bool):
        """(N, C', H', W') preprocessed frames -> (outputs as step returns them, new state without frame)."""
        if self.training:  # (train()/eval() walk every submodule and drop the NAC's kept weights: not per step)
            self.eval()
            try:
                return self._differentiable_step(x, state_before, t, return_intermediates)
            finally:
                self.train(True)
        feats = self.features.from_preprocessed(x.to(self.device))  # (N, F)
        outputs, new = self._core_step(feats, state_before, t, return_intermediates)
        return self._acted(outputs, new)

    def saliency_region(self, frame_hw: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, bottom, left, right) pixels of a raw frame that :meth:`saliency_input` covers."""
        return self.features.region(frame_hw)

    # ------------------------------------------------------------------ files
    def with_dashboard(self, dashboard: str) -> "DrivingPolicy":
        """A copy of this CarRacing policy whose CNN reads another part of the dashboard strip
        (``"visible"``, ``"speed"``, ``"speedometer"`` or ``"speed-input"``;
        :class:`agent.nn.features.CarRacingCNN`), every weight kept: the input keeps its size, only
        the mask of what is read changes. For fine-tuning a ``speed`` student into a
        ``speedometer`` one (``agent train --init P --dashboard speedometer``), or a speedometer
        student into one with the speed as an input (``--dashboard speed-input``: its speed
        embedding is new, with a zero last layer; switching away from it drops the embedding).
        The copy is trained further before it is worth driving.

        Raises:
            ValueError: a policy without the CarRacing CNN, an unknown mode, or a change to or
                from ``"hidden"`` (a cropped input of another size).
        """
        if not isinstance(self.features, CarRacingCNN):
            raise ValueError(f"only a CarRacing CNN reads a dashboard; this policy's features are {self.config.features!r}")
        if dashboard not in CarRacingCNN.DASHBOARD_MODES:
            raise ValueError(f"dashboard must be one of {', '.join(CarRacingCNN.DASHBOARD_MODES)}, got {dashboard!r}")
        old = self.features.dashboard
        if dashboard != old and "hidden" in (dashboard, old):
            raise ValueError(f"cannot turn a --dashboard {old} policy into a --dashboard {dashboard} one: \"hidden\" "
                             "crops the strip, so the CNN's input has another size; train that one from scratch")
        kwargs = {**self.config.features_kwargs, "dashboard": dashboard}
        config = PolicyConfig(**{**asdict(self.config), "features_kwargs": kwargs})
        with masks_from_state_dict():  # the wiring's masks come with the weights
            new = type(self)(config)
        missing, unexpected = new.load_state_dict(self.state_dict(), strict=False)
        # only the speed embedding of "speed-input" may be new (kept at its zero start) or left out
        stray = [k for k in (*missing, *unexpected) if not k.startswith("features.speed_embed.")]
        if stray:
            raise ValueError(f"cannot switch this policy's dashboard to {dashboard!r}: weights do not match ({stray[:4]})")
        new.metadata = dict(getattr(self, "metadata", {}) or {})
        return new.to(self.device).train(self.training)

    def save(self, path: str | Path, metadata: dict | None = None) -> Path:
        """Write one file: kind, format version, the config, the state dict and metadata.

        Written to a temporary name and renamed, so a crash never leaves half a file; a failed
        write (a full disk) removes the temporary file and raises the OSError, the old ``path``
        (if any) untouched.

        Raises:
            OSError: the file could not be written.
        """
        payload = {"kind": FILE_KIND, "format_version": FORMAT_VERSION, "config": self.config.to_dict(),
                   "state_dict": {k: v.detach().cpu() for k, v in self.state_dict().items()},
                   "metadata": json_ready(metadata or {})}
        buf = io.BytesIO()
        torch.save(payload, buf)
        return write_atomic(path, buf.getbuffer(), what="policy file")

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "DrivingPolicy":
        """Rebuild a policy from a file written by :meth:`save`.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a policy file of this project, another format version (an old
                file: convert it with ``agent convert-policy``), a stored config above the size
                limits (:data:`MAX_OBS_SIDE`, :data:`MAX_WINDOW`, :data:`MAX_WIDTH`,
                :data:`MAX_PARAMETERS`, ...: refused before anything is built), or weights that do
                not fit the stored config. Nothing is half-loaded.
        """
        return cls.from_payload(read_policy_file(path), path, device)

    @classmethod
    def from_payload(cls, payload: dict, path: str | Path, device: str | torch.device = "cpu") -> "DrivingPolicy":
        """Rebuild from the contents of a policy file (:func:`read_policy_file`); errors as :meth:`load`."""
        if not isinstance(payload, dict) or payload.get("kind") != FILE_KIND:
            found = payload.get("kind") if isinstance(payload, dict) else None
            raise ValueError(f"{path} is not a policy file of this project (kind {found!r}, expected {FILE_KIND!r})")
        version = payload.get("format_version")
        if version != FORMAT_VERSION:
            hint = " (an older file: run `agent convert-policy OLD NEW`)" if isinstance(version, int) and \
                version < FORMAT_VERSION else ""
            raise ValueError(f"{path} has policy format version {version}; this version of the project reads "
                             f"version {FORMAT_VERSION}{hint}")

        try:  # the config first, with its limits, so that nothing is built for a crafted one
            config = PolicyConfig(**payload["config"])
            check_config_size(config)
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise ValueError(f"{path}: its stored policy config is refused: {exc}") from exc
        try:
            with masks_from_state_dict():  # the sensory masks are in the state dict: not rebuilt (seconds)
                policy = cls(config)
            policy.load_state_dict(payload["state_dict"], strict=True)
        except (TypeError, KeyError, RuntimeError, ValueError) as exc:
            raise ValueError(f"{path}: the stored weights do not fit the stored config: {exc}") from exc
        policy.metadata = payload.get("metadata") or {}
        return policy.to(device).eval()


def read_policy_file(path: str | Path) -> dict:
    """The contents of a ``.pt`` policy file, read with ``torch.load(weights_only=True)`` (no code runs).

    The file's zip records are checked first (:func:`agent.bounded.check_zip_sizes`): more than
    :data:`MAX_POLICY_FILE_RECORDS`, or declared sizes above :data:`MAX_POLICY_FILE_BYTES` in all,
    are refused before torch inflates anything.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not readable as a policy file (not a zip-format torch file, or
            corrupt); :class:`agent.bounded.ZipMemberTooLarge` (a ValueError) above the limits.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"policy file {path} does not exist")
    try:  # a torch.save file is a zip: its records' sizes are checked before torch inflates them (agent.bounded)
        is_zip = check_zip_sizes(path, path, MAX_POLICY_FILE_BYTES, MAX_POLICY_FILE_RECORDS)
    except OSError as exc:
        raise ValueError(f"{path} is not a readable policy file: {exc}") from exc
    if not is_zip:
        raise ValueError(f"{path} is not a readable policy file (corrupt or not made by `agent train`): not a "
                         "zip-format torch file, which torch.save has written since PyTorch 1.6")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable policy file (corrupt or not made by `agent train`): "
                         f"{type(exc).__name__}: {exc}") from exc


def file_digest(path: str | Path) -> str:
    """Short SHA-256 of a file, to name the exact policy in reports."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


__all__ = ["CARRACING_ACTIONS", "CARRACING_CONTINUOUS_SPACE", "CARRACING_CONTROLS", "DrivingPolicy", "FILE_KIND",
           "FORMAT_VERSION", "MAX_FRAME_ACTIVATIONS", "MAX_OBS_CHANNELS", "MAX_OBS_SIDE", "MAX_PARAMETERS",
           "MAX_POLICY_FILE_BYTES", "MAX_POLICY_FILE_RECORDS", "MAX_WIDTH", "MAX_WINDOW", "PolicyConfig", "PolicyState",
           "check_config_size", "config_size", "default_config", "default_core_kwargs", "file_digest", "json_ready",
           "read_policy_file"]
