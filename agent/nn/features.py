"""Features extractors: one camera frame -> one feature vector, each owning its preprocessing.

Shapes: N frames, H x W x C a raw frame (channels last, uint8, as the simulators send it),
C' x H' x W' what the first convolution sees, F the flattened feature size.

Every extractor, as stable-baselines3's ``BaseFeaturesExtractor`` (``common/torch_layers.py``),
computes ``features_dim`` with a dry run, and provides the pieces the policy and Grad-CAM need:

- ``preprocess(obs)``: (N, H, W, C) raw frames (array or tensor) -> (N, C', H', W') float;
- ``from_preprocessed(x)``: (N, C', H', W') -> (N, F), the path Grad-CAM differentiates;
- ``last_conv``: the Grad-CAM target layer;
- ``region(frame_hw)``: the (top, bottom, left, right) pixels of the raw frame that the input covers.

Extractors are built by name through :data:`FEATURES` (``make_features("carracing-cnn", ...)``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn


class FeaturesExtractor(nn.Module):
    """Base class: ``forward(obs (N, H, W, C)) -> (N, F)`` = ``from_preprocessed(preprocess(obs))``.

    Attributes:
        obs_shape: (H, W, C) of the raw frames it reads.
        features_dim: F.
    """

    obs_shape: tuple[int, int, int]
    features_dim: int

    def preprocess(self, obs) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def from_preprocessed(self, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def last_conv(self) -> nn.Conv2d:  # pragma: no cover - abstract
        raise NotImplementedError

    def region(self, frame_hw: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, bottom, left, right) of the raw frame the network input covers: all of it."""
        return 0, int(frame_hw[0]), 0, int(frame_hw[1])

    def forward(self, obs) -> Tensor:
        """(N, H, W, C) raw frames -> (N, F) features."""
        return self.from_preprocessed(self.preprocess(obs))

    def _device(self) -> torch.device:
        return next(self.parameters()).device


class CarRacingCNN(FeaturesExtractor):
    """The paper's CarRacing CNN: (N, 96, 96, 3) uint8 -> (N, F) features.

    Conv 10@3x3/2, 20@5x5/2, 30@5x5/2 with ReLU, then dropout (arXiv 2512.10282, Appendix D).
    Input: x / 255 in [0, 1], channels first. F = 30 x 9 x 9 = 2430 for 96x96 frames.

    Args:
        obs_shape: (H, W, C) of the frames.
        channels: output channels of the three convolutions.
        dropout: dropout on the flattened features (paper: 0.2).

    Raises:
        ValueError: ``obs_shape`` is not (H, W, C), or too small for the convolutions.
    """

    def __init__(self, obs_shape=(96, 96, 3), channels=(10, 20, 30), dropout: float = 0.2):
        super().__init__()
        shape = tuple(int(s) for s in obs_shape)
        if len(shape) != 3:
            raise ValueError(f"CarRacingCNN needs image observations (H, W, C), got shape {shape}")
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

    def preprocess(self, obs) -> Tensor:
        """(N, H, W, C) frames in [0, 255] (uint8 or float; array or tensor) -> (N, C, H, W) float in [0, 1].

        Raises:
            ValueError: frames of another shape than ``obs_shape``.
        """
        x = obs if isinstance(obs, Tensor) else torch.from_numpy(np.ascontiguousarray(obs))
        if tuple(x.shape[1:]) != self.obs_shape:
            raise ValueError(f"frames must be (N, {', '.join(map(str, self.obs_shape))}), got {tuple(x.shape)}")
        return x.to(self._device()).float().permute(0, 3, 1, 2) / 255.0

    def from_preprocessed(self, x: Tensor) -> Tensor:
        """(N, C, H, W) preprocessed frames -> (N, F)."""
        return self.dropout(self.cnn(x))

    @property
    def last_conv(self) -> nn.Conv2d:
        return [m for m in self.cnn if isinstance(m, nn.Conv2d)][-1]


