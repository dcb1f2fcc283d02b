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

# the dashboard's geometry lives with the env that draws it (re-exported here, where the CNN reads it)
from agent.data.udacity import CROP_ROWS, FRAME_SHAPE, INPUT_SHAPE, preprocess
from envs.carracing import SPEEDOMETER_FULL_SCALE, dashboard_rows, speed_bar_columns, speedometer_region


class FeaturesExtractor(nn.Module):
    """Base class: ``forward(obs (N, H, W, C)) -> (N, F)`` = ``from_preprocessed(preprocess(obs))``.

    Attributes:
        obs_shape: (H, W, C) of the raw frames it reads.
        features_dim: F.
    """

    obs_shape: tuple[int, int, int]
    features_dim: int
    #: True when the input also holds the previous frame (``preprocess(obs, prev)``, motion channels)
    uses_previous: bool = False

    def preprocess(self, obs, prev=None) -> Tensor:  # pragma: no cover - abstract
        """Raw frames (N, H, W, C) uint8 (array or tensor; ``prev`` the frames before them, for
        motion channels) -> the network input (N, C', H', W') float32 (cropped, scaled to [0, 1],
        the blanked regions set to 0)."""
        raise NotImplementedError

    def from_preprocessed(self, x: Tensor, *, scratch: bool = False) -> Tensor:  # pragma: no cover - abstract
        """(N, C', H', W') -> (N, F). ``scratch``: x is the caller's scratch tensor (made by
        ``preprocess`` for this call alone, no gradient asked of it), which the extractor may change
        in place instead of copying it."""
        raise NotImplementedError

    @property
    def last_conv(self) -> nn.Conv2d:  # pragma: no cover - abstract
        """The last convolution: Grad-CAM's target layer (Selvaraju et al. 2017, section 3)."""
        raise NotImplementedError

    def region(self, frame_hw: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, bottom, left, right) of the raw frame the network input covers: all of it."""
        return 0, int(frame_hw[0]), 0, int(frame_hw[1])

    def readable(self, frame_hw: tuple[int, int]) -> np.ndarray:
        """(H, W) float32 weights of the raw frame's pixels: 1 where the network reads the pixel,
        0 where ``preprocess`` blanks it (constant input that carries nothing). All ones here."""
        return np.ones((int(frame_hw[0]), int(frame_hw[1])), np.float32)

    def forward(self, obs, prev=None) -> Tensor:
        """(N, H, W, C) raw frames (and, for extractors that use it, the (N, H, W, C) frames one
        step earlier; None = the same frames, no motion) -> (N, F) features."""
        return self.from_preprocessed(self.preprocess(obs, prev))

    def _device(self) -> torch.device:
        return next(self.parameters()).device


def dashboard_mask(height: int, width: int, dashboard: str) -> np.ndarray:
    """(H, W) float32: 1 where a :class:`CarRacingCNN` with this ``dashboard`` mode reads the pixel,
    0 where ``"speed"`` blanks it (the strip except the speed bar), where ``"speedometer"`` does
    (the strip except the speed bar and :func:`envs.carracing.speedometer_region`) and where
    ``"speed-input"`` does (the whole strip: its speed reaches the network as a number, not through
    the convolutions); all ones otherwise (``"hidden"`` crops instead of blanking, see
    :meth:`CarRacingCNN.region`)."""
    mask = np.ones((height, width), np.float32)
    if dashboard == "speed-input":
        mask[height - dashboard_rows(height):] = 0.0
        return mask
    if dashboard in ("speed", "speedometer"):
        c0, c1 = speed_bar_columns(width)
        strip = dashboard_rows(height)
        mask[height - strip:, :c0] = 0.0
        mask[height - strip:, c1:] = 0.0
    if dashboard == "speedometer":
        top, bottom, left, right = speedometer_region(height, width)
        mask[top:bottom, left:right] = 1.0
    return mask


class CarRacingCNN(FeaturesExtractor):
    """The paper's CarRacing CNN: (N, 96, 96, 3) uint8 -> (N, F) features.

    Conv 10@3x3/2, 20@5x5/2, 30@5x5/2 with ReLU, then dropout (arXiv 2512.10282, Appendix D).
    Input: x / 255 in [0, 1], channels first. F = 30 x 9 x 9 = 2430 for 96x96 frames.

    The dashboard. CarRacing draws a black strip over the bottom eighth of the frame (rows 84-95
    of 96) with the score, the speed bar (columns 12-14), the four ABS bars, the steering
    indicator and the gyroscope. The steering and wheel indicators show the car's *current
    controls*, so a student that reads them predicts the expert's next action from its own last
    one: the causal confusion of behaviour cloning (de Haan, Jayaraman and Levine, "Causal
    Confusion in Imitation Learning", NeurIPS 2019). ``dashboard`` chooses what the CNN sees:

    - ``"visible"``: the whole frame (the paper's input, and the files made before this option);
    - ``"speed"``: the strip blanked to black except the speed bar, a legitimate state;
    - ``"hidden"``: the strip cropped away (input (H - H/8) x W); speed is left to the window;
    - ``"speedometer"``: as ``"speed"``, plus a legible speedometer the env draws into the strip
      (:func:`envs.carracing.draw_speedometer`: 6.4 pixels per unit/s; gymnasium's bar changes
      by about one pixel's brightness per 8-10 units/s). Its frames come from
      ``make_carracing(speedometer=True)``, and recorded frames are redrawn from their recorded
      speeds for training (:meth:`agent.data.recordings.Demonstrations.with_speedometer`).
    - ``"speed-input"``: the speed as a measurement beside the image, not a picture in it: the
      whole strip is blanked before the convolutions, and the speed (units/s) is read exactly off
      the same drawn speedometer (:meth:`read_speed`; the frames carry it, so recordings, DAgger,
      ``drive`` and ``agent evaluate`` need no second input) and added to the features through a
      small embedding, s / 100 -> Linear(1, 16) -> tanh -> Linear(16, F). This is the measured
      speed input of conditional imitation learning (Codevilla et al., "End-to-end Driving via
      Conditional Imitation Learning", ICRA 2018). Grad-CAM then covers the image pathway only,
      and the convolutions read no pixel of the strip. The embedding's last layer starts at zero,
      so a policy switched to this mode (:meth:`agent.nn.policy.DrivingPolicy.with_dashboard`)
      starts as the same network without its view of the strip.

    Motion. Four frames 20 ms apart barely show how fast the car moves or turns, and a car at a
    standstill sees the same frame again and again, so a deterministic policy that brakes there
    brakes forever. With ``motion=True`` the first convolution also reads the difference from
    the previous frame (2C input channels: the frame in [0, 1], then frame - previous in
    [-1, 1]): zero exactly at a standstill, and a shifted or rotated road edge when moving or
    turning. This is the frame stacking of Mnih et al. 2015's Atari agents (four frames there),
    reduced to one previous frame and written as a difference. The
    previous frame of an episode's first step is the frame itself (no motion).

    Args:
        obs_shape: (H, W, C) of the frames.
        channels: output channels of the three convolutions.
        dropout: dropout on the flattened features (paper: 0.2).
        dashboard: "visible", "speed", "hidden", "speedometer" or "speed-input" (above).
        motion: also read the difference from the previous frame (above).

    Raises:
        ValueError: ``obs_shape`` is not (H, W, C), or too small for the convolutions; an unknown
            ``dashboard``.
    """

    DASHBOARD_MODES = ("visible", "speed", "hidden", "speedometer", "speed-input")
    #: width of the speed embedding's hidden layer (``"speed-input"``)
    SPEED_EMBED_UNITS = 16

    def __init__(self, obs_shape=(96, 96, 3), channels=(10, 20, 30), dropout: float = 0.2,
                 dashboard: str = "visible", motion: bool = False):
        super().__init__()
        shape = tuple(int(s) for s in obs_shape)
        if len(shape) != 3:
            raise ValueError(f"CarRacingCNN needs image observations (H, W, C), got shape {shape}")
        if dashboard not in self.DASHBOARD_MODES:
            raise ValueError(f"dashboard must be one of {', '.join(self.DASHBOARD_MODES)}, got {dashboard!r}")
        h, w, c = shape
        self.obs_shape, self.dashboard, self.motion = shape, dashboard, bool(motion)
        self.uses_previous = self.motion
        c_in = 2 * c if self.motion else c
        self.register_buffer("dashboard_mask", torch.from_numpy(dashboard_mask(h, w, dashboard))[None, None],
                             persistent=False)
        mask = self.dashboard_mask[0, 0]
        # the first row the mask blanks anything in (rows above it are all ones): in-place blanking
        # multiplies only from there on (x * 1 is x, so the result is the same)
        self._blank_from = int((mask < 1).any(1).nonzero()[0, 0]) if bool((mask < 1).any()) else h
        self.input_rows = h - dashboard_rows(h) if dashboard == "hidden" else h
        h = self.input_rows
        self.cnn = nn.Sequential(
            nn.Conv2d(c_in, channels[0], 3, stride=2), nn.ReLU(),
            nn.Conv2d(channels[0], channels[1], 5, stride=2), nn.ReLU(),
            nn.Conv2d(channels[1], channels[2], 5, stride=2), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():  # dry run for the flatten size
            try:
                self.features_dim = int(self.cnn(torch.zeros(1, c_in, h, w)).shape[1])
            except RuntimeError as exc:
                raise ValueError(f"observation {shape} is too small for the CNN: {exc}") from exc
        self.dropout = nn.Dropout(dropout)
        self.speed_embed = None
        if dashboard == "speed-input":
            if c != 3:
                raise ValueError(f"dashboard='speed-input' reads the speedometer from RGB frames, got {c} channels")
            self.speed_embed = nn.Sequential(nn.Linear(1, self.SPEED_EMBED_UNITS), nn.Tanh(),
                                             nn.Linear(self.SPEED_EMBED_UNITS, self.features_dim))
            nn.init.zeros_(self.speed_embed[-1].weight)
            nn.init.zeros_(self.speed_embed[-1].bias)

    def preprocess(self, obs, prev=None) -> Tensor:
        """(N, H, W, C) frames in [0, 255] (uint8 or float; array or tensor) -> (N, C, H', W) float in [0, 1],
        with the dashboard blanked (``"speed"``, ``"speedometer"``; H' = H) or cropped
        (``"hidden"``, H' = H - H/8). ``"speed-input"`` leaves the strip in (H' = H):
        :meth:`from_preprocessed` reads the speed off it, then blanks it before the convolutions.
        With ``motion``: (N, 2C, H', W), the frame then frame - ``prev`` (the (N, H, W, C) frames
        one step earlier; None: no motion, the difference is 0); without it ``prev`` is ignored.

        Raises:
            ValueError: frames (or previous frames) of another shape than ``obs_shape``.
        """
        blank = self.dashboard in ("speed", "speedometer")
        if not self.motion:
            x = self._frames(obs)
        elif torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in (obs, prev)):
            # frames that need a gradient: differentiable, out-of-place operations
            x = self._frames(obs)
            x = torch.cat([x, x - (x if prev is None else self._frames(prev))], dim=1)
        else:
            # the same values with fewer passes over memory and no (N, 2C, H, W) temporaries (the
            # training step's input: 256 frames are 57 MB of float32, and each fresh allocation that
            # size costs its page faults): both frames scaled in place, the difference written over
            # the previous frame, one concatenation along the channels of the (N, H, W, 2C) layout,
            # and the channels-first view of it, the same strides the concatenation of the
            # channels-first views gave (so the convolutions compute exactly as before)
            x = self._frames_hwc(obs).div_(255.0)
            d = x.clone() if prev is None else self._frames_hwc(prev).div_(255.0)
            x = torch.cat([x, torch.sub(x, d, out=d)], dim=-1).permute(0, 3, 1, 2)
            if blank:
                return self._blank_in_place(x)
        if self.dashboard == "hidden":
            return x[:, :, : self.input_rows]
        if blank:
            return x * self.dashboard_mask
        return x

    def _blank_in_place(self, x: Tensor) -> Tensor:
        """x * dashboard_mask, written into x (N, C, H, W): only the rows the mask blanks anything in."""
        x[:, :, self._blank_from:].mul_(self.dashboard_mask[:, :, self._blank_from:])
        return x

    def _frames(self, obs) -> Tensor:
        """(N, H, W, C) in [0, 255] -> (N, C, H, W) float in [0, 1] on the weights' device."""
        x = obs if isinstance(obs, Tensor) else torch.from_numpy(np.ascontiguousarray(obs))
        self._check_frames(x)
        return x.to(self._device()).float().permute(0, 3, 1, 2) / 255.0

    def _frames_hwc(self, obs) -> Tensor:
        """(N, H, W, C) in [0, 255] -> a new (N, H, W, C) float32 tensor on the weights' device (not
        scaled; never the caller's own tensor, so it may be changed in place)."""
        x = obs if isinstance(obs, Tensor) else torch.from_numpy(np.ascontiguousarray(obs))
        self._check_frames(x)
        return x.to(device=self._device(), dtype=torch.float32, copy=True)

    def _check_frames(self, x: Tensor) -> None:
        if tuple(x.shape[1:]) != self.obs_shape:
            raise ValueError(f"frames must be (N, {', '.join(map(str, self.obs_shape))}), got {tuple(x.shape)}")

    def from_preprocessed(self, x: Tensor, *, scratch: bool = False) -> Tensor:
        """(N, C, H', W) preprocessed frames ((N, 2C, H', W) with motion) -> (N, F).
        ``"speed-input"``: the convolutions' features of the frames with the strip blanked, plus
        the embedding of :meth:`read_speed`. ``scratch``: x may be blanked in place (see
        :meth:`FeaturesExtractor.from_preprocessed`; the same values, without a copy of x)."""
        if self.speed_embed is None:
            return self.dropout(self.cnn(x))
        speed = self.read_speed(x)  # (N,) units/s
        in_place = scratch and not (torch.is_grad_enabled() and x.requires_grad)
        feats = self.dropout(self.cnn(self._blank_in_place(x) if in_place else x * self.dashboard_mask))
        return feats + self.speed_embed((speed / SPEEDOMETER_FULL_SCALE)[:, None].to(feats.dtype))

    def read_speed(self, x: Tensor) -> Tensor:
        """(N, C', H, W) preprocessed frames (the frame's C = 3 channels first, in [0, 1]) -> (N,)
        the speed in units/s drawn by :func:`envs.carracing.draw_speedometer`: the bar's columns
        add up to ``speed / SPEEDOMETER_FULL_SCALE`` of its width (its last column partly), so the
        mean over its rows and channels of that sum, / width x full scale, is the speed, to
        1/255 of a column (0.005 units/s); speeds above full scale (100 units/s) read as 100. A
        frame without the speedometer drawn reads whatever its strip holds there (gymnasium's
        indicators): draw it first (``make_carracing(speedometer=True)``,
        :meth:`agent.data.recordings.Demonstrations.with_speedometer`)."""
        top, bottom, left, right = speedometer_region(x.shape[-2], x.shape[-1])
        bar = x[:, :3, top:bottom, left:right]
        return bar.sum(dim=-1).mean(dim=(1, 2)) / (right - left) * SPEEDOMETER_FULL_SCALE

    def readable(self, frame_hw: tuple[int, int]) -> np.ndarray:
        """(H, W) float32: 0 on the blanked dashboard pixels of ``"speed"`` (everything but the speed
        bar), ``"speedometer"`` (everything but the speed bar and the speedometer) and
        ``"speed-input"`` (the whole strip), 1 elsewhere.
        Grad-CAM's coarse map (9x9 cells, upsampled) bleeds into pixels the network cannot read;
        the saliency overlay multiplies by this, as it leaves out the crop."""
        return dashboard_mask(int(frame_hw[0]), int(frame_hw[1]), self.dashboard)

    def region(self, frame_hw: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, bottom, left, right) of the raw frame the input covers (without the strip when hidden)."""
        h, w = int(frame_hw[0]), int(frame_hw[1])
        return 0, (h - dashboard_rows(h) if self.dashboard == "hidden" else h), 0, w

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

    def preprocess(self, obs, prev=None) -> Tensor:
        """(N, 160, 320, 3) raw RGB or (N, 66, 200, 3) preprocessed YUV uint8 -> (N, 3, 66, 200) in [-1, 1].
        ``prev`` is ignored (PilotNet reads one frame)."""
        arr = obs.detach().cpu().numpy() if isinstance(obs, Tensor) else np.asarray(obs)
        shape = tuple(arr.shape[1:])
        if shape == self.obs_shape:
            arr = preprocess(arr)
        elif shape != self.input_shape:
            raise ValueError(f"frames must be (N, 160, 320, 3) raw RGB or (N, 66, 200, 3) preprocessed YUV, "
                             f"got {tuple(arr.shape)}")
        x = torch.from_numpy(np.ascontiguousarray(arr)).to(self._device())
        return x.permute(0, 3, 1, 2).float() / 127.5 - 1.0  # (N, 3, 66, 200)

    def from_preprocessed(self, x: Tensor, *, scratch: bool = False) -> Tensor:
        """(N, 3, 66, 200) -> (N, 1152)."""
        return self.dropout(self.convs(x).flatten(1))

    @property
    def last_conv(self) -> nn.Conv2d:
        return self.convs[-2]

    def region(self, frame_hw: tuple[int, int]) -> tuple[int, int, int, int]:
        """Rows 60..135 of a 160-row frame (scaled for other heights), all columns."""
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
