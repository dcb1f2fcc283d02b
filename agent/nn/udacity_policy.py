"""The Udacity steering policy: NVIDIA PilotNet convolutions feeding NAC over timestamped frames.

The NAC paper's Udacity network (arXiv 2512.10282, Appendix D.3.3 and Table 4; DESIGN.md
section 5): the PilotNet of Bojarski et al. 2016 ("End to End Learning for Self-Driving Cars")
as naokishibuya/car-behavioral-cloning builds it, with its three dense layers (100-50-10)
replaced by NAC:

    66x200 YUV crop, x / 127.5 - 1
    conv 24@5x5/2, 36@5x5/2, 48@5x5/2, 64@3x3, 64@3x3, ELU      -> 64 x 1 x 18 = 1152 features
    dropout 0.5
    NAC (d_model 100, 20 heads, top-k 8, exact mode) over the last T frames, with the frames'
        capture times (seconds) as NAC's time input
    dense 64 (ELU), dense 1 -> steering (normalised: 1.0 = 25 degrees, + = right); MSE loss

Shapes: B batch, T window (frames), raw frames 160 x 320 x 3 uint8 RGB (the simulator's
camera), network input 66 x 200 x 3 YUV (``agent.data.udacity.preprocess``), F = 1152.

Acting follows the same API as the CarRacing :class:`agent.nn.policy.NACPolicy` (``step``,
``predict``, :class:`agent.nn.policy.PolicyState`), with ``output_kind = "steering"`` and the
Grad-CAM hooks ``saliency_layer``, ``saliency_input``, ``saliency_forward``, ``saliency_region``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from agent.nn.nac import NAC, NACIntermediates
from agent.nn.policy import PolicyState, read_policy_file, rebuild_policy, write_policy_file
from agent.data.udacity import CROP_ROWS, FRAME_SHAPE, INPUT_SHAPE, preprocess

FORMAT_VERSION = 1
FILE_KIND = "nac-udacity-policy"


class PilotNetFeatures(nn.Module):
    """PilotNet's five convolutions with ELU: (N, 3, 66, 200) normalised YUV -> (N, 1152).

    Input is what :meth:`UdacityNACPolicy.prepare` makes: YUV in [-1, 1] (x / 127.5 - 1, the
    Lambda layer of naokishibuya's model), channels first. Dropout 0.5 on the flattened features
    (naokishibuya: after the last convolution).
    """

    def __init__(self, dropout: float = 0.5):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(3, 24, 5, stride=2), nn.ELU(),  # (N, 24, 31, 98)
            nn.Conv2d(24, 36, 5, stride=2), nn.ELU(),  # (N, 36, 14, 47)
            nn.Conv2d(36, 48, 5, stride=2), nn.ELU(),  # (N, 48, 5, 22)
            nn.Conv2d(48, 64, 3), nn.ELU(),  # (N, 64, 3, 20)
            nn.Conv2d(64, 64, 3), nn.ELU(),  # (N, 64, 1, 18)
        )
        with torch.no_grad():  # dry run for the flatten size
            self.features_dim = int(self.convs(torch.zeros(1, 3, *INPUT_SHAPE[:2])).numel())
        self.dropout = nn.Dropout(dropout)

    @property
    def last_conv(self) -> nn.Conv2d:
        return self.convs[-2]

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.convs(x).flatten(1))  # (N, F)


@dataclass
class UdacityPolicyConfig:
    """Everything needed to rebuild a :class:`UdacityNACPolicy` (saved in the policy file)."""

    window: int = 8  # T: frames the NAC sees (the newest included); T <= topk keeps every frame attended
    frame_dt: float = 0.07  # seconds between frames when no timestamps are given (drive-2018's median gap)
    d_model: int = 100
    num_heads: int = 20
    topk: int = 8
    sparsity: float = 0.5
    mode: str = "exact"
    hidden: int = 64
    dropout: float = 0.5
    seed: int = 22222
    env: str = "udacity"
    obs_shape: tuple[int, int, int] = FRAME_SHAPE

    def __post_init__(self):
        self.obs_shape = tuple(int(s) for s in self.obs_shape)
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.frame_dt <= 0:
            raise ValueError(f"frame_dt must be > 0 seconds, got {self.frame_dt}")
        if self.obs_shape != FRAME_SHAPE:
            raise ValueError(f"the Udacity policy reads 160x320x3 camera frames, got obs_shape {self.obs_shape}")
        if self.env != "udacity":
            raise ValueError(f"env must be 'udacity', got {self.env!r}")


class UdacityNACPolicy(nn.Module):
    """PilotNet + NAC steering policy; trained by behaviour cloning on Udacity recordings.

    ``forward`` scores whole windows (training and offline checks); ``step`` / ``predict`` act
    one frame at a time, costing one CNN forward plus NAC on the newest query over the cached
    keys of the last ``config.window`` frames.
    """

    output_kind = "steering"

    def __init__(self, config: UdacityPolicyConfig | None = None, **kwargs):
        super().__init__()
        self.config = config or UdacityPolicyConfig(**kwargs)
        cfg = self.config
        self.features = PilotNetFeatures(cfg.dropout)
        self.nac = NAC(self.features.features_dim, cfg.d_model, cfg.num_heads, topk=cfg.topk, mode=cfg.mode,
                       sparsity=cfg.sparsity, causal=True, selector="exact", seed=cfg.seed)
        self.head = nn.Sequential(nn.Linear(cfg.d_model, cfg.hidden), nn.ELU(), nn.Linear(cfg.hidden, 1))
        self.metadata: dict = {}

    # ------------------------------------------------------------------ input
    def prepare(self, obs) -> Tensor:
        """Frames -> the first convolution's input (N, 3, 66, 200) float in [-1, 1].

        Args:
            obs: (N, 160, 320, 3) uint8 raw RGB camera frames (cropped, resized and converted to
                YUV here), or (N, 66, 200, 3) uint8 frames already through
                :func:`agent.data.udacity.preprocess` (YUV); a Tensor or an array.

        Raises:
            ValueError: any other frame shape.
        """
        arr = obs.detach().cpu().numpy() if isinstance(obs, Tensor) else np.asarray(obs)
        shape = tuple(arr.shape[1:])
        if shape == FRAME_SHAPE:
            arr = preprocess(arr)
        elif shape != INPUT_SHAPE:
            raise ValueError(f"frames must be (N, 160, 320, 3) raw RGB or (N, 66, 200, 3) preprocessed YUV, "
                             f"got {tuple(arr.shape)}")
        x = torch.from_numpy(np.ascontiguousarray(arr)).to(self.device)
        return x.permute(0, 3, 1, 2).float() / 127.5 - 1.0  # (N, 3, 66, 200)

    # ------------------------------------------------------------------ training
    def forward(self, obs, t: Tensor | None = None, mask: Tensor | None = None, return_intermediates: bool = False):
        """Steering for every position of frame windows (causal: position i sees frames <= i).

        Args:
            obs: (B, T, 160, 320, 3) uint8 raw RGB, or (B, T, 66, 200, 3) uint8 preprocessed YUV
                (training passes preprocessed, augmented frames).
            t: (B, T) capture times in seconds (only differences matter; relative to the window
                start keeps float32 precision), or None: positions * ``config.frame_dt``.
            mask: (B, T) bool, True = real frame (False = padding).
            return_intermediates: also return the NAC's :class:`NACIntermediates`.

        Returns:
            steering (B, T, 1), not clipped (a regression output; ``step`` clips to [-1, 1]),
            or (steering, intermediates).
        """
        B, T = obs.shape[:2]
        x = self.prepare(obs.reshape(B * T, *obs.shape[2:]))  # (B*T, 3, 66, 200)
        feats = self.features(x).view(B, T, -1)  # (B, T, F)
        if t is None:
            t = torch.arange(T, device=feats.device, dtype=torch.float64).expand(B, T) * self.config.frame_dt
        out = self.nac(feats, t=t.to(feats.device), mask=None if mask is None else mask.to(feats.device),
                       return_intermediates=return_intermediates)
        y, inter = out if return_intermediates else (out, None)
        steering = self.head(y)  # (B, T, 1)
        return (steering, inter) if return_intermediates else steering

    # ------------------------------------------------------------------ acting
    def _times(self, t, state: PolicyState, B: int) -> Tensor:
        """(B,) float64 frame times: ``t`` as given, else ``state.steps * config.frame_dt``."""
        if t is None:
            return torch.full((B,), state.steps * self.config.frame_dt, dtype=torch.float64, device=self.device)
        t = torch.as_tensor(t, dtype=torch.float64, device=self.device).reshape(-1)
        if t.numel() == 1 and B > 1:
            t = t.expand(B)
        if t.numel() != B:
            raise ValueError(f"t must hold one time per frame ({B}), got {t.numel()}")
        return t

    def _act(self, x: Tensor, state: PolicyState, t, return_intermediates: bool):
        """Features of prepared frames x (B, 3, 66, 200) -> NAC step -> clipped steering (B, 1)."""
        feats = self.features(x)  # (B, F)
        out = self.nac.step(feats, state.cache, t=self._times(t, state, x.shape[0]), window=self.config.window,
                            return_intermediates=return_intermediates)
        return self.head(out[0]).clamp(-1.0, 1.0), out[1], (out[2] if return_intermediates else None)

    @torch.no_grad()
    def step(self, obs, state: PolicyState | None = None, return_intermediates: bool = False,
             t: Tensor | None = None) -> tuple[Tensor, PolicyState]:
        """One control step.

        Args:
            obs: (B, 160, 320, 3) uint8 raw RGB newest frames (or (B, 66, 200, 3) preprocessed).
            state: the previous call's state, or None at the start of a drive.
            return_intermediates: also put the NAC intermediates in ``state.last["intermediates"]``.
            t: (B,) frame arrival times in seconds (any origin; float64 is kept), or None:
                ``state.steps * config.frame_dt``. Give times on every step of a drive or on none.

        Returns:
            (steering (B, 1) in [-1, 1], new state with ``last = {"output": steering, ...}``).
        """
        state = state or PolicyState()
        steering, cache, inter = self._act(self.prepare(obs), state, t, return_intermediates)
        new = PolicyState(cache=cache, steps=state.steps + 1, last={"output": steering})
        if return_intermediates:
            new.last["intermediates"] = inter
        return steering, new

    def predict(self, obs: np.ndarray, state: PolicyState | None = None, episode_start: np.ndarray | None = None,
                deterministic: bool = True, t=None) -> tuple[float | np.ndarray, PolicyState]:
        """stable-baselines3-style acting.

        Args:
            obs: one frame (160, 320, 3) or a batch (N, 160, 320, 3), uint8 RGB.
            state: the previous call's state (None at the start).
            episode_start: (N,) bool; any True restarts the window (the NAC cache is dropped).
            deterministic: ignored (the policy is deterministic); kept for the common API.
            t: frame time(s) in seconds, as in :meth:`step`.

        Returns:
            (steering, state): a float in [-1, 1] for one frame, an (N,) float32 array for a batch.

        Raises:
            ValueError: if the frame shape is not 160x320x3.
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
        steering, state = self.step(batch, state, t=t)
        self.train(was_training)
        out = steering[:, 0].cpu().numpy().astype(np.float32)
        return (float(out[0]) if single else out), state

    # ------------------------------------------------------------------ saliency (Grad-CAM)
    def saliency_layer(self) -> nn.Module:
        """The last convolution (64@3x3, output (1, 64, 1, 18)): the Grad-CAM target layer."""
        return self.features.last_conv

    def saliency_input(self, frame: np.ndarray) -> Tensor:
        """The newest frame (160, 320, 3) uint8 RGB as the first convolution sees it: (1, 3, 66, 200) float."""
        frame = np.asarray(frame)
        if frame.shape != FRAME_SHAPE:
            raise ValueError(f"frame must be (160, 320, 3) uint8 RGB, got {frame.shape}")
        return self.prepare(frame[None])

    def saliency_forward(self, x: Tensor, state_before: PolicyState | None = None, t: Tensor | None = None) -> Tensor:
        """The steering (1, 1) that ``step`` outputs for prepared frame x (1, 3, 66, 200) after
        ``state_before``, differentiable w.r.t. x; run in eval mode; ``state_before`` is not changed."""
        was_training = self.training
        self.eval()
        try:
            steering, _, _ = self._act(x.to(self.device), state_before or PolicyState(), t, False)
        finally:
            self.train(was_training)
        return steering  # (1, 1)

    def saliency_region(self, frame_hw: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, bottom, left, right) pixels of a raw frame of size ``frame_hw`` that the input
        covers: rows 60..135 (of 160, scaled for other heights), all columns."""
        h, w = int(frame_hw[0]), int(frame_hw[1])
        return round(CROP_ROWS[0] * h / FRAME_SHAPE[0]), round(CROP_ROWS[1] * h / FRAME_SHAPE[0]), 0, w

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path, metadata: dict | None = None) -> Path:
        """Write one file holding the kind, format version, config, state dict and metadata
        (atomically: see :func:`agent.nn.policy.write_policy_file`)."""
        return write_policy_file(path, FILE_KIND, FORMAT_VERSION, self.config, self.state_dict(), metadata)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "UdacityNACPolicy":
        """Rebuild a policy from a file written by :meth:`save` (``torch.load(weights_only=True)``).

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a Udacity policy file of this project, an unsupported format version,
                or a state dict that does not fit the stored config. Nothing is half-loaded.
        """
        return cls.from_payload(read_policy_file(path), path, device)

    @classmethod
    def from_payload(cls, payload: dict, path: str | Path, device: str | torch.device = "cpu") -> "UdacityNACPolicy":
        """Rebuild from the contents of a policy file (:func:`agent.nn.policy.read_policy_file`)."""
        return rebuild_policy(cls, UdacityPolicyConfig, payload, path, FILE_KIND, FORMAT_VERSION,
                              "Udacity NAC policy", device)


__all__ = ["FILE_KIND", "NACIntermediates", "PilotNetFeatures", "UdacityNACPolicy", "UdacityPolicyConfig"]
