"""The student: a CNN feature extractor feeding NAC over a window of past frames.

Shapes: B batch, T window (frames), H x W x C the frame (96 x 96 x 3 uint8 for CarRacing),
F the CNN's flattened feature size, A the number of discrete actions (5).

The CNN is the paper's CarRacing extractor (arXiv 2512.10282, Appendix D: conv 10@3x3/2,
20@5x5/2, 30@5x5/2, ReLU, dropout 0.2); its flatten size comes from a dry run on the
observation space, as stable-baselines3's ``NatureCNN`` does. NAC-Steady (d_model 64, 16 heads,
top-k 8, sparsity 0.5) reads the window with the frames' timestamps; a dense 64 layer and a
linear layer give the five action logits. The reference trains with T = 1 (no temporal
context); the window here is chosen by validation (see README).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from agent.nn.nac import NAC, NACCache, NACIntermediates

FORMAT_VERSION = 1
FILE_KIND = "nac-drive-policy"


class CNNFeatures(nn.Module):
    """The paper's CarRacing CNN: (B, H, W, C) uint8 or float in [0, 255] -> (B, F) features.

    Args:
        observation_space: a ``Box`` of shape (H, W, C) (channels last, as gymnasium renders).
        channels: output channels of the three convolutions.
        dropout: dropout on the flattened features (paper: 0.2).

    Raises:
        ValueError: if the observation space is not an (H, W, C) Box, or too small for the convs.
    """

    def __init__(self, observation_space: gym.spaces.Box, channels=(10, 20, 30), dropout: float = 0.2):
        super().__init__()
        shape = tuple(observation_space.shape)
        if len(shape) != 3:
            raise ValueError(f"CNNFeatures needs image observations (H, W, C), got shape {shape}")
        h, w, c = shape
        self.obs_shape = shape
        self.cnn = nn.Sequential(
            nn.Conv2d(c, channels[0], 3, stride=2), nn.ReLU(),
            nn.Conv2d(channels[0], channels[1], 5, stride=2), nn.ReLU(),
            nn.Conv2d(channels[1], channels[2], 5, stride=2), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():  # dry run for the flatten size
            try:
                self.features_dim = int(self.cnn(torch.zeros(1, c, h, w)).shape[1])
            except RuntimeError as exc:
                raise ValueError(f"observation {shape} is too small for the CNN: {exc}") from exc
        self.dropout = nn.Dropout(dropout)

    @staticmethod
    def preprocess(obs: Tensor) -> Tensor:
        """(B, H, W, C) frames in [0, 255] -> (B, C, H, W) float in [0, 1], what the first conv sees."""
        return obs.float().permute(0, 3, 1, 2) / 255.0

    def forward(self, obs: Tensor) -> Tensor:
        return self.from_preprocessed(self.preprocess(obs))  # (B, F)

    def from_preprocessed(self, x: Tensor) -> Tensor:
        """(B, C, H, W) preprocessed frames -> (B, F) features (the path Grad-CAM differentiates)."""
        return self.dropout(self.cnn(x))

    @property
    def last_conv(self) -> nn.Conv2d:
        """The last convolution: Grad-CAM's target layer."""
        return [m for m in self.cnn if isinstance(m, nn.Conv2d)][-1]


@dataclass
class PolicyConfig:
    """Everything needed to rebuild a :class:`NACPolicy` (saved in the policy file)."""

    obs_shape: tuple[int, int, int] = (96, 96, 3)
    n_actions: int = 5
    window: int = 16  # T: frames the NAC sees (the newest included)
    frame_dt: float = 0.02  # seconds between frames (CarRacing runs at 50 FPS)
    d_model: int = 64
    num_heads: int = 16
    topk: int = 8
    sparsity: float = 0.5
    mode: str = "steady"
    hidden: int = 64
    dropout: float = 0.2
    seed: int = 22222
    env: str = "carracing"
    action_names: tuple[str, ...] = ("nothing", "left", "right", "gas", "brake")

    def __post_init__(self):
        self.obs_shape = tuple(int(s) for s in self.obs_shape)
        self.action_names = tuple(self.action_names)
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if len(self.action_names) != self.n_actions:
            raise ValueError("action_names must name every action")


@dataclass
class PolicyState:
    """Streaming state of one rollout batch: the NAC cache and the step counter (for timestamps)."""

    cache: NACCache | None = None
    steps: int = 0
    last: dict = field(default_factory=dict)  # latest logits / intermediates, for the runner's HUD