class PilotNet(FeaturesExtractor):
    """NVIDIA PilotNet's five convolutions with ELU: Udacity camera frames -> (N, 1152).

    Bojarski et al. 2016, "End to End Learning for Self-Driving Cars", as
    naokishibuya/car-behavioral-cloning builds it (the NAC paper's Udacity network, arXiv
    2512.10282 Appendix D.3.3): crop rows 60..135 of the 160x320 RGB frame, resize to 66x200,
    RGB -> YUV (:func:`agent.data.udacity.preprocess`), x / 127.5 - 1, then conv 24@5x5/2,
    36@5x5/2, 48@5x5/2, 64@3x3, 64@3x3 (ELU), flatten (64 x 1 x 18), dropout.

    ``preprocess`` takes raw (N, 160, 320, 3) RGB frames or (N, 66, 200, 3) frames already
    through :func:`agent.data.udacity.preprocess` (what training batches hold).

    Raises:
        ValueError: frames of any other shape.
    """

    def __init__(self, obs_shape=(160, 320, 3), dropout: float = 0.5):
        super().__init__()
        from agent.data.udacity import FRAME_SHAPE, INPUT_SHAPE

        if tuple(int(s) for s in obs_shape) != tuple(FRAME_SHAPE):
            raise ValueError(f"PilotNet reads the Udacity camera's 160x320x3 frames, got obs_shape {tuple(obs_shape)}")
        self.obs_shape, self.input_shape = tuple(FRAME_SHAPE), tuple(INPUT_SHAPE)
        self.convs = nn.Sequential(
            nn.Conv2d(3, 24, 5, stride=2), nn.ELU(),  # (N, 24, 31, 98)
            nn.Conv2d(24, 36, 5, stride=2), nn.ELU(),  # (N, 36, 14, 47)
            nn.Conv2d(36, 48, 5, stride=2), nn.ELU(),  # (N, 48, 5, 22)
            nn.Conv2d(48, 64, 3), nn.ELU(),  # (N, 64, 3, 20)
            nn.Conv2d(64, 64, 3), nn.ELU(),  # (N, 64, 1, 18)
        )
        with torch.no_grad():  # dry run for the flatten size
            self.features_dim = int(self.convs(torch.zeros(1, 3, *self.input_shape[:2])).numel())
        self.dropout = nn.Dropout(dropout)

    def preprocess(self, obs) -> Tensor:
        """(N, 160, 320, 3) raw RGB or (N, 66, 200, 3) preprocessed YUV uint8 -> (N, 3, 66, 200) in [-1, 1]."""
        from agent.data.udacity import preprocess

        arr = obs.detach().cpu().numpy() if isinstance(obs, Tensor) else np.asarray(obs)
        shape = tuple(arr.shape[1:])
        if shape == self.obs_shape:
            arr = preprocess(arr)
        elif shape != self.input_shape:
            raise ValueError(f"frames must be (N, 160, 320, 3) raw RGB or (N, 66, 200, 3) preprocessed YUV, "
                             f"got {tuple(arr.shape)}")
        x = torch.from_numpy(np.ascontiguousarray(arr)).to(self._device())
        return x.permute(0, 3, 1, 2).float() / 127.5 - 1.0  # (N, 3, 66, 200)

    def from_preprocessed(self, x: Tensor) -> Tensor:
        """(N, 3, 66, 200) -> (N, 1152)."""
        return self.dropout(self.convs(x).flatten(1))

    @property
    def last_conv(self) -> nn.Conv2d:
        return self.convs[-2]

    def region(self, frame_hw: tuple[int, int]) -> tuple[int, int, int, int]:
        """Rows 60..135 of a 160-row frame (scaled for other heights), all columns."""
        from agent.data.udacity import CROP_ROWS

        h, w = int(frame_hw[0]), int(frame_hw[1])
        return round(CROP_ROWS[0] * h / self.obs_shape[0]), round(CROP_ROWS[1] * h / self.obs_shape[0]), 0, w


#: Features extractors by name (the policy file stores the name and its keyword arguments).
FEATURES = {"carracing-cnn": CarRacingCNN, "pilotnet": PilotNet}


def make_features(name: str, **kwargs) -> FeaturesExtractor:
    """Build a features extractor by name.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in FEATURES:
        raise ValueError(f"unknown features extractor {name!r}; choose one of {', '.join(FEATURES)}")
    return FEATURES[name](**kwargs)


__all__ = ["FEATURES", "CarRacingCNN", "FeaturesExtractor", "PilotNet", "make_features"]
