"""Temporal cores: a sequence of frame features -> a sequence of outputs, behind one interface.

Shapes: B batch, T window (frames), D input features (the features extractor's F), d the
core's output width.

Every core is a causal function of the last ``window`` frames:

- ``forward(x (B, T, D), t (B, T) seconds or None, mask (B, T) bool or None) -> (B, T, d)``:
  position i sees frames <= i of the window; ``mask`` False marks padding (before an episode's
  first frame, or after its last), which no real position depends on.
- ``step(x_t (B, D), state, t (B,) seconds or None) -> (y (B, d), state)``: the streaming call.
  It equals ``forward``'s last position over the same window of the last ``window`` frames, so
  what the policy learned on windows is exactly what it does when it drives.
- ``reset_rows(state, rows (B,) bool) -> state``: forget the frames of the rows whose episode
  restarts (stable-baselines3's ``episode_start``).

Cores, by the name ``agent train --core`` takes (:data:`CORES`):

- ``nac-steady``, ``nac-exact``, ``nac-euler``: our Neuronal Attention Circuit
  (:mod:`agent.nn.nac`, arXiv 2512.10282) in its three modes; ``step`` attends the newest query
  over a cache of the window's keys (one query, not T).
- ``lstm``, ``gru``: torch's recurrent layers, run over the window from a zero state.
- ``cfc``, ``ltc``: ncps's closed-form continuous-time cell and liquid time-constant cell
  (Hasani et al. 2022, 2021), with the time between frames as their timespans (in units of the
  nominal frame interval, so regular sampling gives 1.0).
- ``mha``: causal torch ``MultiheadAttention`` over the window, with a per-head linear bias on
  the age of each key in frames (ALiBi, Press et al. 2022, with real time in place of positions).
- ``none``: no memory: the features of the window's frames are concatenated (frame stacking)
  and mapped by a dense layer; with a 1-frame window it sees only the newest frame.
- ``torch-nac``: the authors' port (PyPI ``torch-nac`` 0.0.2, ``pip install -e ".[peers]"``), for
  comparison only. Its top-k selector is not causal, so ``causal`` is False and the trainer
  scores only the last position of each window.

The windowed recurrent, attention and stacking cores keep the window's features as their
streaming state (:class:`WindowState`) and run ``forward`` on it: a step costs one core pass over
at most ``window`` feature vectors (never a CNN pass).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.nn.nac import NAC, NACCache, SparseLinear


# --------------------------------------------------------------------------------------------
# Streaming state of the windowed cores
# --------------------------------------------------------------------------------------------


@dataclass
class WindowState:
    """The last L <= window frames of each row: x (B, L, D), t (B, L) seconds or None, mask (B, L)."""

    x: Tensor
    t: Tensor | None
    mask: Tensor

    def reset_rows(self, rows: Tensor) -> "WindowState":
        """The state with the rows where ``rows`` (B,) bool is True emptied (all positions masked)."""
        return WindowState(self.x, self.t, self.mask & ~rows.to(self.mask.device)[:, None])


def _check_step(core: "TemporalCore", x: Tensor, t: Tensor | None) -> None:
    if x.dim() != 2 or x.shape[-1] != core.input_dim:
        raise ValueError(f"x must be (B, {core.input_dim}), got {tuple(x.shape)}")
    if t is not None and t.numel() != x.shape[0]:
        raise ValueError(f"t must be (B,) = ({x.shape[0]},), got {tuple(t.shape)}")


def _check_forward(core: "TemporalCore", x: Tensor, t: Tensor | None, mask: Tensor | None) -> None:
    if x.dim() != 3 or x.shape[-1] != core.input_dim:
        raise ValueError(f"x must be (B, T, {core.input_dim}), got {tuple(x.shape)}")
    for name, a in (("t", t), ("mask", mask)):
        if a is not None and tuple(a.shape) != tuple(x.shape[:2]):
            raise ValueError(f"{name} must be (B, T) = {tuple(x.shape[:2])}, got {tuple(a.shape)}")


class TemporalCore(nn.Module):
    """Base class of the cores (see the module docstring for the contract).

    Attributes:
        name: the ``--core`` name.
        input_dim: D. output_dim: d. window: frames a step sees (the newest included).
        causal: position i of ``forward`` depends on frames <= i only.
        has_intermediates: ``forward``/``step`` can return NAC intermediates (phi, omega, ...).
    """

    name = "core"
    causal = True
    has_intermediates = False

    def __init__(self, input_dim: int, output_dim: int, window: int, frame_dt: float):
        super().__init__()
        if input_dim < 1 or output_dim < 1 or window < 1 or frame_dt <= 0:
            raise ValueError(f"input_dim, output_dim and window must be >= 1 and frame_dt > 0 s, got "
                             f"{input_dim}, {output_dim}, {window}, {frame_dt}")
        self.input_dim, self.output_dim, self.window, self.frame_dt = input_dim, output_dim, window, frame_dt

    def forward(self, x: Tensor, t: Tensor | None = None, mask: Tensor | None = None,
                return_intermediates: bool = False):  # pragma: no cover - abstract
        """(B, T, input_dim) features of a window -> (B, T, output_dim), one output per position,
        each reading that position and the ones before it.

        ``t`` (B, T) frame times in seconds (None: evenly spaced ``frame_dt`` apart); ``mask``
        (B, T) bool, False at padding; with ``return_intermediates`` also the core's internals
        (NAC's phi, omega and logits; None for cores without them) as a second value.
        """
        raise NotImplementedError

    def step(self, x: Tensor, state=None, t: Tensor | None = None, return_intermediates: bool = False):
        """Streaming step (see the module docstring): the window's features as state, forward on it.

        Returns:
            (y (B, d), state), or (y, state, intermediates) with ``return_intermediates``
            (None for cores without them).
        """
        _check_step(self, x, t)
        B = x.shape[0]
        new_t = t.reshape(B, 1) if t is not None else None
        ones = torch.ones(B, 1, dtype=torch.bool, device=x.device)
        if state is None:
            state = WindowState(x[:, None], new_t, ones)
        else:
            if (t is None) != (state.t is None):
                raise ValueError("give timestamps on every streaming step or on none")
            state = WindowState(torch.cat([state.x, x[:, None]], 1)[:, -self.window:],
                                torch.cat([state.t, new_t.to(state.t.dtype)], 1)[:, -self.window:]
                                if new_t is not None else None,
                                torch.cat([state.mask, ones], 1)[:, -self.window:])
        y = self.forward(state.x, state.t, state.mask)[:, -1]
        return (y, state, None) if return_intermediates else (y, state)

    def reset_rows(self, state, rows: Tensor):
        """``state`` with the rows where ``rows`` (B,) is True restarted (None stays None)."""
        return None if state is None else state.reset_rows(rows)

    def _timespans(self, t: Tensor | None, mask: Tensor | None, B: int, T: int, device, dtype) -> Tensor:
        """(B, T) time since the previous real frame in units of ``frame_dt`` (1.0 for a row's first
        real frame of the window, at masked positions, and everywhere when no timestamps are given).

        Masked positions (the zero-time padding after a short window's real frames) get 1.0, not a
        span computed from their meaningless times: the padding's t = 0 after real frames gave a
        span of 0 there, and the LTC cell divides by the span (its capacitance term), so its output
        at the padding was NaN and, through the masked loss, every gradient was NaN (the first LTC
        cell of ``results/compare-carracing`` trained on NaN from its first epoch).
        """
        if t is None:
            return torch.ones(B, T, device=device, dtype=dtype)
        t64 = t.to(device=device, dtype=torch.float64)
        out = torch.ones(B, T, device=device, dtype=torch.float64)
        prev = torch.full((B,), float("nan"), device=device, dtype=torch.float64)
        for i in range(T):  # T is a window of a few frames
            real = mask[:, i].to(device) if mask is not None else torch.ones(B, dtype=torch.bool, device=device)
            out[:, i] = torch.where(torch.isnan(prev) | ~real, 1.0, (t64[:, i] - prev) / self.frame_dt)
            prev = torch.where(real, t64[:, i], prev)
        return out.clamp(min=0.0).to(dtype)

    def extra_repr(self) -> str:
        """The sizes shown by ``print(module)``."""
        return f"input_dim={self.input_dim}, output_dim={self.output_dim}, window={self.window}"


# --------------------------------------------------------------------------------------------
# NAC
# --------------------------------------------------------------------------------------------


class NACCore(TemporalCore):
    """Our NAC layer (:class:`agent.nn.nac.NAC`) as a core; ``mode`` steady, exact or euler.

    The frames' timestamps (seconds) are NAC's time input; without them, frame k of a window is
    at k * ``frame_dt``. ``step`` uses the layer's cache (one query over the cached keys).

    Args:
        num_heads, topk, sparsity, selector, seed, ...: see :class:`agent.nn.nac.NAC`.
        input_norm: pass the features through a ``LayerNorm(D)`` first (off by default: the
            paper's NAC has none, and the CarRacing policies train without it). Tried because
            PilotNet's features are small at initialisation (std about 0.03 on Udacity frames)
            and NAC-Exact's loss stayed flat on 2 of 6 leave-one-driver-out folds; with it the
            loss stayed flat on the two folds tried, so it is not the fix there (README, "Other
            drivers"). Kept as an option for experiments (``--core-option input_norm=true``).
    """

    causal = True
    has_intermediates = True

    def __init__(self, input_dim: int, output_dim: int, window: int, frame_dt: float, mode: str = "steady",
                 num_heads: int = 16, topk: int = 8, sparsity: float = 0.5, selector: str = "exact",
                 seed: int = 22222, input_norm: bool = False, **nac_kwargs):
        super().__init__(input_dim, output_dim, window, frame_dt)
        self.name = f"nac-{mode}"
        self.norm = nn.LayerNorm(input_dim) if input_norm else None
        self.nac = NAC(input_dim, output_dim, num_heads, topk=topk, mode=mode, sparsity=sparsity, causal=True,
                       selector=selector, seed=seed, **nac_kwargs)

    def _times(self, t: Tensor | None, B: int, T: int, device) -> Tensor:
        if t is not None:
            return t.to(device)
        return torch.arange(T, device=device, dtype=torch.float32).expand(B, T) * self.frame_dt

    def forward(self, x, t=None, mask=None, return_intermediates=False):
        """(B, T, D) -> (B, T, d) [, NACIntermediates]."""
        _check_forward(self, x, t, mask)
        B, T, _ = x.shape
        if self.norm is not None:
            x = self.norm(x)
        return self.nac(x, t=self._times(t, B, T, x.device), mask=None if mask is None else mask.to(x.device),
                        return_intermediates=return_intermediates)

    def step(self, x, state: NACCache | None = None, t=None, return_intermediates=False):
        """(B, D) newest features -> (B, d); the state is the NAC cache of the window."""
        _check_step(self, x, t)
        B = x.shape[0]
        if self.norm is not None:
            x = self.norm(x)
        if t is None:  # the newest frame sits one frame_dt after the previous one (NAC reads only ages)
            t = torch.zeros(B, dtype=torch.float32, device=x.device) if state is None else \
                state.times[:, -1].to(torch.float32) + self.frame_dt
        return self.nac.step(x, state, t=t.to(x.device), window=self.window, return_intermediates=return_intermediates)


# --------------------------------------------------------------------------------------------
# Recurrent cores
# --------------------------------------------------------------------------------------------


class _RecurrentCore(TemporalCore):
    """A one-step cell looped over the window from a zero state; a masked frame leaves the state as
    it is (so a left-padded window equals the window of its real frames)."""

    def _cell(self, x_i: Tensor, h, ts_i: Tensor):  # (B, D), state, (B, 1) -> (y (B, d), state)
        raise NotImplementedError

    def _zero(self, B: int, device, dtype):
        raise NotImplementedError

    def forward(self, x, t=None, mask=None, return_intermediates=False):
        _check_forward(self, x, t, mask)
        B, T, _ = x.shape
        ts = self._timespans(t, mask, B, T, x.device, x.dtype)  # (B, T)
        h = self._zero(B, x.device, x.dtype)
        ys = []
        for i in range(T):
            y, h_new = self._cell(x[:, i], h, ts[:, i:i + 1])
            if mask is not None:
                m = mask[:, i].to(x.device)[:, None]
                h = tuple(torch.where(m, a, b) for a, b in zip(h_new, h)) if isinstance(h, tuple) \
                    else torch.where(m, h_new, h)
            else:
                h = h_new
            ys.append(y)
        y = torch.stack(ys, 1)  # (B, T, d)
        return (y, None) if return_intermediates else y


class LSTMCore(_RecurrentCore):
    """torch ``nn.LSTM`` (one layer, hidden d) over the window; the unmasked case is one fused call.

    The input features pass a ``LayerNorm(D)`` first. Without it the LSTM did not train on the
    CarRacing CNN's features: their scale grows during training (std 0.03 at initialisation,
    1.4-2.4 after one epoch over D = 2430 unnormalised features), the gate pre-activations
    saturate, and the policy fell to the majority action (held-out accuracy 0.740 in every
    epoch, at learning rates 1e-3 and 3e-4).
    """

    name = "lstm"

    def __init__(self, input_dim, output_dim, window, frame_dt):
        super().__init__(input_dim, output_dim, window, frame_dt)
        self.norm = nn.LayerNorm(input_dim)
        self.rnn = self._rnn(input_dim, output_dim)

    @staticmethod
    def _rnn(input_dim, output_dim):
        return nn.LSTM(input_dim, output_dim, batch_first=True)

    def _zero(self, B, device, dtype):
        z = torch.zeros(1, B, self.output_dim, device=device, dtype=dtype)
        return z, z

    def _cell(self, x_i, h, ts_i):
        y, h = self.rnn(self.norm(x_i)[:, None], h)
        return y[:, 0], h

    def forward(self, x, t=None, mask=None, return_intermediates=False):
        if mask is None or bool(mask.all()):
            _check_forward(self, x, t, mask)
            y = self.rnn(self.norm(x))[0]
            return (y, None) if return_intermediates else y
        return super().forward(x, t, mask, return_intermediates)


class GRUCore(LSTMCore):
    """torch ``nn.GRU`` (one layer, hidden d) over the window, after the same ``LayerNorm(D)``
    as :class:`LSTMCore`."""

    name = "gru"

    @staticmethod
    def _rnn(input_dim, output_dim):
        return nn.GRU(input_dim, output_dim, batch_first=True)

    def _zero(self, B, device, dtype):
        return torch.zeros(1, B, self.output_dim, device=device, dtype=dtype)


class CfCCore(_RecurrentCore):
    """ncps ``CfCCell`` (closed-form continuous-time, Hasani et al. 2022) with timespans from t,
    after the same input ``LayerNorm(D)`` as :class:`LSTMCore`, for the same reason: without it the
    first CfC cell of the comparison fell to the majority action (held-out accuracy 0.7403 in
    every BC epoch, ``results/compare-carracing``, the run stopped and redone).

    Args:
        backbone_units, backbone_layers: the cell's backbone (ncps defaults: 128, 1).
    """

    name = "cfc"

    def __init__(self, input_dim, output_dim, window, frame_dt, backbone_units: int = 64, backbone_layers: int = 1):
        super().__init__(input_dim, output_dim, window, frame_dt)
        from ncps.torch import CfCCell

        self.norm = nn.LayerNorm(input_dim)
        self.cell = CfCCell(input_dim, output_dim, backbone_units=backbone_units, backbone_layers=backbone_layers)

    def _zero(self, B, device, dtype):
        return torch.zeros(B, self.output_dim, device=device, dtype=dtype)

    def _cell(self, x_i, h, ts_i):
        return self.cell(self.norm(x_i), h, ts_i)


#: Smallest elapsed time the LTC cell is given, in units of frame_dt (see :meth:`LTCCore._cell`).
LTC_MIN_SPAN = 1e-3


class LTCCore(_RecurrentCore):
    """ncps ``LTCCell`` (liquid time-constant, Hasani et al. 2021) on a fully connected wiring of
    d neurons, after the same input ``LayerNorm(D)`` as :class:`LSTMCore` and a dense projection
    D -> ``input_units`` with a tanh (the cell's sensory synapses cost 4 x inputs x neurons
    parameters); elapsed time from t.

    ``ode_unfolds`` defaults to 1 (one fused semi-implicit Euler step per frame, as NAC-Euler
    takes one step), not ncps's 6. Measured: with 6 unfolds the cell learned neither the tests'
    memory task (chance, 0.24-0.26 on four seeds, with or without the ``LayerNorm``) nor CarRacing
    (the first comparison cell kept the majority action, held-out accuracy 0.7403 in all four BC
    epochs); with 1 unfold and the ``LayerNorm`` it solved the memory task on every seed (1.000).

    Args:
        input_units: width of the projection the cell reads.
        ode_unfolds: solver steps per frame.
    """

    name = "ltc"

    def __init__(self, input_dim, output_dim, window, frame_dt, input_units: int = 64, ode_unfolds: int = 1):
        super().__init__(input_dim, output_dim, window, frame_dt)
        from ncps.torch import LTCCell
        from ncps.wirings import FullyConnected

        self.norm = nn.LayerNorm(input_dim)
        self.proj = nn.Linear(input_dim, input_units)
        self.cell = LTCCell(FullyConnected(output_dim, output_dim), input_units, ode_unfolds=ode_unfolds,
                            implicit_param_constraints=True)

    def _zero(self, B, device, dtype):
        return torch.zeros(B, self.output_dim, device=device, dtype=dtype)

    def _cell(self, x_i, h, ts_i):
        # the cell divides by the span (cm / (span / ode_unfolds)): two frames with the same
        # timestamp must not make it 0
        return self.cell(torch.tanh(self.proj(self.norm(x_i))), h, ts_i.clamp(min=LTC_MIN_SPAN))


# --------------------------------------------------------------------------------------------
# Attention and no memory
# --------------------------------------------------------------------------------------------


class MHACore(TemporalCore):
    """Causal torch ``nn.MultiheadAttention`` over the window with a time bias on each key's age.

    y = LayerNorm(h + MHA(h)), h = W x + E(p): p is a frame's time since the window's first real
    frame in units of ``frame_dt``, E a linear map of sin/cos features of p (as a transformer's
    positional encoding; without it a key could only be weighted by a monotone function of its age).
    Head j adds -m_j * age/frame_dt to the logit of a key ``age`` seconds older than the query
    (slopes m_j = 2^(-8 j / H), ALiBi); keys after the query and masked keys get no weight (a query
    always sees itself, so no row is empty).
    """

    name = "mha"

    def __init__(self, input_dim, output_dim, window, frame_dt, num_heads: int = 4, dropout: float = 0.0):
        super().__init__(input_dim, output_dim, window, frame_dt)
        if output_dim % num_heads:
            raise ValueError(f"mha: output_dim {output_dim} must be divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.proj = nn.Linear(input_dim, output_dim)
        self.attn = nn.MultiheadAttention(output_dim, num_heads, dropout=dropout, batch_first=True)
        self.norm = nn.LayerNorm(output_dim)
        self.time_enc = nn.Linear(2 * 4, output_dim)
        self.register_buffer("freqs", torch.tensor([1.0, 0.5, 0.25, 0.125]), persistent=False)
        self.register_buffer("slopes", torch.tensor([2.0 ** (-8.0 * (j + 1) / num_heads) for j in range(num_heads)]),
                             persistent=False)

    def forward(self, x, t=None, mask=None, return_intermediates=False):
        _check_forward(self, x, t, mask)
        B, T, _ = x.shape
        if t is None:
            t = torch.arange(T, device=x.device, dtype=torch.float64).expand(B, T) * self.frame_dt
        t64 = t.to(device=x.device, dtype=torch.float64)
        if mask is not None:  # the window starts at each row's first real frame
            first = torch.where(mask.to(x.device), t64, torch.full_like(t64, float("inf"))).min(1, keepdim=True).values
            first = torch.where(torch.isinf(first), t64[:, :1], first)
        else:
            first = t64[:, :1]
        frames = ((t64 - first) / self.frame_dt).to(torch.float32)  # (B, T) frames since the window's start
        angles = frames[..., None] * self.freqs  # (B, T, 4)
        h = self.proj(x) + self.time_enc(torch.cat([angles.sin(), angles.cos()], -1))  # (B, T, d)
        age = frames[:, :, None] - frames[:, None, :]  # (B, Tq, Tk) in frames
        bias = -self.slopes.view(1, -1, 1, 1) * age.clamp(min=0)[:, None]  # (B, H, Tq, Tk)
        allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()[None]  # (1, Tq, Tk)
        if mask is not None:
            allowed = allowed & mask.to(x.device)[:, None, :]
        allowed = allowed | torch.eye(T, dtype=torch.bool, device=x.device)[None]
        bias = bias.masked_fill(~allowed[:, None], float("-inf")).reshape(B * self.num_heads, T, T)
        a = self.attn(h, h, h, attn_mask=bias.to(h.dtype), need_weights=False)[0]  # (B, T, d)
        y = self.norm(h + a)
        return (y, None) if return_intermediates else y


class NoMemoryCore(TemporalCore):
    """No memory: position i sees the concatenated features of frames i-window+1 .. i (zeros for
    frames before the window or masked), through one dense layer with ReLU (frame stacking)."""

    name = "none"

    def __init__(self, input_dim, output_dim, window, frame_dt):
        super().__init__(input_dim, output_dim, window, frame_dt)
        self.dense = nn.Linear(window * input_dim, output_dim)

    def forward(self, x, t=None, mask=None, return_intermediates=False):
        _check_forward(self, x, t, mask)
        B, T, D = x.shape
        if mask is not None:
            x = x * mask.to(x.device)[..., None].to(x.dtype)
        padded = F.pad(x, (0, 0, self.window - 1, 0))  # (B, window - 1 + T, D)
        stacked = padded.unfold(1, self.window, 1)  # (B, T, D, window): frames i-window+1 .. i
        y = torch.relu(self.dense(stacked.transpose(2, 3).reshape(B, T, self.window * D)))  # (B, T, d)
        return (y, None) if return_intermediates else y


class TorchNACCore(TemporalCore):
    """The authors' NAC port (PyPI ``torch-nac`` 0.0.2) as a core, for comparison only.

    Its selector is the square-root partition over all keys, not causal: position i of
    ``forward`` may see later frames, so ``causal`` is False (the trainer scores only the last
    position of a window). It takes no timestamps and no mask: masked frames are zeroed.

    Raises:
        ImportError: torch-nac is not installed (``pip install -e ".[peers]"``).
    """

    name = "torch-nac"
    causal = False

    def __init__(self, input_dim, output_dim, window, frame_dt, num_heads: int = 16, topk: int = 8,
                 mode: str = "exact"):
        super().__init__(input_dim, output_dim, window, frame_dt)
        try:
            from torch_nac import NAC as PeerNAC
        except ImportError as exc:
            raise ImportError("--core torch-nac needs the authors' package: pip install -e \".[peers]\" "
                              "(torch-nac 0.0.2)") from exc
        self.peer = PeerNAC(d_model=output_dim, num_heads=num_heads, topk=topk, mode=mode, input_dim=input_dim,
                            return_sequences=True)

    def forward(self, x, t=None, mask=None, return_intermediates=False):
        _check_forward(self, x, t, mask)
        if mask is not None:
            x = x * mask.to(x.device)[..., None].to(x.dtype)
        y = self.peer(x)
        return (y, None) if return_intermediates else y


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


def _nac(mode):
    return lambda *a, **k: NACCore(*a, mode=mode, **k)


#: Core constructors by ``--core`` name: ``CORES[name](input_dim, output_dim, window, frame_dt, **kwargs)``.
CORES = {
    "nac-steady": _nac("steady"),
    "nac-exact": _nac("exact"),
    "nac-euler": _nac("euler"),
    "lstm": LSTMCore,
    "gru": GRUCore,
    "cfc": CfCCore,
    "ltc": LTCCore,
    "mha": MHACore,
    "none": NoMemoryCore,
    "torch-nac": TorchNACCore,
}


def make_core(name: str, input_dim: int, output_dim: int, window: int, frame_dt: float, **kwargs) -> TemporalCore:
    """Build a core by name.

    Args:
        name: one of :data:`CORES`.
        input_dim: D. output_dim: d. window: frames per window (>= 1). frame_dt: seconds between
            frames when no timestamps are given (CarRacing 0.02).
        kwargs: the core's own options (e.g. ``num_heads``, ``topk``, ``sparsity`` for NAC).

    Raises:
        ValueError: an unknown name (the message lists the known ones) or bad sizes.
        ImportError: ``torch-nac`` without its package.
    """
    if name not in CORES:
        raise ValueError(f"unknown core {name!r}; choose one of {', '.join(CORES)}")
    return CORES[name](input_dim, output_dim, window, frame_dt, **kwargs)


def count_parameters(module: nn.Module) -> int:
    """Trainable parameters of ``module`` (every weight tensor entry, masked or not)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def count_effective_parameters(module: nn.Module) -> int:
    """Trainable parameters that can affect the output: as :func:`count_parameters`, except that a
    :class:`agent.nn.nac.SparseLinear`'s weight counts only the connections its wiring mask keeps
    (the masked entries of its dense weight tensor never reach the output). The figure used to
    match the cores' sizes in ``agent compare``."""
    sparse = [m for m in module.modules() if isinstance(m, SparseLinear)]
    masked = {id(m.weight): int(m.mask.sum()) for m in sparse}
    return sum(masked.get(id(p), p.numel()) for p in module.parameters() if p.requires_grad)


__all__ = ["CORES", "CfCCore", "GRUCore", "LSTMCore", "LTCCore", "MHACore", "NACCore", "NoMemoryCore",
           "TemporalCore", "TorchNACCore", "WindowState", "count_effective_parameters", "count_parameters", "make_core"]