class NACPolicy(nn.Module):
    """CNN + NAC + dense head, trained by behaviour cloning; acts one frame at a time.

    ``forward`` scores whole windows (training); ``step`` / ``predict`` act in a rollout and cost
    one CNN forward plus NAC on the newest query over the cached keys.

    The live runner's overlays use :attr:`output_kind` ("discrete": the outputs are action logits)
    and the saliency hooks :meth:`saliency_layer`, :meth:`saliency_input`, :meth:`saliency_forward`
    and :meth:`saliency_region`, which every policy with a CNN provides.
    """

    output_kind = "discrete"

    def __init__(self, config: PolicyConfig | None = None, **kwargs):
        super().__init__()
        self.config = config or PolicyConfig(**kwargs)
        cfg = self.config
        space = gym.spaces.Box(0, 255, cfg.obs_shape, np.uint8)
        self.features = CNNFeatures(space, dropout=cfg.dropout)
        self.nac = NAC(self.features.features_dim, cfg.d_model, cfg.num_heads, topk=cfg.topk, mode=cfg.mode,
                       sparsity=cfg.sparsity, causal=True, selector="exact", seed=cfg.seed)
        self.head = nn.Sequential(nn.Linear(cfg.d_model, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.n_actions))

    # ------------------------------------------------------------------ training
    def forward(self, obs: Tensor, mask: Tensor | None = None, return_intermediates: bool = False):
        """Action logits for every position of frame windows.

        Args:
            obs: (B, T, H, W, C) frames (uint8 or float in [0, 255]).
            mask: (B, T) bool, True = real frame (False = padding before an episode start).

        Returns:
            logits (B, T, A), or (logits, NACIntermediates).
        """
        B, T = obs.shape[:2]
        feats = self.features(obs.reshape(B * T, *obs.shape[2:])).view(B, T, -1)  # (B, T, F)
        t = torch.arange(T, device=obs.device, dtype=feats.dtype).expand(B, T) * self.config.frame_dt  # (B, T) s
        out = self.nac(feats, t=t, mask=mask, return_intermediates=return_intermediates)
        y, inter = out if return_intermediates else (out, None)
        logits = self.head(y)  # (B, T, A)
        return (logits, inter) if return_intermediates else logits

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def step(self, obs: Tensor, state: PolicyState | None = None, return_intermediates: bool = False,
             t: Tensor | None = None) -> tuple[Tensor, PolicyState]:
        """One control step for a batch of newest frames.

        Args:
            obs: (B, H, W, C) newest frames.
            state: the previous step's state (None at an episode start).
            return_intermediates: also keep the NAC intermediates in ``state.last["intermediates"]``.
            t: (B,) frame timestamps in seconds; None: ``steps * frame_dt`` (CarRacing's fixed rate).

        Returns:
            (logits (B, A), new state); ``new_state.last["logits"]`` holds the logits too.
        """
        state = state or PolicyState()
        feats = self.features(obs)  # (B, F)
        if t is None:
            t = torch.full((obs.shape[0],), state.steps * self.config.frame_dt, dtype=feats.dtype, device=obs.device)
        out = self.nac.step(feats, state.cache, t=t, window=self.config.window,
                            return_intermediates=return_intermediates)
        y, cache = out[0], out[1]
        logits = self.head(y)  # (B, A)
        new = PolicyState(cache=cache, steps=state.steps + 1, last={"logits": logits})
        if return_intermediates:
            new.last["intermediates"] = out[2]
        return logits, new

    # ------------------------------------------------------------------ saliency (Grad-CAM) hooks
    def saliency_layer(self) -> nn.Module:
        """The CNN's last convolution, Grad-CAM's target layer."""
        return self.features.last_conv

    def saliency_input(self, frame: np.ndarray) -> Tensor:
        """One raw frame (H, W, C) uint8 -> (1, C, H, W) float, exactly what the first conv sees."""
        obs = torch.as_tensor(np.ascontiguousarray(frame), device=self.device)[None]
        return self.features.preprocess(obs)

    def saliency_forward(self, x: Tensor, state_before: PolicyState | None = None, t: Tensor | None = None) -> Tensor:
        """Differentiable twin of :meth:`step` for Grad-CAM: the output on the newest frame ``x``.

        Args:
            x: (N, C, H, W) preprocessed newest frame(s) (:meth:`saliency_input`).
            state_before: the state :meth:`step` was given for this frame (the earlier frames of
                the window); it is not changed. Its cache must have batch size N (or be None).
            t: (N,) timestamp in seconds, or None for ``state_before.steps * frame_dt``.

        Returns:
            (N, A) action logits, equal to what :meth:`step` returns for the same frame.
        """
        N = x.shape[0]
        feats = self.features.from_preprocessed(x)  # (N, F)
        steps = state_before.steps if state_before is not None else 0
        if t is None:
            t = torch.full((N,), steps * self.config.frame_dt, dtype=feats.dtype, device=x.device)
        cache = state_before.cache if state_before is not None else None
        y = self.nac.step(feats, cache, t=t, window=self.config.window)[0]  # (N, d_model)
        return self.head(y)

    def saliency_region(self, frame_hw: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, bottom, left, right) pixels of the raw frame that :meth:`saliency_input` covers: all of it."""
        return 0, int(frame_hw[0]), 0, int(frame_hw[1])

    def predict(self, obs: np.ndarray, state: PolicyState | None = None, episode_start: np.ndarray | None = None,
                deterministic: bool = True) -> tuple[np.ndarray | int, PolicyState]:
        """stable-baselines3-style acting.

        Args:
            obs: one frame (H, W, C) or a batch (N, H, W, C), uint8.
            state: the previous call's state (None at the start).
            episode_start: (N,) bool; any True restarts the window (the NAC cache is dropped).
            deterministic: argmax action; otherwise sample from the softmax.

        Returns:
            (action, state): an int for one frame, an (N,) int64 array for a batch.

        Raises:
            ValueError: if the frame shape differs from the policy's observation shape.
        """
        obs = np.asarray(obs)
        single = obs.ndim == 3
        batch = obs[None] if single else obs
        if tuple(batch.shape[1:]) != self.config.obs_shape:
            raise ValueError(f"this policy takes frames of shape {self.config.obs_shape}, got {tuple(batch.shape[1:])}")
        if episode_start is not None and np.any(episode_start):
            state = None
        was_training = self.training
        self.eval()
        logits, state = self.step(torch.as_tensor(batch, device=self.device), state)
        if was_training:
            self.train()
        if deterministic:
            action = logits.argmax(-1)
        else:
            action = torch.distributions.Categorical(logits=logits).sample()
        action = action.cpu().numpy()
        return (int(action[0]) if single else action), state

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path, metadata: dict | None = None) -> Path:
        """Write one file holding the format version, the config, the state dict and metadata
        (atomically: see :func:`write_policy_file`)."""
        return write_policy_file(path, FILE_KIND, FORMAT_VERSION, self.config, self.state_dict(), metadata)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "NACPolicy":
        """Rebuild a policy from a file written by :meth:`save` (``torch.load(weights_only=True)``).

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a policy file of this project, an unsupported format version, or a
                state dict that does not fit the stored config. Nothing is half-loaded.
        """
        return cls.from_payload(read_policy_file(path), path, device)

    @classmethod
    def from_payload(cls, payload: dict, path: str | Path, device: str | torch.device = "cpu") -> "NACPolicy":
        """Rebuild from the contents of a policy file (:func:`read_policy_file`); errors as :meth:`load`."""
        return rebuild_policy(cls, PolicyConfig, payload, path, FILE_KIND, FORMAT_VERSION, "NAC policy", device)


def write_policy_file(path: str | Path, kind: str, version: int, config, state_dict: dict,
                      metadata: dict | None = None) -> Path:
    """One policy file: kind, format version, the config dataclass, the state dict and metadata.

    The file is written to a temporary name and renamed, so a crash never leaves half a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "kind": kind,
        "format_version": version,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
        "state_dict": {k: v.detach().cpu() for k, v in state_dict.items()},
        "metadata": metadata or {},
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)
    return path


def read_policy_file(path: str | Path) -> dict:
    """The contents of a policy file (``torch.load(weights_only=True)``, no pickle).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not readable as a policy file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"policy file {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable policy file (corrupt or not made by `agent train`): "
                         f"{type(exc).__name__}: {exc}") from exc


def rebuild_policy(cls, config_cls, payload, path: str | Path, kind: str, version: int, what: str,
                   device: str | torch.device = "cpu"):
    """Check a policy file's kind and format version and rebuild ``cls(config_cls(**config))``.

    Raises:
        ValueError: another kind of file, another format version, or weights that do not fit the
            stored config. Nothing is half-loaded.
    """
    if not isinstance(payload, dict) or payload.get("kind") != kind:
        raise ValueError(f"{path} is not a {what} file of this project (expected kind {kind!r})")
    found = payload.get("format_version")
    if found != version:
        raise ValueError(f"{path} has {what} format version {found}; this version of the project reads "
                         f"version {version}")
    try:
        policy = cls(config_cls(**payload["config"]))
        policy.load_state_dict(payload["state_dict"], strict=True)
    except (TypeError, KeyError, RuntimeError, ValueError) as exc:
        raise ValueError(f"{path}: the stored weights do not fit the stored config: {exc}") from exc
    policy.metadata = payload.get("metadata", {})
    return policy.to(device).eval()


def file_digest(path: str | Path) -> str:
    """Short SHA-256 of a file, to name the exact policy in reports."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


__all__ = ["CNNFeatures", "NACPolicy", "NACIntermediates", "PolicyConfig", "PolicyState", "file_digest",
           "read_policy_file", "rebuild_policy", "write_policy_file"]
